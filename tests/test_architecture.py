"""The shape of the house: explicit registries, checked hooks, public identities, old pickles."""

from __future__ import annotations

import ast
import base64
import importlib
import io
import json
import pickle
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
import optiplug.autotune
import optiplug.base
import optiplug.builtin_schedules
import optiplug.checkpoint
import optiplug.cli
from optiplug.errors import PluginError, UnknownOptimizerError, UnknownScheduleError

# Pickled by optiplug 0.1.0 (the flat layout): optiplug.factory("sgd", lr=0.5,
# momentum=0.9); a sequence of linear_warmup(3) then cosine(10) with boundary 3;
# AutoOptimizer.for_task("text-classification"). They name the old private
# modules optiplug._create, optiplug._schedules, optiplug._auto, optiplug._specs.
OLD_FACTORY = (
    "gASVggAAAAAAAACMEG9wdGlwbHVnLl9jcmVhdGWUjBBPcHRpbWl6ZXJGYWN0b3J5lJOUKYGUfZQojARuYW1llIwDc2dk"
    "lIwHaHBhcmFtc5R9lCiMAmxylEc/4AAAAAAAAIwIbW9tZW50dW2URz/szMzMzMzNdYwEaW1wbJROjAhwcm92aWRlcpRO"
    "dWIu"
)
OLD_SCHEDULE = (
    "gASV5QAAAAAAAACME29wdGlwbHVnLl9zY2hlZHVsZXOUjBBTZXF1ZW5jZVNjaGVkdWxllJOUKYGUfZQojAlzY2hlZHVs"
    "ZXOUaACMFExpbmVhcldhcm11cFNjaGVkdWxllJOUKYGUfZQojAx3YXJtdXBfc3RlcHOUSwOMDHN0YXJ0X2ZhY3RvcpRH"
    "AAAAAAAAAAB1YmgAjA5Db3NpbmVTY2hlZHVsZZSTlCmBlH2UKIwLdG90YWxfc3RlcHOUSwpoCksAjAltaW5fcmF0aW+U"
    "RwAAAAAAAAAAdWKGlIwKYm91bmRhcmllc5RLA4WUdWIu"
)
OLD_SELECTION = (
    "gASV4QIAAAAAAACMDm9wdGlwbHVnLl9hdXRvlIwJU2VsZWN0aW9ulJOUKYGUfZQojARuYW1llIwEYWRhbZSMB2hwYXJh"
    "bXOUfZSMAmxylEc+9Pi1iONo8XOMBGltcGyUTowIcHJvdmlkZXKUTowIc2NoZWR1bGWUTowGcmVhc29ulIw4dGFzayAn"
    "dGV4dC1jbGFzc2lmaWNhdGlvbicgcnVsZSAob3V0cmFua3MgdGhlIHNpemUgcnVsZSmUjApjYW5kaWRhdGVzlGgAjA9D"
    "YW5kaWRhdGVSZXBvcnSUk5QpgZR9lCiMCWNhbmRpZGF0ZZSMD29wdGlwbHVnLl9zcGVjc5SMCUNhbmRpZGF0ZZSTlCmB"
    "lH2UKIwJYWxnb3JpdGhtlGgGaAd9lGgJRz70+LWI42jxc4wFc2NvcmWUR0A0AAAAAAAAaA1oDmgMTowEcnVsZZSMGHRh"
    "c2s6dGV4dC1jbGFzc2lmaWNhdGlvbpRoC2gVjAxQcm92aWRlckluZm+Uk5QpgZR9lCiMBnBsdWdpbpSMBXJ1bGVzlIwM"
    "ZGlzdHJpYnV0aW9ulIwIb3B0aXBsdWeUjAd2ZXJzaW9ulIwFMC4xLjCUdWJ1YowGc3RhdHVzlIwGY2hvc2VulIwEbm90"
    "ZZSMAJR1YmgRKYGUfZQoaBRoFymBlH2UKGgaaAZoB32UaAlHPwo24uscQy1zaBxHQCQAAAAAAABoDYwUTj11bmtub3du"
    "OiBOIHVua25vd26UaAxOaB2MBHNpemWUaAtoIXViaCmMCW91dHNjb3JlZJRoK2gsdWKGlIwHcmVxdWVzdJRoFYwQU2Vs"
    "ZWN0aW9uUmVxdWVzdJSTlCmBlH2UKIwEdGFza5SME3RleHQtY2xhc3NpZmljYXRpb26UjA5udW1fcGFyYW1ldGVyc5RO"
    "jBBwYXJhbWV0ZXJzX2V4YWN0lImMBmNvbmZpZ5ROjAptb2RlbF90eXBllE6MBXN0YWdllE51YnViLg=="
)

_PLUGIN_ROOTS = tuple(Path(__file__).resolve().parent.parent.glob("plugins/*/src/optiplug_*"))

PUBLIC_MODULES = (
    optiplug,
    optiplug.autotune,
    optiplug.base,
    optiplug.builtin_schedules,
    optiplug.checkpoint,
    optiplug.cli,
    optiplug.errors,
    optiplug.validators,
)


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(3))]


def _own_plugin() -> types.ModuleType:
    """A plugin only one registry knows: an optimizer, a schedule and a rule."""
    module = types.ModuleType("only_here")

    @optiplug.hookimpl
    def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
        return [optiplug.OptimizerSpec("only_here_sgd", torch.optim.SGD, defaults={"lr": 0.25})]

    @optiplug.hookimpl
    def optiplug_schedules() -> list[optiplug.ScheduleSpec]:
        shape = optiplug.builtin_schedules.ConstantSchedule
        return [optiplug.ScheduleSpec("only_here_flat", shape)]

    @optiplug.hookimpl
    def optiplug_select_optimizer(request: optiplug.SelectionRequest) -> list[Any]:
        return [optiplug.Candidate("only_here_sgd", {"lr": 0.5}, score=1e6, rule="only_here")]

    module.optiplug_optimizers = optiplug_optimizers
    module.optiplug_schedules = optiplug_schedules
    module.optiplug_select_optimizer = optiplug_select_optimizer
    return module


@pytest.fixture()
def own_registry() -> optiplug.Registry:
    registry = optiplug.Registry(autoload=False, strict=True)
    registry.register(_own_plugin(), "only_here")
    return registry


# ------------------------------------------------------------------ explicit registries
def test_default_registry_does_not_know_the_private_plugin(own_registry: optiplug.Registry) -> None:
    assert "only_here_sgd" in own_registry.optimizers()
    with pytest.raises(UnknownOptimizerError):
        optiplug.spec("only_here_sgd")


def test_registry_factory_creates_from_its_own_registry(own_registry: optiplug.Registry) -> None:
    recipe = own_registry.factory("only_here_sgd", momentum=0.5)
    assert recipe.registry is own_registry
    optimizer = recipe(_params())
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == 0.25
    assert optimizer.param_groups[0]["momentum"] == 0.5


def test_selection_creates_from_the_registry_it_was_selected_in(
    own_registry: optiplug.Registry,
) -> None:
    selection = optiplug.AutoOptimizer.for_task("text-generation", registry=own_registry)
    assert selection.optimizer == "only_here_sgd"
    assert selection.registry is own_registry
    optimizer = selection(_params())
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_with_schedule_builds_names_in_the_selections_registry(
    own_registry: optiplug.Registry,
) -> None:
    selection = own_registry.select(optiplug.SelectionRequest(task="anything"))
    paired = optiplug.AutoOptimizer.with_schedule(selection, "only_here_flat")
    assert paired.schedule(7) == 1.0
    with pytest.raises(UnknownScheduleError):
        optiplug.schedule("only_here_flat")


def test_nested_schedules_are_built_in_the_same_registry(own_registry: optiplug.Registry) -> None:
    sequence = own_registry.schedule(
        "sequence",
        schedules=[{"name": "linear_warmup", "warmup_steps": 4}, {"name": "only_here_flat"}],
        boundaries=[4],
    )
    assert [sequence(step) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_validation_uses_the_registry_that_created_the_optimizer(
    own_registry: optiplug.Registry,
) -> None:
    optimizer = own_registry.create("only_here_sgd", _params())
    assert optiplug.validate_state_dict(optimizer, optimizer.state_dict()) == []


def test_verify_takes_a_registry(own_registry: optiplug.Registry, tmp_path: Any) -> None:
    optimizer = own_registry.create("only_here_sgd", _params(), momentum=0.9)
    optimizer.param_groups[0]["params"][0].grad = torch.ones(3)
    optimizer.step()
    optiplug.checkpoint.save(tmp_path / "ckpt", optimizer)
    info = optiplug.checkpoint.verify(tmp_path / "ckpt", registry=own_registry)
    assert info.algorithm == "only_here_sgd"
    assert info.problems == ()


def test_an_unpickled_factory_resolves_in_the_default_registry(
    own_registry: optiplug.Registry,
) -> None:
    recipe = own_registry.factory("only_here_sgd")
    copy = pickle.loads(pickle.dumps(recipe))
    assert copy == recipe
    assert copy.registry is None
    with pytest.raises(UnknownOptimizerError):
        copy(_params())
    public = pickle.loads(pickle.dumps(optiplug.factory("sgd", lr=0.5)))
    assert isinstance(public(_params()), torch.optim.Optimizer)


# ------------------------------------------------------------------ hooks checked on load
def _misspelled(decorated: bool) -> types.ModuleType:
    module = types.ModuleType("typo_plugin")

    def optiplug_optimizer() -> list[optiplug.OptimizerSpec]:
        return [optiplug.OptimizerSpec("typo_sgd", torch.optim.SGD)]

    module.optiplug_optimizer = (
        optiplug.hookimpl(optiplug_optimizer) if decorated else (optiplug_optimizer)
    )
    return module


@pytest.mark.parametrize("decorated", [True, False], ids=["hookimpl", "plain"])
def test_a_misspelled_hook_fails_the_plugin_with_a_suggestion(decorated: bool) -> None:
    registry = optiplug.Registry(autoload=False, strict=False)
    with pytest.warns(optiplug.PluginWarning, match="optiplug_optimizer"):
        info = registry.register(_misspelled(decorated), "typo")
    assert info.status == "failed"
    assert "'optiplug_optimizer'" in info.error
    assert "did you mean 'optiplug_optimizers'" in info.error
    assert registry.optimizers() == []
    registry.register(_own_plugin(), "only_here")
    assert "only_here_sgd" in registry.optimizers()


def test_a_misspelled_hook_raises_in_strict_mode() -> None:
    registry = optiplug.Registry(autoload=False, strict=True)
    with pytest.raises(PluginError, match="optiplug_optimizer"), warnings.catch_warnings():
        warnings.simplefilter("ignore", optiplug.PluginWarning)
        registry.register(_misspelled(True), "typo")


# ------------------------------------------------------------------ public identities
def _public_objects() -> list[tuple[str, Any]]:
    found = []
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) or (callable(obj) and hasattr(obj, "__qualname__")):
                found.append((f"{module.__name__}.{name}", obj))
    return found


@pytest.mark.parametrize(
    ("path", "obj"), [pytest.param(*found, id=found[0]) for found in _public_objects()]
)
def test_every_public_name_reports_its_public_module(path: str, obj: Any) -> None:
    module = path.rpartition(".")[0]
    assert obj.__module__ == module, f"{path} reports {obj.__module__}"
    assert getattr(__import__(module, fromlist=["_"]), obj.__qualname__) is obj


def test_graph_reports_the_public_module() -> None:
    assert optiplug.Graph.__module__ == "optiplug"


def test_new_pickles_name_only_public_modules() -> None:
    objects = [
        optiplug.factory("sgd", lr=0.5),
        optiplug.schedule("cosine", total_steps=10, warmup_steps=2),
        optiplug.AutoOptimizer.for_task("text-classification"),
    ]
    for obj in objects:
        data = pickle.dumps(obj)
        assert b"optiplug._" not in data, data
        assert pickle.loads(data) == obj


# ------------------------------------------------------------------ 0.1.0 pickles
def _old(text: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pickle.loads(base64.b64decode(text))


def test_a_factory_pickled_by_0_1_0_still_loads_and_creates() -> None:
    recipe = _old(OLD_FACTORY)
    assert recipe == optiplug.factory("sgd", lr=0.5, momentum=0.9)
    optimizer = recipe(_params())
    assert optimizer.param_groups[0]["momentum"] == 0.9


def test_a_schedule_pickled_by_0_1_0_still_loads() -> None:
    schedule = _old(OLD_SCHEDULE)
    fresh = optiplug.schedule(
        "sequence",
        schedules=[
            {"name": "linear_warmup", "warmup_steps": 3},
            {"name": "cosine", "total_steps": 10},
        ],
        boundaries=[3],
    )
    assert schedule == fresh
    assert type(schedule) is optiplug.builtin_schedules.SequenceSchedule


def test_a_selection_pickled_by_0_1_0_still_loads() -> None:
    selection = _old(OLD_SELECTION)
    assert isinstance(selection, optiplug.Selection)
    assert selection.optimizer == "adam"
    assert isinstance(selection.candidates[0].candidate, optiplug.Candidate)
    assert isinstance(selection(_params()), torch.optim.Optimizer)


def test_an_old_module_path_warns_and_names_the_new_one() -> None:
    sys.modules.pop("optiplug._create", None)
    with pytest.warns(DeprecationWarning, match=r"optiplug\._core\.create"):
        old = importlib.import_module("optiplug._create")
    assert old.OptimizerFactory is optiplug.OptimizerFactory


# ------------------------------------------------------------------ torch.load(weights_only=True)
_PATHS_OF_0_1_0 = {
    optiplug.OptimizerFactory: "optiplug._create",
    optiplug.Selection: "optiplug._auto",
    optiplug.CandidateReport: "optiplug._auto",
    optiplug.Candidate: "optiplug._specs",
    optiplug.ProviderInfo: "optiplug._specs",
    optiplug.SelectionRequest: "optiplug._specs",
    **{cls: "optiplug._schedules" for cls in optiplug.builtin_schedules.BUILTIN_SCHEDULES},
}


def _saved_by_0_1_0(obj: Any) -> io.BytesIO:
    """``torch.save(obj)`` as optiplug 0.1.0 wrote it: its classes under their old paths."""
    public = {cls: cls.__module__ for cls in _PATHS_OF_0_1_0}
    saved = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            for cls, old in _PATHS_OF_0_1_0.items():
                importlib.import_module(old)
                cls.__module__ = old
            torch.save(obj, saved)
    finally:
        for cls, module in public.items():
            cls.__module__ = module
    assert b"optiplug._" in saved.getvalue()
    saved.seek(0)
    return saved


def test_records_load_with_weights_only_and_work() -> None:
    schedule = optiplug.schedule(
        "sequence",
        schedules=[
            {"name": "linear_warmup", "warmup_steps": 2},
            {"name": "cosine", "total_steps": 8},
        ],
        boundaries=[2],
    )
    selection = optiplug.AutoOptimizer.with_schedule(
        optiplug.AutoOptimizer.for_model(torch.nn.Linear(4, 4), "text-classification"), schedule
    )
    checkpoint = {"factory": optiplug.factory("sgd", lr=0.5), "selection": selection}
    saved = io.BytesIO()
    torch.save(checkpoint, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)
    assert loaded == checkpoint
    assert loaded["factory"](_params()).param_groups[0]["lr"] == 0.5
    assert isinstance(loaded["selection"](_params()), torch.optim.Optimizer)
    assert loaded["selection"].schedule(3) == schedule(3)
    assert isinstance(loaded["selection"].candidates[0].candidate.provider, optiplug.ProviderInfo)
    assert "chosen" in loaded["selection"].explain()


@pytest.mark.parametrize("text", [OLD_FACTORY, OLD_SCHEDULE, OLD_SELECTION])
def test_checkpoints_of_0_1_0_load_with_weights_only(text: str) -> None:
    obj = _old(text)
    assert torch.load(_saved_by_0_1_0(obj), weights_only=True) == obj


@pytest.mark.slow
@pytest.mark.parametrize(
    "imports",
    ["import optiplug; import torch", "import torch; import optiplug", "import optiplug, torch"],
)
def test_a_fresh_process_loads_with_weights_only_in_either_import_order(
    imports: str, tmp_path: Path
) -> None:
    path = tmp_path / "checkpoint.pt"
    torch.save(
        {"factory": optiplug.factory("sgd", lr=0.5), "schedule": optiplug.schedule("constant")},
        path,
    )
    script = (
        f"{imports}\n"
        "import sys\n"
        f"loaded = torch.load({str(path)!r}, weights_only=True)\n"
        "optimizer = loaded['factory']([torch.nn.Parameter(torch.zeros(2))])\n"
        "print(optimizer.param_groups[0]['lr'], loaded['schedule'](5))\n"
        "print(type(torch.__spec__.loader).__name__, torch.__loader__ is torch.__spec__.loader)\n"
        "print(any('Torch' in type(finder).__name__ for finder in sys.meta_path))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.5", "1.0", "SourceFileLoader", "True", "False"]


# ------------------------------------------------------------------ imports at the top
SOURCES = sorted(
    path for root in (Path(optiplug.__file__).parent, *_PLUGIN_ROOTS) for path in root.rglob("*.py")
)


def _imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """Every import statement in a function body, with its source line."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    found.append((inner.lineno, lines[inner.end_lineno - 1]))
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_imports_inside_functions_only_defer_torch_or_optional_packages(path: Path) -> None:
    unmarked = [
        f"{path.name}:{line}: {text.strip()}"
        for line, text in _imports_inside_functions(path)
        if not re.search(r"# deferred: (imports torch|optional dependency)$", text)
    ]
    assert unmarked == []


# ------------------------------------------------------------------ no layer reaches up
# The core and the layers below it (docs/architecture.md); every other module
# of optiplug sits above the core.
_CORE_AND_BELOW = ("_core", "_text", "_compat", "validators", "_lazy", "errors")

_MODULES_A_REGISTRY_IMPORTS = """
import json, sys
import optiplug
before = set(sys.modules)
bare = optiplug.Registry(autoload=False, strict=True)
bare.optimizers(), bare.schedules(), bare.plugins(), bare.command_specs()
optiplug.Registry(autoload=True)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_registry_imports_no_module_above_the_core() -> None:
    """Creating and querying registries imports nothing above the core.

    The built-ins of the layers above (schedules, rules, commands, train) are
    added by the layers that own them, never imported by name from the core.
    """
    done = subprocess.run(
        [sys.executable, "-c", _MODULES_A_REGISTRY_IMPORTS],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = json.loads(done.stdout)
    above = [
        name
        for name in imported
        if name.startswith("optiplug.") and name.split(".")[1] not in _CORE_AND_BELOW
    ]
    assert above == []


def test_a_bare_registry_has_the_builtin_schedules_and_rules_only() -> None:
    plugins = {info.name: info for info in optiplug.Registry(autoload=False).plugins()}
    assert set(plugins) == {"schedules", "rules"}
    assert {info.distribution for info in plugins.values()} == {"optiplug"}


def test_the_command_line_adds_the_builtin_commands_to_its_registry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = optiplug.Registry(autoload=False)
    assert optiplug.cli.main(["list", "--json"], registry=registry) == 0
    capsys.readouterr()
    names = {info.name for info in registry.plugins()}
    assert {"schedules", "rules", "commands"} <= names  # the applications are other distributions
    assert registry.load_distribution("no-such-distribution") == []

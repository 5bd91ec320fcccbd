"""Regression tests for the plugin fault campaign: defects 9, 10, 11, 14 and 17b.

Each test names what it proves. Plugins are real module objects carrying
``@optiplug.hookimpl`` functions, registered in ``Registry(autoload=False)``;
import-time faults go through real entry-point discovery, from a module and
an unpacked ``*.dist-info`` directory on a temporary ``sys.path`` entry.
"""

from __future__ import annotations

import importlib
import json
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
from optiplug._choice.chooser import chooser_of
from optiplug.cli import main as cli_main
from optiplug.cli.listing import show_optimizer
from optiplug.errors import (
    ImplementationError,
    OptimizerUnavailableError,
    PluginError,
)

# ------------------------------------------------------------------ helpers


def plugin(name: str, **hooks: Callable[..., Any]) -> types.ModuleType:
    """A real plugin module named ``name`` whose hooks are ``hooks`` (marked as hookimpls)."""
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, optiplug.hookimpl(function))
    return module


def optimizers_plugin(*names: str) -> types.ModuleType:
    """A plugin providing torch's Adam/AdamW/SGD under ``names``."""
    classes = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    specs = [optiplug.OptimizerSpec(n, classes.get(n, torch.optim.SGD)) for n in names]
    return plugin("optimizers", optiplug_optimizers=lambda: specs)


def install_entry_point(root: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    """Make ``body`` an installed plugin: entry point ``name`` in group ``optiplug.plugins``.

    Writes ``root/<module>.py`` and a ``*.dist-info`` directory naming it, and
    puts ``root`` on ``sys.path``, which is all ``importlib.metadata`` needs.
    """
    module = f"optiplug_fault_{name}"
    (root / f"{module}.py").write_text(body)
    info = root / f"optiplug_fault_{name}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: optiplug-fault-{name}\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(f"[optiplug.plugins]\n{name} = {module}\n")
    monkeypatch.syspath_prepend(str(root))


def info_of(registry: optiplug.Registry, name: str) -> optiplug.PluginInfo:
    """The :class:`PluginInfo` of plugin ``name``."""
    return next(info for info in registry.plugins() if info.name == name)


def params() -> list[torch.nn.Parameter]:
    """One small parameter."""
    return [torch.nn.Parameter(torch.ones(3))]


@pytest.fixture(autouse=True)
def _fresh_autotune() -> Iterator[None]:
    """Each test starts and ends with no measured choice and no recorded failure."""
    chooser_of().clear()
    yield
    chooser_of().clear()


# ------------------------------------------------------------------ defect 9

EXITING_PLUGINS = {
    "exit_on_import": ("import sys\nsys.exit(3)\n", "SystemExit(3) raised while loading"),
    "exit_in_hook": (
        "import sys\nimport optiplug\n\n"
        "@optiplug.hookimpl\n"
        "def optiplug_optimizers():\n"
        "    sys.exit(4)\n",
        "SystemExit(4) raised while loading",
    ),
    "generator_exit": ("raise GeneratorExit()\n", "GeneratorExit() raised while loading"),
}


@pytest.mark.parametrize("name", sorted(EXITING_PLUGINS))
def test_plugin_exiting_while_loading_is_failed_and_list_shows_the_others(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body, reason = EXITING_PLUGINS[name]
    install_entry_point(tmp_path, monkeypatch, name, body)
    registry = optiplug.Registry(strict=False, disabled=())
    with pytest.warns(optiplug.PluginWarning, match=name):
        info = info_of(registry, name)
    assert (info.status, info.error) == ("failed", reason)
    assert "adamw" in registry.optimizers()
    assert cli_main(["list"], registry=registry) == 0
    out = capsys.readouterr().out
    assert "adamw" in out and f"failed: plugin {name}" in out and reason in out


def test_keyboard_interrupt_while_loading_propagates_naming_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_entry_point(tmp_path, monkeypatch, "interrupting", "raise KeyboardInterrupt\n")
    registry = optiplug.Registry(strict=False, disabled=())
    with pytest.raises(KeyboardInterrupt, match="'interrupting'") as caught:
        registry.optimizers()
    assert isinstance(caught.value.__cause__, KeyboardInterrupt)
    info = info_of(registry, "interrupting")  # discovery resumes with the others
    assert info.status == "failed" and "KeyboardInterrupt" in (info.error or "")
    assert "adamw" in registry.optimizers()


def raising_rule(error: BaseException) -> types.ModuleType:
    """A plugin whose selection rule raises ``error``."""

    def rule(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
        raise error

    return plugin("exiting_rule", optiplug_select_optimizer=rule)


def test_hook_exiting_fails_its_plugin_and_hook_interrupt_names_it() -> None:
    registry = optiplug.Registry(autoload=False, strict=False)
    registry.register(optimizers_plugin("adam", "adamw"), "optimizers")
    registry.register(raising_rule(SystemExit(5)), "exiting_rule")
    request = optiplug.SelectionRequest(task="text-classification")
    with pytest.warns(optiplug.PluginWarning, match="SystemExit"):
        assert registry.select(request).name == "adam"
    info = info_of(registry, "exiting_rule")
    assert info.status == "failed" and "SystemExit(5) raised while selecting" in (info.error or "")
    interrupted = optiplug.Registry(autoload=False, strict=False)
    interrupted.register(raising_rule(KeyboardInterrupt()), "exiting_rule")
    with pytest.raises(KeyboardInterrupt, match="'exiting_rule'"):
        interrupted.select(request)


# ------------------------------------------------------------------ defect 10


def turbo_plugin() -> types.ModuleType:
    """A third-party implementation of ``adamw`` at top priority whose factory raises."""

    def explode(params: Any, **hparams: Any) -> torch.optim.Optimizer:
        raise RuntimeError("turbo kernel exploded")

    turbo = optiplug.ImplementationSpec("adamw", "turbo", explode, priority=100)
    return plugin("turbo", optiplug_implementations=lambda: [turbo])


def adamw_with_turbo() -> optiplug.Registry:
    """A registry holding the first-party adamw plugin and :func:`turbo_plugin`."""
    registry = optiplug.Registry(autoload=False, strict=False)
    adamw = importlib.import_module("optiplug_adamw.plugin")
    registry.register(adamw, "adamw", distribution="optiplug-adamw", version="0.1")
    registry.register(turbo_plugin(), "turbo", distribution="optiplug-turbo", version="9.9")
    return registry


@pytest.mark.parametrize("autotune", [None, "0"], ids=["measured", "priority"])
def test_failing_implementation_is_skipped_with_one_warning_and_shown_failed(
    autotune: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if autotune is None:
        monkeypatch.delenv("OPTIPLUG_AUTOTUNE", raising=False)
    else:
        monkeypatch.setenv("OPTIPLUG_AUTOTUNE", autotune)
    registry = adamw_with_turbo()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = [registry.create("adamw", params()) for _ in range(2)]
    assert all(isinstance(o, torch.optim.AdamW) and o.impl != "turbo" for o in built)  # type: ignore[attr-defined]
    [warning] = [w for w in caught if issubclass(w.category, optiplug.PluginWarning)]
    for part in ("'turbo'", "'adamw'", "optiplug-turbo 9.9", "RuntimeError: turbo kernel exploded"):
        assert part in str(warning.message)
    assert "turbo kernel exploded" in registry.implementation_failures("adamw")["turbo"]
    assert "turbo (failed: " in show_optimizer(registry, registry.spec("adamw"))


def test_forced_failing_implementation_raises_typed_and_chained() -> None:
    registry = adamw_with_turbo()
    with pytest.raises(ImplementationError, match="'turbo'") as caught:
        registry.create("adamw", params(), impl="turbo")
    assert isinstance(caught.value, OptimizerUnavailableError)
    cause = caught.value.__cause__
    assert isinstance(cause, RuntimeError) and str(cause) == "turbo kernel exploded"


# ------------------------------------------------------------------ defect 11


def rule_returning(returned: Any) -> types.ModuleType:
    """A plugin whose selection rule returns ``returned``."""
    return plugin("badrule", optiplug_select_optimizer=lambda request: returned)


BAD_RULE_RETURNS = {
    "str": "adamw",
    "dict": {"algorithm": "adamw", "score": 99},
    "list-of-str": ["adamw"],
    "int": 42,
    "list-holding-none": [None],
}


@pytest.mark.parametrize("kind", sorted(BAD_RULE_RETURNS))
def test_selection_rule_returning_no_candidates_iterable_fails_its_plugin_only(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = optiplug.Registry(autoload=False, strict=False)
    registry.register(optimizers_plugin("adam", "adamw"), "optimizers")
    registry.register(rule_returning(BAD_RULE_RETURNS[kind]), "badrule")
    argv = ["auto", "--task", "text-classification", "--json"]
    with pytest.warns(optiplug.PluginWarning, match="'badrule'"):
        assert cli_main(argv, registry=registry) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["optimizer"] == "adam"
    assert {c["plugin"] for c in chosen["candidates"]} == {"rules"}
    info = info_of(registry, "badrule")
    assert info.status == "failed" and "expected an iterable of Candidate" in (info.error or "")


def test_selection_rule_returning_none_proposes_nothing() -> None:
    registry = optiplug.Registry(autoload=False, strict=True)
    registry.register(optimizers_plugin("adam", "adamw"), "optimizers")
    registry.register(rule_returning(None), "badrule")
    with warnings.catch_warnings():
        warnings.simplefilter("error", optiplug.PluginWarning)
        assert registry.select(optiplug.SelectionRequest(task="text-classification")).name == "adam"
    assert info_of(registry, "badrule").status == "active"


NONE_RULE = """\
import optiplug


@optiplug.hookimpl
def optiplug_select_optimizer(request):
    return [optiplug.Candidate("adamw", {"lr": 1.0}, 99.0, "first of two"), None]
"""


def test_installed_rule_returning_a_list_holding_none_fails_its_plugin_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_entry_point(tmp_path, monkeypatch, "nonerule", NONE_RULE)
    registry = optiplug.Registry(strict=False, disabled=())
    with pytest.warns(optiplug.PluginWarning, match="'nonerule'"):
        chosen = optiplug.AutoOptimizer.for_task("text-classification", registry=registry)
    assert (chosen.name, chosen.hparams["lr"]) == ("adam", 2e-5)  # its 99-point candidate dropped
    info = info_of(registry, "nonerule")
    assert info.status == "failed"
    assert "list holding NoneType None, expected an iterable of Candidate" in (info.error or "")


def test_bad_selection_rule_raises_plugin_error_in_strict_mode() -> None:
    registry = optiplug.Registry(autoload=False, strict=True)
    registry.register(optimizers_plugin("adam", "adamw"), "optimizers")
    registry.register(rule_returning("adamw"), "badrule")
    with pytest.warns(optiplug.PluginWarning), pytest.raises(PluginError, match="badrule"):
        registry.select(optiplug.SelectionRequest(task="text-classification"))


# ------------------------------------------------------------------ defect 14


def broken_by_register() -> optiplug.Registry:
    """A strict registry whose plugin ``broken`` failed in :meth:`Registry.register`."""
    registry = optiplug.Registry(autoload=False, strict=True)
    registry.register(optimizers_plugin("sgd"), "optimizers")

    def fail() -> list[optiplug.OptimizerSpec]:
        raise ValueError("broken on purpose")

    with pytest.warns(optiplug.PluginWarning), pytest.raises(PluginError):
        registry.register(plugin("broken", optiplug_optimizers=fail), "broken")
    return registry


def broken_by_entry_point(root: Path, monkeypatch: pytest.MonkeyPatch) -> optiplug.Registry:
    """A strict registry that discovers an installed plugin ``broken`` raising on import."""
    install_entry_point(root, monkeypatch, "broken", "raise ValueError('broken on purpose')\n")
    return optiplug.Registry(strict=True, disabled=())


@pytest.mark.parametrize("how", ["register", "entry point"])
def test_strict_registry_raises_on_every_lookup_not_just_the_first(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optiplug.PluginWarning)
        registry = (
            broken_by_register()
            if how == "register"
            else broken_by_entry_point(tmp_path, monkeypatch)
        )
        lookups: list[Callable[[], object]] = [
            registry.optimizers,
            registry.optimizers,
            lambda: registry.spec("sgd"),
            lambda: registry.create("sgd", params(), lr=0.1),
            registry.optimizers,
        ]
        for lookup in lookups:
            with pytest.raises(PluginError, match="broken on purpose"):
                lookup()


# ------------------------------------------------------------------ defect 17b

BAD_VALIDATOR_RETURNS = {
    "str": "abc",
    "dict": {"kind": "shape"},
    "non-problem item": [optiplug.Problem(kind="shape"), "oops"],
    "none item": [optiplug.Problem(kind="shape"), None],
    "int": 7,
}


@pytest.mark.parametrize("kind", sorted(BAD_VALIDATOR_RETURNS))
def test_validation_hook_returning_no_problems_iterable_is_one_validator_error(
    kind: str,
) -> None:
    returned = BAD_VALIDATOR_RETURNS[kind]
    registry = optiplug.Registry(autoload=False, strict=False)
    checker = plugin(
        "checker", optiplug_validate_state_dict=lambda spec, optimizer, state_dict: returned
    )
    registry.register(checker, "checker")
    optimizer = torch.optim.SGD(params(), lr=0.1)
    spec = optiplug.OptimizerSpec("sgd", torch.optim.SGD)
    [problem] = registry.extra_state_problems(spec, optimizer, optimizer.state_dict())
    assert (problem.kind, problem.slot) == ("validator-error", "checker")
    assert type(returned).__name__ in problem.found and "Problem" in problem.expected
    assert info_of(registry, "checker").status == "active"


def test_validation_hook_returning_problems_passes_them_through() -> None:
    found = [optiplug.Problem(kind="shape", slot="m"), optiplug.Problem(kind="dtype", slot="m")]
    registry = optiplug.Registry(autoload=False, strict=False)
    checker = plugin(
        "checker", optiplug_validate_state_dict=lambda spec, optimizer, state_dict: iter(found)
    )
    registry.register(checker, "checker")
    optimizer = torch.optim.SGD(params(), lr=0.1)
    spec = optiplug.OptimizerSpec("sgd", torch.optim.SGD)
    assert registry.extra_state_problems(spec, optimizer, optimizer.state_dict()) == found

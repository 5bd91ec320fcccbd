"""``optiplug.create`` validates the hyperparameters and chooses the implementation once.

The registry resolves the name, validates, builds the param groups and
chooses the implementation, then hands the optimizer class the finished
record: the class does not validate or choose again, and neither do the
candidates built while measuring. Counted by wrapping optiplug's own
module-level functions (the validator every validation runs through, and the
implementation choice) with counting wrappers.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import optiplug
import optiplug.base
from optiplug import validators
from optiplug._choice.chooser import chooser_of
from optiplug.errors import HyperparameterError


def _first_party_algorithms() -> list[str]:
    """Installed first-party algorithms that build on plain CPU tensors.

    A composite (``multi``) creates each part through ``create`` again, so
    its counts are those of its parts; it is left out.
    """
    names = []
    for name in optiplug.optimizers():
        spec = optiplug.spec(name)
        provider = spec.provider.distribution if spec.provider is not None else ""
        native = spec.origin is None  # the bridges' classes are other libraries'
        if provider.startswith("optiplug") and native and "composite" not in spec.capabilities:
            names.append(name)
    return names


ALGORITHMS = _first_party_algorithms()


def _counting(counts: Counter[str], key: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return function(*args, **kwargs)

    return counted


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Count ``validate_hyperparameters`` wherever optiplug bound it, and the registry's chooser's ``select``."""
    registry = optiplug.default_registry()
    for name in ALGORITHMS:  # import every class first, so each binding is counted
        records = [registry.spec(name), *registry.implementations(name)]
        for factory in (record.factory for record in records):
            if isinstance(factory, optiplug.LazyCallable):
                factory.resolve()
    found: Counter[str] = Counter()
    wrapped = {
        "validate_hyperparameters": (
            "validations",
            validators.validate_hyperparameters,
        ),
    }
    chooser = chooser_of(registry)
    monkeypatch.setattr(chooser, "select", _counting(found, "selections", chooser.select))
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("optiplug"):
            continue
        for attribute, (key, original) in wrapped.items():
            if getattr(module, attribute, None) is original:
                monkeypatch.setattr(module, attribute, _counting(found, key, original))
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", "1")
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE_CACHE", "0")
    chooser_of(registry).clear()  # first use: the choice is measured inside create
    yield found
    chooser_of(registry).clear()


def _params() -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    return list(torch.nn.Linear(8, 8).named_parameters())


def _choices(name: str) -> int:
    """1 where there is something to choose (implementations registered or offered by the class)."""
    registry = optiplug.default_registry()
    factory = registry.spec(name).factory
    cls = factory.resolve() if isinstance(factory, optiplug.LazyCallable) else factory
    offered = registry.implementations(name) or getattr(cls, "implementation_specs", None)
    return 1 if offered else 0


def test_the_table_holds_the_first_party_algorithms() -> None:
    assert {"adam", "adamw", "sgd", "lion", "muon"} <= set(ALGORITHMS)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_create_validates_and_chooses_once(name: str, counts: Counter[str]) -> None:
    optimizer = optiplug.create(name, _params(), lr=1e-3)
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert counts["validations"] == 1, counts
    assert counts["selections"] == _choices(name), counts


@pytest.mark.parametrize("name", ALGORITHMS)
def test_forced_implementation_validates_and_checks_once(name: str, counts: Counter[str]) -> None:
    cpu = [i for i in optiplug.default_registry().implementations(name) if i.name == "loop"]
    if not cpu:
        pytest.skip(f"{name} has no loop implementation")
    optimizer = optiplug.create(name, _params(), lr=1e-3, impl="loop")
    assert optimizer.impl == "loop"  # type: ignore[attr-defined]
    assert counts["validations"] == 1, counts
    assert counts["selections"] == 1, counts


def test_grouping_validates_once(counts: Counter[str]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    optimizer = optiplug.create("adamw", model, lr=1e-3, no_decay="auto", impl="loop")
    assert len(optimizer.param_groups) == 2
    assert counts["validations"] == 1, counts
    assert counts["selections"] == 1, counts


def test_a_class_built_directly_validates_through_the_same_routine(
    counts: Counter[str],
) -> None:
    import optiplug_adamw

    optimizer = optiplug_adamw.AdamW(_params(), lr=1e-3, impl="foreach")
    assert optimizer.impl == "foreach"
    assert counts["validations"] == 1, counts
    assert counts["selections"] == 1, counts
    with pytest.raises(HyperparameterError, match="lr"):
        optiplug_adamw.AdamW(_params(), lr=-1.0)


def test_creating_an_optimizer_does_not_import_dynamo() -> None:
    """torch's add_param_group imports torch._dynamo (about a second) unless bypassed outside a compile."""
    import subprocess
    import sys

    code = (
        "import sys, torch, optiplug\n"
        "params = [torch.nn.Parameter(torch.zeros(64, 64)) for _ in range(3)]\n"
        "for name in ('adamw', 'lion', 'muon'):\n"
        "    opt = optiplug.create(name, params, impl=None if name == 'muon' else 'loop')\n"
        "    opt.add_param_group({'params': [torch.nn.Parameter(torch.zeros(64, 64))]})\n"
        "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ every path, bridges included
def _graph_path(name: str, **hparams: Any) -> torch.optim.Optimizer:
    graph = optiplug.Graph(torch.nn.Linear(8, 8))
    return graph.set_optimizer(name, **hparams)


def _direct_path(name: str, **hparams: Any) -> torch.optim.Optimizer:
    factory = optiplug.spec(name).factory
    cls = factory.resolve() if isinstance(factory, optiplug.LazyCallable) else factory
    return cls(_params(), **hparams)  # type: ignore[no-any-return]


PATHS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "create": lambda name, **h: optiplug.create(name, _params(), **h),
    "factory called": lambda name, **h: FACTORIES[name](_params()),
    "Graph": _graph_path,
    "class built directly": _direct_path,
}
BRIDGED = {  # one class of each bridge family that builds from plain parameters
    "adan": "pytorch-optimizer",
    "heavy_kl_shampoo": "heavyball",
    "adamw_schedulefree": "schedulefree",
    "torchao:adamw8bit": "torchao",
    "bitsandbytes:adamw8bit": "bitsandbytes",
}
FACTORIES: dict[str, Any] = {}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", ["adamw", "lion", *BRIDGED])
def test_every_path_validates_once_and_chooses_once(
    name: str, path: str, counts: Counter[str]
) -> None:
    """``create``, a factory when called, a Graph, a class built directly and every bridge."""
    if name not in optiplug.optimizers():
        pytest.skip(f"{name} is not installed")
    hparams: dict[str, Any] = {"lr": 1e-3}
    if path == "factory called":
        FACTORIES[name] = optiplug.factory(name, **hparams)  # checked now: not counted below
        counts.clear()
    optimizer = PATHS[path](name, **hparams)
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert counts["validations"] == 1, counts
    assert counts["selections"] == 1, counts  # each of these has implementations to choose from

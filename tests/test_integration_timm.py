"""``optiplug_integrations.timm.register()``: every optiplug name in timm's optimizer registry.

timm needs torchvision, which does not load beside every torch build, and
a ``--no-deps`` install of timm does not import either (``timm.optim``'s
param-group helpers import ``timm.models``, whose layers import
torchvision). So the registration is tested twice:

* against timm 1.0's documented registry interface (``OptimInfo``'s
  fields; ``register``, ``register_alias``, ``register_foreach_default``;
  how ``create_optimizer_v2`` builds ``opt_args``), written out below from
  timm's source, everywhere;
* against real timm where it imports (skipped, with the reason, where not).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import attrs
import pytest
import torch

import optiplug
from optiplug.errors import HyperparameterError
from optiplug.validators import hyperparameters_of
from optiplug_integrations import timm as optiplug_timm


@dataclasses.dataclass(frozen=True)
class OptimInfo:
    """timm 1.0's ``OptimInfo``: its fields, their order and defaults."""

    name: str
    opt_class: Any
    description: str = ""
    has_eps: bool = True
    has_momentum: bool = False
    has_betas: bool = False
    num_betas: int = 2
    second_order: bool = False
    defaults: dict[str, Any] | None = None


class TimmRegistry:
    """timm 1.0's ``OptimizerRegistry`` interface that ``register`` uses, and its lookup."""

    def __init__(self) -> None:
        self.infos: dict[str, OptimInfo] = {}
        self.foreach_defaults: set[str] = set()

    def register(self, info: OptimInfo) -> None:
        self.infos[info.name.lower()] = info

    def register_alias(self, alias: str, target: str) -> None:
        self.infos[alias.lower()] = self.infos[target.lower()]  # KeyError for a missing target

    def register_foreach_default(self, name: str) -> None:
        self.foreach_defaults.add(name.lower())

    def create(self, params: Any, opt: str, lr: float, weight_decay: float = 0.0, **kw: Any) -> Any:
        """What timm 1.0's ``create_optimizer`` does once it has the param groups."""
        info = self.infos[opt.lower().split("_")[-1]]  # timm: the last '_'-separated word
        opt_args: dict[str, Any] = {"weight_decay": weight_decay, **kw, "lr": lr}
        if info.has_momentum:
            opt_args.setdefault("momentum", 0.9)
        if not info.has_eps:
            opt_args.pop("eps", None)
        if not info.has_betas:
            opt_args.pop("betas", None)
        return info.opt_class(params, **opt_args)


@pytest.fixture(scope="module")
def timm_registry() -> TimmRegistry:
    registry = TimmRegistry()
    optiplug_timm.register(timm_registry=registry, optim_info=OptimInfo)
    return registry


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


def _layer_groups(model: torch.nn.Sequential, decay: float) -> list[dict[str, Any]]:
    """Groups shaped as timm's ``param_groups_layer_decay`` gives (``lr_scale``, ``weight_decay``)."""
    layers = list(model)
    groups = []
    for depth, layer in enumerate(layers):
        scale = 0.75 ** (len(layers) - 1 - depth)
        for name, param in layer.named_parameters():
            wd = 0.0 if param.ndim <= 1 or name.endswith("bias") else decay
            groups.append({"params": [param], "weight_decay": wd, "lr_scale": scale})
    return groups


def _steps(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, 6, generator=generator)
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()


def _hyperparameters(registry: Any, name: str) -> dict[str, Any]:
    """The spec's fields and defaults: its attrs config's, else its factory's signature's."""
    spec = registry.spec(name)
    if spec.config is None:
        return {h.name: h.default for h in hyperparameters_of(None, spec.factory)}
    return {f.name: f.default for f in attrs.fields(spec.config)}


def test_every_registry_name_is_registered_with_flags_from_its_spec(
    timm_registry: TimmRegistry,
) -> None:
    registry = optiplug.default_registry()
    for name in registry.optimizers():
        info = timm_registry.infos[f"optiplug:{name}".lower()]
        assert timm_registry.infos[optiplug_timm.timm_name(name)] is info
        known = _hyperparameters(registry, name)
        assert (info.has_eps, info.has_betas, info.has_momentum) == (
            "eps" in known,
            "betas" in known,
            "momentum" in known,
        ), name
        if isinstance(known.get("betas"), tuple):
            assert info.num_betas == len(known["betas"]), name
        foreach = "foreach" in {i.name for i in registry.implementations(name)}
        assert (f"optiplug:{name}".lower() in timm_registry.foreach_defaults) is foreach, name
    assert timm_registry.infos["optiplug:adamw"].has_betas
    assert not timm_registry.infos["optiplug:lion"].has_eps
    assert timm_registry.infos["optiplug:sgd"].has_momentum


def test_a_name_with_underscores_is_reached_by_timms_parsing(timm_registry: TimmRegistry) -> None:
    """timm takes the word after the last ``_`` as the name: the dashed spelling survives it."""
    model = _model()
    optimizer = timm_registry.create(model.parameters(), "optiplug:adamw-schedulefree", lr=1e-3)
    assert type(optimizer).__name__ == "AdamWScheduleFree"
    with pytest.raises(KeyError):
        timm_registry.create(model.parameters(), "optiplug:adamw_schedulefree", lr=1e-3)


def test_timm_layer_decay_groups_step_bit_equal_to_torch(timm_registry: TimmRegistry) -> None:
    """``optiplug:adamw`` with ``foreach=False`` runs torch's for-loop AdamW: bit-equal."""
    ours, theirs = _model(), _model()
    optimizer = timm_registry.create(
        _layer_groups(ours, 0.05), "optiplug:adamw", lr=1e-2, foreach=False, betas=(0.8, 0.9)
    )
    reference = torch.optim.AdamW(
        _layer_groups(theirs, 0.05), lr=1e-2, weight_decay=0.0, foreach=False, betas=(0.8, 0.9)
    )
    assert optimizer.impl == "loop"
    _steps(optimizer, ours)
    _steps(reference, theirs)
    for mine, twin in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(mine, twin)
    assert [g["lr_scale"] for g in optimizer.param_groups] == [0.5625] * 2 + [0.75] * 2 + [1.0] * 2


def test_lion_takes_timms_layer_decay_groups(timm_registry: TimmRegistry) -> None:
    model = _model()
    optimizer = timm_registry.create(_layer_groups(model, 0.1), "optiplug:lion", lr=1e-4, eps=1e-8)
    before = [p.detach().clone() for p in model.parameters()]
    _steps(optimizer, model)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.0, 0.1}


def test_a_decay_group_for_an_algorithm_without_decay_is_refused(
    timm_registry: TimmRegistry,
) -> None:
    model = _model()
    with pytest.raises(HyperparameterError, match="timm's param groups ask for it") as refused:
        timm_registry.create(_layer_groups(model, 0.05), "optiplug:a2grad", lr=1e-3)
    assert (refused.value.field, refused.value.value) == ("weight_decay", 0.05)
    optimizer = timm_registry.create(_layer_groups(model, 0.0), "optiplug:a2grad", lr=1e-3)
    assert type(optimizer).__name__ == "A2Grad"


@pytest.mark.slow
def test_import_imports_no_torch_nor_timm_and_scans_no_entry_points() -> None:
    code = (
        "import importlib.metadata as md, json, sys\n"
        "calls = []\n"
        "real = md.entry_points\n"
        "md.entry_points = lambda *a, **k: calls.append(k) or real(*a, **k)\n"
        "import optiplug_integrations.timm\n"
        "mods = [m for m in ('torch', 'timm') if m in sys.modules]\n"
        "print(json.dumps({'calls': len(calls), 'modules': mods}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"calls": 0, "modules": []}


def _real_timm() -> Any:
    try:
        import timm.optim
    except (ImportError, RuntimeError) as exc:  # RuntimeError: a torchvision for another torch
        pytest.skip(f"timm.optim does not import here ({type(exc).__name__}: {exc})")
    return timm.optim


@pytest.mark.slow
def test_real_timm_create_optimizer_v2_builds_optiplug_optimizers() -> None:
    timm_optim = _real_timm()
    optiplug_timm.register()
    assert "optiplug:lion" in timm_optim.list_optimizers("optiplug:*")
    ours, theirs = _model(), _model()
    settings = {"lr": 1e-2, "weight_decay": 0.05, "layer_decay": 0.75, "foreach": False}
    optimizer = timm_optim.create_optimizer_v2(ours, "optiplug:adamw", **settings)
    reference = timm_optim.create_optimizer_v2(theirs, "adamw", **settings)  # torch's AdamW
    _steps(optimizer, ours)
    _steps(reference, theirs)
    for mine, twin in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(mine, twin)
    lion = timm_optim.create_optimizer_v2(_model(), "optiplug:lion", lr=1e-4, layer_decay=0.75)
    assert [g["lr_scale"] for g in lion.param_groups] == [
        g["lr_scale"] for g in reference.param_groups
    ]

"""What one algorithm needs, its plugin declares and the core reads: no algorithm in the core.

C steps on low-precision state (``state_step``), selection rules,
Hugging Face ``optim=`` names (``OptimizerSpec.hf_names``) and
``optiplug bench``'s element-wise floor (the ``"elementwise"`` capability).
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import optiplug
from optiplug_devtools.bench import bytes_per_parameter


def test_torch_backed_classes_declare_their_c_state_step() -> None:
    import optiplug_adam
    import optiplug_adamw
    import optiplug_sgd
    from optiplug_adam.native import fused_adam_step
    from optiplug_sgd.native import fused_sgd_step

    assert optiplug_adam.Adam.state_step is fused_adam_step
    assert optiplug_adamw.AdamW.state_step is fused_adam_step  # adamw reuses adam's
    assert optiplug_sgd.SGD.state_step is fused_sgd_step
    assert optiplug_adam.Adam.__module__ == "optiplug_adam"  # where pickles find it


def test_a_class_without_a_declared_step_takes_the_decoding_path() -> None:
    class Plain(optiplug.base.TorchBackedOptimizer, torch.optim.SGD):
        algorithm = "plain_sgd"
        config_class = optiplug.spec("sgd").config  # type: ignore[assignment]

    param = torch.nn.Parameter(torch.ones(10_000))
    param.grad = torch.ones(10_000)
    optimizer = Plain([param], lr=0.1, momentum=0.9, impl="fused", state_precision="int8")
    optimizer.step()
    assert optimizer.stored_state_step(optimizer.param_groups[0], param) is False
    optimizer.step()  # the decode-step-encode path
    assert optimizer.state[param]["momentum_buffer"].precision == "int8"


def test_lion_and_muon_propose_through_their_own_plugins() -> None:
    selection = optiplug.AutoOptimizer.for_task("causal-lm", stage="pretraining")
    providers = {r.candidate.rule: r.candidate.provider for r in selection.candidates}
    assert providers["pretraining:lion"].plugin == "lion"  # type: ignore[union-attr]
    assert providers["muon:pretraining"].plugin == "muon"  # type: ignore[union-attr]
    assert providers["pretraining:adamw"].plugin == "rules"  # type: ignore[union-attr]
    assert optiplug.AutoOptimizer.pretraining_lr(350 * 10**6)[0] == 3e-4


def _module(**spec_fields: Any) -> types.ModuleType:
    module = types.ModuleType("declares_plugin")

    @optiplug.hookimpl
    def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
        return [optiplug.OptimizerSpec(name="declared", factory=torch.optim.SGD, **spec_fields)]

    module.optiplug_optimizers = optiplug_optimizers  # type: ignore[attr-defined]
    return module


def test_hf_names_come_from_the_specs() -> None:
    pytest.importorskip("transformers")
    from optiplug_integrations.transformers import hf_optimizers

    registry = optiplug.Registry(autoload=False)
    names = ("adagrad", optiplug.HFName("rmsprop", caveat="not rmsprop"))
    registry.register(_module(hf_names=names), "declares")
    table = hf_optimizers(registry)
    assert [(r.name, r.caveat) for r in table["adagrad"].routes] == [("declared", "")]
    assert [(r.name, r.caveat) for r in table["rmsprop"].routes] == [("declared", "not rmsprop")]
    assert not table["adamw_torch"].routes  # no adamw here; the default registry serves it
    assert table["adamw_torch"].served_by == ("optiplug-adamw",)
    assert "XLA" in table["adamw_torch_xla"].reason


def test_the_bench_floor_follows_the_elementwise_capability() -> None:
    slots = (optiplug.StateSlot("momentum_buffer"),)
    for capabilities, expected in (({"elementwise"}, 20), (set(), None)):
        registry = optiplug.Registry(autoload=False)
        registry.register(_module(capabilities=capabilities, state_slots=slots), "declares")
        assert bytes_per_parameter(registry.spec("declared"), {}, 4) == expected

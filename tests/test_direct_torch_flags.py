"""torch's ``fused=``/``foreach=`` on optimizer classes built directly, as ``optiplug.create`` reads them.

``optiplug_adamw.AdamW(params, fused=True)`` is ``AdamW(params,
impl="fused")``: the one construction step (:func:`optiplug.base.prepare`)
reads torch's kernel keywords for every class, whoever builds it. The torch
classes' twins run torch's own kernels with the same flags, so they must step
bit for bit as torch's class does (the same kernel on the same operands).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import optiplug_adam
import optiplug_adamw
import optiplug_lion
import optiplug_sgd
from optiplug.errors import HyperparameterError
from optiplug_schedulefree.optimizers import AdamWScheduleFree

TWINS: list[tuple[type, type, dict[str, Any]]] = [
    (optiplug_adam.Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}),
    (optiplug_adam.Adam, torch.optim.Adam, {"lr": 1e-2, "amsgrad": True, "maximize": True}),
    (optiplug_adamw.AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.05}),
    (optiplug_adamw.AdamW, torch.optim.AdamW, {"lr": 3e-3, "betas": (0.8, 0.95), "amsgrad": True}),
    (optiplug_sgd.SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (optiplug_sgd.SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.5, "weight_decay": 1e-2}),
]
# each spelling and the kernel torch runs for it on CPU tensors (fused=False alone: its
# CPU default, the for-loop kernel)
SPELLINGS: list[tuple[dict[str, Any], str]] = [
    ({"fused": True}, "fused"),
    ({"fused": True, "foreach": False}, "fused"),
    ({"foreach": True}, "foreach"),
    ({"foreach": True, "fused": None}, "foreach"),
    ({"foreach": False}, "loop"),
    ({"fused": False}, "loop"),
    ({"fused": False, "foreach": False}, "loop"),
    ({"fused": False, "foreach": True}, "foreach"),
]


def _params() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    shapes = ((7, 5), (5,), (3, 2, 4))
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def _run(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    generator = torch.Generator().manual_seed(1)
    getattr(optimizer, "train", lambda: None)()  # schedule-free: train mode to step
    for _ in range(4):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize(
    ("ours", "theirs", "hparams"),
    TWINS,
    ids=[f"{t[0].__name__}-{i}" for i, t in enumerate(TWINS)],
)
@pytest.mark.parametrize(
    ("flags", "kernel"),
    SPELLINGS,
    ids=["-".join(f"{k}={v}" for k, v in s[0].items()) for s in SPELLINGS],
)
def test_a_class_built_directly_with_torch_flags_steps_as_torch_does(
    ours: type, theirs: type, hparams: dict[str, Any], flags: dict[str, Any], kernel: str
) -> None:
    mine, twin = _params(), _params()
    optimizer = ours(mine, **hparams, **flags)
    assert optimizer.impl == kernel
    _run(optimizer, mine)
    _run(theirs(twin, **hparams, **flags), twin)
    for param, reference in zip(mine, twin, strict=True):
        assert torch.equal(param.detach(), reference.detach())  # the same kernel: bit-equal


@pytest.mark.parametrize(
    ("cls", "flags", "kernel"),
    [
        (optiplug_lion.Lion, {"fused": True}, "fused"),
        (optiplug_lion.Lion, {"foreach": True}, "foreach"),
        (optiplug_lion.Lion, {"foreach": False}, "loop"),
        (AdamWScheduleFree, {"foreach": True}, "foreach"),
        (AdamWScheduleFree, {"foreach": False}, "loop"),
    ],
)
def test_the_flags_spell_impl_for_every_class_with_torch_named_kernels(
    cls: type, flags: dict[str, Any], kernel: str
) -> None:
    """A class with no torch twin: the spelling builds what ``impl=`` builds, step for step."""
    spelled, named = _params(), _params()
    optimizer = cls(spelled, lr=1e-3, **flags)
    assert optimizer.impl == kernel
    _run(optimizer, spelled)
    _run(cls(named, lr=1e-3, impl=kernel), named)
    for param, reference in zip(spelled, named, strict=True):
        assert torch.equal(param.detach(), reference.detach())


@pytest.mark.parametrize(
    ("cls", "keywords", "field", "message"),
    [
        (optiplug_adamw.AdamW, {"fused": True, "impl": "loop"}, "impl", r"impl='loop'.*fused=True"),
        (
            optiplug_adam.Adam,
            {"foreach": False, "impl": "fused"},
            "impl",
            r"'fused'.*foreach=False",
        ),
        (optiplug_sgd.SGD, {"foreach": True, "impl": "loop"}, "impl", r"'loop'.*foreach=True"),
        (optiplug_adamw.AdamW, {"fused": True, "foreach": True}, "fused", "cannot be True with"),
        (optiplug_sgd.SGD, {"fused": "yes"}, "fused", "must be True, False or None"),
        (optiplug_adam.Adam, {"capturable": True}, "capturable", "CUDA-graph capture"),
        (optiplug_adam.Adam, {"differentiable": True}, "differentiable", "torch.no_grad"),
        (optiplug_adam.Adam, {"decoupled_weight_decay": True}, "decoupled_weight_decay", "adamw"),
        (AdamWScheduleFree, {"fused": True}, "fused", "does not have"),
    ],
)
def test_a_contradiction_is_refused_naming_both_values(
    cls: type, keywords: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(HyperparameterError, match=message) as refused:
        cls(_params(), lr=1e-3, **keywords)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("cls", "keywords"),
    [
        (optiplug_adamw.AdamW, {"capturable": False, "differentiable": False}),
        (optiplug_adamw.AdamW, {"decoupled_weight_decay": True, "fused": None, "foreach": None}),
        (optiplug_adam.Adam, {"decoupled_weight_decay": False}),
    ],
)
def test_torch_defaults_are_accepted_and_leave_the_choice_to_optiplug(
    cls: type, keywords: dict[str, Any]
) -> None:
    optimizer = cls(_params(), lr=1e-3, **keywords)
    assert optimizer.impl in {"loop", "foreach", "fused"}

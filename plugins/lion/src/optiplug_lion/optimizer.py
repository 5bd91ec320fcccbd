"""The Lion optimizer: three kernels sharing one state slot, on :class:`~optiplug.base.KernelTableOptimizer`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from optiplug.base import (
    Kernel,
    KernelTableOptimizer,
    StateKernelSource,
    Supports,
    foreach_supported,
)

from .config import LionConfig
from .functional import LionHyper, lion_foreach, lion_fused, lion_loop
from .plugin import IMPLEMENTATIONS

__all__ = ["Lion", "fused_supported"]

_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fused_supported(params: Sequence[Tensor]) -> bool:
    """Whether the fused implementation can run ``params`` (dense fp16/bf16/fp32/fp64).

    Not distributed DTensors (FSDP's sharded parameters): the compiled
    kernel works on flat views of whole tensors, which a sharded tensor has
    not; the loop and foreach implementations run them.
    """
    return all(
        p.layout is torch.strided and p.dtype in _FLOATING and not hasattr(p, "to_local")
        for p in params
    )


LION_STATE_UPDATE = """
const float keep1 = 1.0f - b1, keep2 = 1.0f - b2, lrwd = lr * wd, other = 1.0f - cautious;
const float gi = grad * dir, mi = exp_avg, pi = param;
const float c = mi * b1 + gi * keep1;
const float update = (float)((c > 0) - (c < 0));
const float mask = update * pi >= 0 ? 1.0f : other;
param = pi * (1.0f - lrwd * mask) - lr * update;
exp_avg = mi + keep2 * (gi - mi);
"""
"""Lion's update of one element on int8/int4/bf16 momentum: the arithmetic of the fused
C kernel (:mod:`optiplug_lion.native`) for float32, in the same order."""


class Lion(KernelTableOptimizer):
    """Lion (Chen et al., 2023): a sign update of interpolated momentum.

    Per parameter, with gradient ``g`` (negated when ``maximize``) and
    momentum ``m`` (state slot ``exp_avg``)::

        c = beta1 * m + (1 - beta1) * g
        p = p * (1 - lr * weight_decay) - lr * sign(c)
        m = beta2 * m + (1 - beta2) * g

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: learning rate (default 1e-4); a float or a 0-d tensor.
        impl: ``"fused"``, ``"foreach"``, ``"loop"``, or None to pick the
            fastest supported one by measurement (cached per process).
        **hparams: ``betas`` (default (0.9, 0.99)), ``weight_decay``
            (default 0), ``maximize`` (default False).

    Raises:
        HyperparameterError: an unknown keyword, a bad value (naming field and
            value), or an ``impl`` that does not exist or cannot run ``params``.
    """

    algorithm = "lion"
    config_class = LionConfig
    implementations: ClassVar[Mapping[str, Kernel]] = {
        "loop": lion_loop,
        "foreach": lion_foreach,
        "fused": lion_fused,
    }
    supports: ClassVar[Mapping[str, Supports]] = {
        "foreach": foreach_supported,
        "fused": fused_supported,
    }
    priorities: ClassVar[Mapping[str, int]] = {n: p for n, (p, _) in IMPLEMENTATIONS.items()}
    descriptions: ClassVar[Mapping[str, str]] = {n: d for n, (_, d) in IMPLEMENTATIONS.items()}
    zero_state = ("exp_avg",)
    compiled: ClassVar[frozenset[str]] = frozenset({"fused"})
    state_kernel: ClassVar[StateKernelSource | None] = StateKernelSource(
        name="optiplug-lion-state",
        update=LION_STATE_UPDATE,
        slots=("exp_avg",),
        scalars=("lr", "wd", "b1", "b2", "dir", "cautious"),
    )

    def _kernel_options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The kernels take the group's hyperparameters packed in one :class:`LionHyper`."""
        return {"hyper": LionHyper.from_group(group)}

    def _state_kernel_scalars(self, group: dict[str, Any]) -> Mapping[str, float] | None:
        """The C state step's scalars; None (the decode-step-encode path) for a tensor lr."""
        hyper = LionHyper.from_group(group)
        if isinstance(hyper.lr, Tensor):
            return None
        return {
            "lr": hyper.lr, "wd": hyper.weight_decay, "b1": hyper.beta1, "b2": hyper.beta2,
            "dir": -1.0 if hyper.maximize else 1.0, "cautious": float(hyper.cautious),
        }  # fmt: skip

"""SGD's step on int8, int4 or bf16 momentum in one C pass over the codec's blocks.

The update of one element (torch's single-tensor SGD, :data:`SGD_STATE_KERNEL`)
is wrapped in the codec's loops by :func:`optiplug.base.build_state_kernel`;
:func:`fused_sgd_step` is what ``SGD`` declares as its ``state_step``.
"""

from __future__ import annotations

from typing import Any

import torch

from optiplug.base import StateKernelSource, group_precision, state_kernel_or_none

__all__ = ["SGD_STATE_KERNEL", "fused_sgd_step"]

SGD_STATE_KERNEL = StateKernelSource(
    name="optiplug-sgd-state",
    update="""
float d = maximize != 0.0f ? -grad : grad;
d = use_decay != 0.0f ? fmaf(param, decay, d) : d;
const float b = fmaf(d, keep, momentum_buffer * momentum);
momentum_buffer = b;
param = fmaf(nesterov != 0.0f ? fmaf(b, momentum, d) : b, neg_lr, param);
""",
    slots=("momentum_buffer",),
    scalars=("neg_lr", "momentum", "keep", "decay", "maximize", "nesterov", "use_decay"),
)
"""torch's single-tensor SGD step of one element: weight decay, the buffer's update and
the parameter's with fused multiply-adds, as ATen's ``add(alpha=)`` computes them."""


def fused_sgd_step(optimizer: torch.optim.Optimizer, group: dict[str, Any], param: Any) -> bool:
    """One SGD step of ``param`` on its int8/int4/bf16 momentum buffer in place, when it applies.

    The step is torch's single-tensor one (``maximize``, weight decay,
    ``dampening``, ``nesterov``) by :data:`SGD_STATE_KERNEL`; the buffer's
    ``writes`` grows by one, as a store does. Without momentum there is no
    state, and the torch step runs.

    Args:
        optimizer: a ``torch.optim.SGD`` whose state is low precision.
        group: ``param``'s group (its hyperparameters are read).
        param: the parameter, with a gradient.

    Returns:
        False, having changed nothing, when the C step does not apply (the
        group's implementation is not ``fused``, an option it lacks, no
        momentum buffer stored in the group's precision yet, a parameter
        :meth:`~optiplug.base.StateKernel.applies` refuses, no compiler); True when it
        stepped.
    """
    if torch.compiler.is_compiling() or not _plain_sgd_group(optimizer, group):
        return False
    state = optimizer.state.get(param)
    if not state:  # the first step creates it (and asks for the codec's C loops first)
        return False
    slots = [state.get("momentum_buffer")]
    kernel = state_kernel_or_none(SGD_STATE_KERNEL, wait=False)
    grad = param.grad
    if (
        kernel is None
        or grad is None
        or not kernel.applies(param, grad, slots, group_precision(group))
    ):
        return False
    kernel.step(param, grad, slots, _sgd_scalars(group))
    return True


def _plain_sgd_group(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether ``group`` runs the fused implementation with momentum and plain-number options."""
    if not group.get("fused") or group.get("differentiable"):
        return False
    if getattr(optimizer, "grad_scale", None) is not None:
        return False
    if getattr(optimizer, "found_inf", None) is not None:
        return False
    scalars = [group.get(key) for key in ("lr", "momentum", "dampening", "weight_decay")]
    return all(isinstance(value, (int, float)) for value in scalars) and group["momentum"] != 0


def _sgd_scalars(group: dict[str, Any]) -> dict[str, float]:
    """:data:`SGD_STATE_KERNEL`'s scalars: what torch's single-tensor SGD passes to ATen (flags 0 or 1)."""
    decay = float(group["weight_decay"])
    return {
        "neg_lr": -float(group["lr"]),
        "momentum": float(group["momentum"]),
        "keep": 1 - float(group["dampening"]),
        "decay": decay,
        "maximize": float(bool(group.get("maximize"))),
        "nesterov": float(bool(group.get("nesterov"))),
        "use_decay": float(decay != 0),
    }

"""Finding NaN and inf in a Graph's gradients, parameters and optimizer state.

One multi-tensor reduction per device and dtype answers "is everything finite?"; only when something
may not be is the answer made exact, and only when something is not are the tensors looked at one
by one, to name the first culprit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor

__all__ = [
    "NONFINITE_POLICIES",
    "all_finite",
    "first_nonfinite",
    "gradient_values",
    "gradients",
    "parameters",
    "state_items",
    "state_values",
]

NONFINITE_POLICIES = ("stop", "skip")
"""What a Graph does on a non-finite loss or gradient (see ``Graph.set_nonfinite_policy``)."""


def first_nonfinite(named: Iterable[tuple[str, Any]]) -> str | None:
    """The name of the first value holding NaN or inf, or None when all are finite.

    Args:
        named: ``(name, value)`` pairs; floating (and complex) tensors and
            Python floats are checked, anything else is ignored.

    Returns:
        The name of a non-finite value, or None.
    """
    pairs = list(named)
    if all_finite(value for _, value in pairs):
        return None
    return next(name for name, value in pairs if not all_finite([value]))


def all_finite(values: Iterable[Any]) -> bool:
    """Whether every floating (or complex) tensor and Python float in ``values`` is finite.

    A Graph step calls this on its gradients, parameters and state without
    building any names; only when it answers False are the values named one
    by one (:func:`first_nonfinite`). Tensors are grouped by device and
    dtype, and each group costs one multi-tensor reduction and one host sync
    (:func:`_group_finite`). Empty tensors are finite (their norm is
    undefined). A ``DTensor`` (FSDP's sharded parameters, gradients and
    state) is checked on its local shard, with no communication: the answer
    is this rank's, and a caller whose ranks hold different shards agrees on
    it across them (``Graph`` does, with one all-reduce).
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if isinstance(value, DTensor):
            value = value.to_local()
        floating = isinstance(value, torch.Tensor) and (
            value.is_floating_point() or value.is_complex()
        )
        if floating and value.numel():
            groups.setdefault((value.device, value.dtype), []).append(value)
    return all(_group_finite(group) for group in groups.values())


def _group_finite(group: list[torch.Tensor]) -> bool:
    """Whether every element of ``group`` (one device and dtype) is finite.

    The screen is the sum of the tensors' 2-norms (``torch._foreach_norm``,
    one fused kernel on CUDA and the fastest multi-tensor reduction on the
    CPU): NaN and inf propagate into it, so a finite sum proves every element
    finite. A non-finite sum may also come from finite values whose squares
    overflow, so only then is the exact answer taken: the infinity norm (a
    max, which cannot overflow), several times slower. Half-precision norms
    are taken in float32, whose range their squares fit.
    """
    wide = torch.float32 if group[0].dtype in (torch.float16, torch.bfloat16) else None
    with torch.no_grad():  # one switch for the group, cheaper than a detach per tensor
        if bool(torch.stack(torch._foreach_norm(group, 2, dtype=wide)).sum().isfinite()):
            return True
        return bool(torch.stack(torch._foreach_norm(group, math.inf)).isfinite().all())


def parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``("parameter 'name'", tensor)`` for every parameter of ``module``."""
    for name, parameter in module.named_parameters():
        yield f"parameter {name!r}", parameter


def gradients(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``("the gradient of parameter 'name'", grad)`` for every parameter that has one."""
    for name, parameter in module.named_parameters():
        if parameter.grad is not None:
            yield f"the gradient of parameter {name!r}", parameter.grad


def gradient_values(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients ``params`` have, without names (for :func:`all_finite`)."""
    return [p.grad for p in params if p.grad is not None]


def state_values(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[Any]:
    """Every parameter of ``module`` and optimizer state value, without names."""
    state = getattr(optimizer, "state", {})
    entries = state.values() if hasattr(state, "values") else ()
    values = [v for entry in entries if hasattr(entry, "values") for v in entry.values()]
    return [*module.parameters(), *values]


def state_items(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> Iterator[tuple[str, Any]]:
    """``("optimizer state 'slot' of parameter 'name'", value)`` for every state slot."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    state = getattr(optimizer, "state", {})
    for key, slots in state.items() if hasattr(state, "items") else ():
        owner = names.get(id(key), "?")
        for slot, value in slots.items() if hasattr(slots, "items") else ():
            yield f"optimizer state {slot!r} of parameter {owner!r}", value

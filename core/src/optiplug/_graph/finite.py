"""Finding NaN and inf in a Graph's gradients, parameters and optimizer state.

One reduction per device answers "is everything finite?"; only when something
is not are the tensors looked at one by one, to name the first culprit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["NONFINITE_POLICIES", "first_nonfinite", "gradients", "parameters", "state_items"]

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
    tensors: list[tuple[str, torch.Tensor]] = []
    for name, value in named:
        if isinstance(value, float) and not math.isfinite(value):
            return name
        if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
            tensors.append((name, value))
    if _all_finite(tensor for _, tensor in tensors):
        return None
    return next(name for name, tensor in tensors if not bool(torch.isfinite(tensor).all()))


def _all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every tensor is finite: one host synchronisation per device."""
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        flags.setdefault(tensor.device, []).append(torch.isfinite(tensor.detach()).all())
    return all(bool(torch.stack(found).all()) for found in flags.values())


def parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``("parameter 'name'", tensor)`` for every parameter of ``module``."""
    for name, parameter in module.named_parameters():
        yield f"parameter {name!r}", parameter


def gradients(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``("the gradient of parameter 'name'", grad)`` for every parameter that has one."""
    for name, parameter in module.named_parameters():
        if parameter.grad is not None:
            yield f"the gradient of parameter {name!r}", parameter.grad


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

"""Stepping an optimizer in its groups' ``state_precision``: one low-precision parameter at a time."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import HyperparameterError
from ..validators import STATE_PRECISIONS
from .dtensor import decoded, local_of
from .quantized import QuantizedState, _stored_in
from .slots import (
    NO_SLOTS,
    SECOND_MOMENTS,
    STEPPED_PRECISIONS,
    _is_state_tensor,
    _slot_in_precision,
    convert_state,
    group_precision,
    slot_table,
)

__all__ = [
    "SlotTables",
    "StepRun",
    "StoredStateStep",
    "origin_of",
    "run_in_state_precision",
    "step_in_state_precision",
    "stepping_view",
]

StepRun = Callable[[Any], None]
"""A step's update over the param groups of the optimizer (or view of it) it is given."""

StoredStateStep = Callable[[Any, dict[str, Any], torch.Tensor], bool]
"""``(optimizer, group, param) -> bool``: step ``param`` on its stored codes (True) or decline."""

SlotTables = tuple[frozenset[str], frozenset[str], frozenset[str]]
"""The second moments', the linear slots' and the low-rank slots' names."""


def stepping_view(optimizer: Any, param_groups: list[dict[str, Any]]) -> Any:
    """A shallow twin of ``optimizer`` whose ``param_groups`` are ``param_groups``.

    It shares everything else (state, defaults, hooks, flags), so a step run
    on it updates the optimizer's parameters and state while the
    optimizer's own ``param_groups`` stay as they are.
    """
    view = object.__new__(type(optimizer))
    vars(view).update(vars(optimizer))
    view.param_groups = param_groups
    vars(view)[_VIEW_OF] = origin_of(optimizer)
    return view


_VIEW_OF = "_optiplug_view_of"


def origin_of(optimizer: Any) -> Any:
    """The optimizer a :func:`stepping_view` was made of (an optimizer is its own origin)."""
    return vars(optimizer).get(_VIEW_OF, optimizer)


def run_in_state_precision(
    optimizer: Any,
    run: StepRun,
    tables: SlotTables = (SECOND_MOMENTS, NO_SLOTS, NO_SLOTS),
    stored_step: StoredStateStep | None = None,
) -> None:
    """Run ``run`` (a step's update) in each param group's ``state_precision``.

    Full-precision groups step together, as they always do. A low-precision
    group steps one parameter at a time: its slots are decoded to plain
    tensors, ``run`` gets a view of the optimizer (:func:`stepping_view`)
    whose only group is that parameter's, and the slots are encoded back,
    so at most one parameter's state is full precision at any moment and
    the optimizer's ``param_groups`` are never changed. A sharded
    (``DTensor``) parameter's slots are ``DTensor``s whose shards are
    quantized (blocks within the shard): the shard is decoded into a
    ``DTensor`` of the same placements, then encoded back.

    Args:
        optimizer: the optimizer, or a view of it.
        run: the update over the groups of the optimizer it is given.
        tables: the names of the slots taking the unsigned table without
            zero, the linear table, and low-rank factors.
        stored_step: tried first for each parameter of a low-precision group
            (with its group); when it returns True it has stepped that
            parameter on its stored state, which is then not decoded.
    """
    groups = optimizer.param_groups
    _decode_switched(optimizer, _checked_precisions(optimizer, groups), tables)
    low = [group for group in groups if group_precision(group) != "fp32"]
    if not low:
        run(optimizer)
        return
    full = [group for group in groups if group_precision(group) == "fp32"]
    if full:
        run(stepping_view(optimizer, full))
    for group in low:
        for index, param in enumerate(group["params"]):
            if param.grad is not None:
                view = stepping_view(optimizer, [_narrowed(group, index)])
                _step_one(view, param, run, tables, stored_step)


def step_in_state_precision(
    optimizer: torch.optim.Optimizer,
    step: Callable[[], Any],
    second_moments: frozenset[str] = SECOND_MOMENTS,
    fused_step: StoredStateStep | None = None,
    linear_slots: frozenset[str] = NO_SLOTS,
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> None:
    """Deprecated: :func:`run_in_state_precision` with a closure over ``optimizer.param_groups``.

    Kept for plugins written against it: ``step`` reads the optimizer's own
    ``param_groups``, so they are narrowed for each call and restored after.
    New code declares the state codec in its step pipeline
    (:data:`optiplug.base.state_codec`), which never changes them.
    """
    groups = optimizer.param_groups

    def run(view: Any) -> None:
        optimizer.param_groups = view.param_groups
        try:
            step()
        finally:
            optimizer.param_groups = groups

    run_in_state_precision(
        optimizer, run, (second_moments, linear_slots, low_rank_slots), fused_step
    )


def _checked_precisions(
    optimizer: torch.optim.Optimizer, groups: Sequence[Mapping[str, Any]]
) -> tuple[str, ...]:
    """Every group's ``state_precision``, each one of :data:`STATE_PRECISIONS`.

    Raises:
        HyperparameterError: a group holds another value (a typo, or a
            precision set by hand after creation); nothing has run.
    """
    precisions = tuple(group_precision(group) for group in groups)
    for precision in precisions:
        if precision not in STATE_PRECISIONS:
            reason = f"must be one of {', '.join(STATE_PRECISIONS)}"
            algorithm = getattr(type(optimizer), "algorithm", None)
            name = algorithm if isinstance(algorithm, str) else type(optimizer).__name__
            raise HyperparameterError("state_precision", precision, reason, algorithm=name)
    return precisions


def _decode_switched(
    optimizer: torch.optim.Optimizer,
    precisions: tuple[str, ...],
    tables: tuple[frozenset[str], frozenset[str], frozenset[str]],
) -> None:
    """Decode the stored codes of full-precision groups when the groups' precisions changed.

    A group set to ``"fp32"`` after steps in a low precision (or state
    loaded or converted since the last step) may hold codes; its kernels
    take plain tensors only, so they are decoded before any kernel runs and
    a step never half-applies. While the precisions stay as they were at the
    last step, nothing is scanned.
    """
    origin = origin_of(optimizer)
    if getattr(origin, STEPPED_PRECISIONS, None) == precisions:
        return
    groups = optimizer.param_groups
    full = [
        p for g, kept in zip(groups, precisions, strict=True) if kept == "fp32" for p in g["params"]
    ]
    if full:
        convert_state(optimizer, full, *tables)
    setattr(origin, STEPPED_PRECISIONS, precisions)


def _narrowed(group: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A shallow copy of ``group`` holding only its ``index``-th parameter (and name)."""
    narrowed = {**group, "params": [group["params"][index]]}
    names = group.get("param_names")
    if isinstance(names, (list, tuple)) and len(names) == len(group["params"]):
        narrowed["param_names"] = [names[index]]
    return narrowed


def _step_one(
    view: Any,
    param: torch.Tensor,
    run: StepRun,
    tables: SlotTables,
    stored_step: StoredStateStep | None = None,
) -> None:
    """Step ``param`` alone (``view``'s only group) on its decoded slots; store them back."""
    if stored_step is not None and stored_step(view, view.param_groups[0], param):
        return
    state = view.state[param]
    stored = {k: v for k, v in state.items() if isinstance(local_of(v), QuantizedState)}
    for key, value in stored.items():
        state[key] = decoded(value)
    run(view)
    precision = group_precision(view.param_groups[0])
    for key, value in list(state.items()):
        if not _is_state_tensor(key, value, param):
            continue
        kept = stored.get(key)
        table = slot_table(key, precision, *tables)
        if kept is not None and _stored_in(local_of(kept), precision, *table):
            local_of(kept).store(local_of(value))
            state[key] = kept
        else:
            state[key] = _slot_in_precision(key, value, precision, *tables)

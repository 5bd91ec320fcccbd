"""An optimizer's state slots in its groups' ``state_precision``: which table, and converting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .dtensor import is_dtensor, local_of, sharded_like
from .low_rank import LOW_RANK
from .quantized import QuantizedState, _plain, _stored_in

__all__ = [
    "MIN_QUANTIZED_NUMEL",
    "NO_SLOTS",
    "SECOND_MOMENTS",
    "convert_state",
    "group_precision",
    "in_precision",
    "slot_table",
    "state_in_precision",
]

MIN_QUANTIZED_NUMEL = 4096
"""Smaller state tensors stay full precision (torchao's threshold)."""


def in_precision(
    value: torch.Tensor, precision: str, *, signed: bool, linear: bool = False, rank: int = 0
) -> torch.Tensor:
    """``value`` converted to ``precision`` (a plain tensor for ``"fp32"``).

    ``linear`` codes int8/int4 by :func:`linear_table` (a stored slot in the
    other table is re-encoded); ``rank`` > 0 keeps factors of that rank
    beside the codes of a matrix (see :meth:`QuantizedState.encode`).

    A tensor under :data:`MIN_QUANTIZED_NUMEL` elements, or one that is not
    floating point, stays as it is (plain, decoded if it was stored low). A
    ``DTensor`` (FSDP's sharded state) converts its local shard, blocks
    within the shard, and stays a ``DTensor`` of the same placements; whether
    it is quantized is decided by its global size, so every rank decides
    alike.
    """
    if is_dtensor(value):
        small = value.numel() < MIN_QUANTIZED_NUMEL
        chosen = "fp32" if small else precision
        local = local_of(value)
        converted = _in_precision_local(local, chosen, (signed, linear, rank), smallest=0)
        return value if converted is local else sharded_like(value, converted)
    return _in_precision_local(value, precision, (signed, linear, rank), MIN_QUANTIZED_NUMEL)


def _in_precision_local(
    value: torch.Tensor, precision: str, table: tuple[bool, bool, int], smallest: int
) -> torch.Tensor:
    """:func:`in_precision` of a plain (or quantized) tensor (``table``: signed, linear,
    rank); under ``smallest`` elements: plain."""
    plain: torch.Tensor = _plain(value)
    if precision == "fp32" or plain.numel() < smallest or not plain.is_floating_point():
        return plain
    if isinstance(value, QuantizedState) and _stored_in(value, precision, *table):
        return value
    writes = value.writes if isinstance(value, QuantizedState) else 0
    signed, linear, rank = table
    return QuantizedState.encode(
        plain, precision, signed=signed, writes=writes, linear=linear, rank=rank
    )


# ------------------------------------------------------------------ optimizers' state in a precision
SECOND_MOMENTS = frozenset({"exp_avg_sq", "max_exp_avg_sq"})
"""Slots kept with the unsigned table without zero, by default (torch's names for them)."""

NO_SLOTS: frozenset[str] = frozenset()
"""No slot takes the linear table, by default."""

LINEAR_SECOND_MOMENTS = frozenset({"int4"})
"""Precisions whose second moments take the linear table without zero, ``k / 16``
(Li et al. 2023's linear map, torchao's 4-bit second moment): with 16 codes, the
dynamic table's decades leave a second moment's relative error up to 53%."""


def group_precision(group: Mapping[str, Any]) -> str:
    """A param group's ``state_precision`` (``"fp32"`` when it has none)."""
    return str(group.get("state_precision", "fp32"))


def _is_state_tensor(key: Any, value: Any, param: torch.Tensor) -> bool:
    """Whether ``value`` is a per-element state slot of ``param`` (not a step counter)."""
    return (
        key != "step"
        and isinstance(value, torch.Tensor)
        and value.shape == param.shape
        and value.is_floating_point()
    )


def convert_state(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.Tensor] | None = None,
    second_moments: frozenset[str] = SECOND_MOMENTS,
    linear_slots: frozenset[str] = NO_SLOTS,
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> None:
    """Store every parameter's state slots in its group's ``state_precision``.

    A slot in another precision is decoded and re-encoded; a slot under
    :data:`MIN_QUANTIZED_NUMEL` elements stays plain. Used after loading a
    state dict (a full-precision checkpoint into an int8 optimizer and back)
    and after each step of a low-precision group.

    Args:
        optimizer: any optimizer whose groups may carry ``state_precision``.
        params: only these parameters (None: all).
        second_moments: slot names that take the unsigned table without zero.
        linear_slots: slot names that take the linear signed table.
        low_rank_slots: slot names that keep :data:`LOW_RANK` factors beside
            int8/int4 codes, where they are matrices.
    """
    tables = (second_moments, linear_slots, low_rank_slots)
    forget_precisions(optimizer)
    chosen = None if params is None else {id(p) for p in params}
    for group in optimizer.param_groups:
        precision = group_precision(group)
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state or (chosen is not None and id(param) not in chosen):
                continue
            for key, value in list(state.items()):
                if _is_state_tensor(key, value, param):
                    state[key] = _slot_in_precision(key, value, precision, *tables)


def state_in_precision(
    state: dict[Any, dict[str, Any]],
    groups: Sequence[Mapping[str, Any]],
    second_moments: frozenset[str] = SECOND_MOMENTS,
    linear_slots: frozenset[str] = NO_SLOTS,
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> None:
    """Give each parameter of ``groups`` a new entry in ``state`` with its slots in its
    group's ``state_precision`` (:func:`convert_state` for state built aside).

    The entries are replaced, never changed in place, so a state mapping
    that shares entries with an optimizer leaves that optimizer as it was
    when this raises: loading converts the new state before swapping it in.

    Args:
        state: parameter -> slots, as an optimizer's ``state``.
        groups: the param groups the parameters belong to.
        second_moments: slot names that take the unsigned table without zero.
        linear_slots: slot names that take the linear signed table.
        low_rank_slots: slot names that keep :data:`LOW_RANK` factors.
    """
    tables = (second_moments, linear_slots, low_rank_slots)
    for group in groups:
        precision = group_precision(group)
        for param in group["params"]:
            entry = state.get(param)
            if entry:
                state[param] = {
                    key: _slot_in_precision(key, value, precision, *tables)
                    if _is_state_tensor(key, value, param)
                    else value
                    for key, value in entry.items()
                }


def slot_table(
    key: str,
    precision: str,
    second_moments: frozenset[str],
    linear_slots: frozenset[str],
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> tuple[bool, bool, int]:
    """``(signed, linear, rank)``: the table and factors slot ``key`` takes in ``precision``.

    A second moment takes the unsigned table without zero: the dynamic one,
    or in :data:`LINEAR_SECOND_MOMENTS` precisions the linear one. Any other
    slot takes the signed table: linear when named in ``linear_slots``. A
    slot named in ``low_rank_slots`` keeps :data:`LOW_RANK` factors (bf16:
    none).
    """
    signed = key not in second_moments
    if precision == "bf16":
        return signed, False, 0
    linear = key in linear_slots if signed else precision in LINEAR_SECOND_MOMENTS
    return signed, linear, LOW_RANK if key in low_rank_slots else 0


def _slot_in_precision(
    key: str,
    value: torch.Tensor,
    precision: str,
    second_moments: frozenset[str],
    linear_slots: frozenset[str],
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> torch.Tensor:
    """Slot ``key``'s ``value`` in ``precision``, in the table its name calls for."""
    tables = (second_moments, linear_slots, low_rank_slots)
    signed, linear, rank = slot_table(key, precision, *tables)
    return in_precision(value, precision, signed=signed, linear=linear, rank=rank)


STEPPED_PRECISIONS = "_optiplug_state_precisions"
"""The optimizer attribute holding its groups' precisions at the last step: while they
stay, no full-precision group can hold codes, and nothing is scanned."""


def forget_precisions(optimizer: Any) -> None:
    """Make the next step look for stored codes again (its state was replaced or converted)."""
    vars(optimizer).pop(STEPPED_PRECISIONS, None)

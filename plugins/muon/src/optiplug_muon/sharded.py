"""Muon on ``DTensor`` parameters (FSDP2): what is supported, and moving rows to owners.

FSDP2 (``torch.distributed.fsdp.fully_shard``) turns every parameter into a
``DTensor`` on a 1-D device mesh, placed ``Shard(0)``: each rank holds a
block of rows (``torch.chunk``'s split, so uneven and empty blocks occur).
Newton-Schulz needs the whole matrix, so :class:`Muon
<optiplug_muon.Muon>` gathers each matrix's momentum direction on one owner
rank (:func:`~optiplug_muon.report.assign_owners`), orthogonalises it there
and sends each rank its rows of the result. All matrices of one process
group travel in one ``all_to_all_single`` there and one back
(:func:`all_to_all`), in the Newton-Schulz dtype.

Supported: ``Shard(0)`` and ``Replicate()`` on a 1-D mesh (a replicated
matrix is whole on every rank and is orthogonalised there, without
communication). Anything else raises :class:`UnsupportedPlacementError`
naming the parameter: a matrix routed to Muon is orthogonalised whole or
not stepped at all, never stepped some other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from optiplug.errors import HyperparameterError

__all__ = [
    "UnsupportedPlacementError",
    "all_to_all",
    "describe_placement",
    "elementwise_problem",
    "is_distributed",
    "local",
    "muon_problem",
    "split_sizes",
    "whole_on_every_rank",
]


def is_distributed(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a ``DTensor`` (it has placements and a local part).

    Args:
        tensor: a parameter, gradient or state tensor.

    Returns:
        True for a ``torch.distributed.tensor.DTensor``.
    """
    return hasattr(tensor, "placements") and hasattr(tensor, "to_local")


def local(tensor: Tensor) -> Tensor:
    """This rank's part of a ``DTensor`` (sharing its storage); other tensors as they are.

    Args:
        tensor: a tensor or ``DTensor``.

    Returns:
        The local tensor; in-place updates of it update ``tensor``.
    """
    if is_distributed(tensor):
        result: Tensor = tensor.to_local()  # type: ignore[attr-defined]
        return result
    return tensor


def describe_placement(tensor: Any) -> str:
    """``placements (Shard(dim=0)) on a device mesh of shape (2,)`` for a ``DTensor``.

    Args:
        tensor: a ``DTensor``.

    Returns:
        Its placements and mesh shape, for messages.
    """
    placements = ", ".join(repr(p) for p in tensor.placements)
    return f"placements ({placements}) on a device mesh of shape {tuple(tensor.device_mesh.shape)}"


def muon_problem(tensor: Tensor) -> str | None:
    """Why Muon cannot orthogonalise the ``DTensor`` ``tensor``, or None when it can.

    Args:
        tensor: a ``DTensor`` parameter routed to Muon.

    Returns:
        None for ``Shard(0)`` or ``Replicate()`` on a 1-D mesh, else the reason.
    """
    mesh: Any = tensor.device_mesh  # type: ignore[attr-defined]
    where = describe_placement(tensor)
    if mesh.ndim != 1:
        return (
            f"it has {where}; Muon orthogonalises DTensors on a 1-D mesh only "
            "(FSDP2 over one mesh dimension), placed Shard(0) or Replicate()"
        )
    (placement,) = tensor.placements  # type: ignore[attr-defined]
    if placement.is_shard(0) or placement.is_replicate():
        return None
    return (
        f"it has {where}; Muon orthogonalises DTensors placed Shard(0) (rows split "
        "across ranks, as FSDP2 does) or Replicate(), not this placement"
    )


def elementwise_problem(tensor: Tensor) -> str | None:
    """Why the auxiliary AdamW cannot step ``tensor``'s local part alone, or None.

    An elementwise update is right on any shard or replica, but not on a
    ``Partial`` placement (the local part is a summand of the value).

    Args:
        tensor: a ``DTensor`` parameter routed to the auxiliary AdamW.

    Returns:
        None, or the reason.
    """
    if any(p.is_partial() for p in tensor.placements):  # type: ignore[attr-defined]
        return (
            f"it has {describe_placement(tensor)}; a Partial placement holds summands, not values"
        )
    return None


def whole_on_every_rank(tensor: Tensor) -> bool:
    """Whether every rank holds the whole of a supported ``DTensor``.

    True for ``Replicate()``, and for ``Shard(0)`` on a mesh of one rank.

    Args:
        tensor: a ``DTensor`` for which :func:`muon_problem` is None.

    Returns:
        True when the local tensor is the whole matrix.
    """
    (placement,) = tensor.placements  # type: ignore[attr-defined]
    return bool(placement.is_replicate() or tensor.device_mesh.size() == 1)  # type: ignore[attr-defined]


class UnsupportedPlacementError(HyperparameterError):
    """A parameter is distributed in a way its algorithm half cannot step.

    Raised when the optimizer is built (or a group added) for a ``DTensor``
    parameter routed to Muon that is not ``Shard(0)``/``Replicate()`` on a
    1-D mesh, or routed to the auxiliary AdamW with a ``Partial``
    placement, and at ``step`` when a gradient or state tensor is placed
    unlike its parameter. A ``HyperparameterError`` (field ``params``) whose
    value is the parameter's name, or ``#i (shape RxC)`` when unnamed.

    Args:
        parameter: the parameter's name or ``#i (shape ...)``.
        reason: what is wrong and what is supported.

    Attributes:
        parameter: as given.
    """

    def __init__(self, parameter: str, reason: str) -> None:
        self.parameter = parameter
        super().__init__("params", parameter, reason, algorithm="muon")


def all_to_all(send: Tensor, send_sizes: list[int], receive_sizes: list[int], group: Any) -> Tensor:
    """One ``all_to_all_single`` over ``group``: ``send_sizes[r]`` elements of ``send`` to rank r.

    Args:
        send: this rank's elements (flat), ordered by destination rank.
        send_sizes: per rank, the elements it gets from ``send``.
        receive_sizes: per rank, the elements it sends here.
        group: the process group (of the matrices' device mesh).

    Returns:
        The received elements (flat), ordered by source rank.
    """
    received = send.new_empty(sum(receive_sizes))
    torch.distributed.all_to_all_single(received, send, receive_sizes, send_sizes, group=group)
    return received


def split_sizes(
    owners: Sequence[int],
    ranges: Sequence[Sequence[tuple[int, int]]],
    cols: Sequence[int],
    rank: int,
) -> tuple[list[int], list[int]]:
    """Elements this rank sends to, and receives from, each rank when gathering to owners.

    Args:
        owners: per matrix, the owner's rank.
        ranges: per matrix, every rank's ``(start, end)`` rows.
        cols: per matrix, its columns.
        rank: this rank.

    Returns:
        ``(send, receive)``: per rank, a number of elements. Sending results
        back from owners is the same exchange reversed: send ``receive``,
        receive ``send``.
    """
    world = len(ranges[0]) if ranges else 1
    send = [0] * world
    receive = [0] * world
    for owner, spans, width in zip(owners, ranges, cols, strict=True):
        start, end = spans[rank]
        send[owner] += (end - start) * width
        if owner == rank:
            for source, (first, last) in enumerate(spans):
                receive[source] += (last - first) * width
    return send, receive

"""What a Muon step did on this rank, and how sharded matrices get their owner (torch-free).

Under FSDP2 a Muon matrix is a ``DTensor`` split by rows across the ranks of
its device mesh, and Newton-Schulz needs the whole matrix. Each matrix gets
one *owner* rank, which receives every rank's rows, orthogonalises the whole
matrix and sends every rank its rows of the result back.
:func:`assign_owners` spreads the Newton-Schulz work evenly over the ranks;
:class:`StepReport` records what a step did, so that a sharded run that
silently stepped its matrices some other way shows up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

__all__ = ["StepReport", "assign_owners", "newton_schulz_cost", "row_ranges"]


def newton_schulz_cost(rows: int, cols: int) -> int:
    """The cost measure owners are balanced by: ``rows * cols * min(rows, cols)``.

    Every Newton-Schulz product is ``k x k x n`` or ``k x k x k`` (k the
    smaller side, n the larger), so one orthogonalisation costs a fixed
    multiple (set by ``ns_steps`` and the method) of ``k * k * n``.

    Args:
        rows: matrix rows.
        cols: matrix columns.

    Returns:
        ``rows * cols * min(rows, cols)``.
    """
    return rows * cols * min(rows, cols)


def assign_owners(costs: Sequence[int], world: int) -> list[int]:
    """Owner rank of each matrix: greedy, largest cost first, to the least loaded rank.

    This is the longest-processing-time rule: its most loaded rank carries at
    most 4/3 of the best possible maximum (Graham, 1969); for ``N`` equal
    costs it gives every rank ``floor(N / world)`` or ``ceil(N / world)``
    matrices. Ties go to the earlier matrix and the lower rank, so every
    rank computes the same answer from the same list.

    Args:
        costs: per matrix, its :func:`newton_schulz_cost`, in the order every
            rank steps them.
        world: ranks in the process group.

    Returns:
        Per matrix, the rank (in the process group) that orthogonalises it.

    Raises:
        ValueError: ``world`` is less than 1.
    """
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    loads = [0] * world
    owners = [0] * len(costs)
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world), key=lambda r: (loads[r], r))
        owners[index] = rank
        loads[rank] += costs[index]
    return owners


def row_ranges(rows: int, world: int) -> list[tuple[int, int]]:
    """The rows ``[start, end)`` each rank holds of a ``Shard(0)`` tensor with ``rows`` rows.

    ``DTensor`` splits like ``torch.chunk``: ``ceil(rows / world)`` rows per
    rank, the last ranks holding fewer, possibly none (3 rows over 2 ranks:
    2 and 1; 1 row over 2 ranks: 1 and 0).

    Args:
        rows: the global size of dimension 0.
        world: ranks of the mesh dimension it is sharded over.

    Returns:
        One ``(start, end)`` per rank.
    """
    chunk = -(-rows // world)
    return [(min(rank * chunk, rows), min((rank + 1) * chunk, rows)) for rank in range(world)]


def _names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class StepReport:
    """What the last :meth:`Muon.step <optiplug_muon.Muon.step>` did on this rank.

    Parameters are named as in :meth:`Muon.routing <optiplug_muon.Muon.routing>`
    (their names, else ``#i``, their position in the optimizer). The name
    fields take any iterable (a report sent as JSON comes back as lists).

    Attributes:
        rank: this process's rank (``torch.distributed``), 0 when not distributed.
        world: the number of ranks, 1 when not distributed.
        orthogonalized: the matrices Newton-Schulz ran on *here*: ordinary
            tensors, replicated DTensors, and the sharded matrices this rank owns.
        gathered: of those, the sharded ones: their rows came from every rank.
        replicated: of those, the replicated DTensors (every rank orthogonalises
            them, with no communication).
        sharded: every sharded Muon matrix stepped (this rank sent its rows of
            each to the owner), owned here or not.
        elementwise: the parameters the auxiliary AdamW stepped (local shards).
        ns_cost: the sum of ``rows * cols * min(rows, cols)`` over ``orthogonalized``.
        collectives: collective calls made (two all-to-alls per process group
            and Newton-Schulz dtype with sharded matrices; 0 otherwise).
    """

    rank: int
    world: int
    orthogonalized: tuple[str, ...] = attrs.field(converter=_names)
    gathered: tuple[str, ...] = attrs.field(converter=_names)
    replicated: tuple[str, ...] = attrs.field(converter=_names)
    sharded: tuple[str, ...] = attrs.field(converter=_names)
    elementwise: tuple[str, ...] = attrs.field(converter=_names)
    ns_cost: int
    collectives: int

    @property
    def newton_schulz_count(self) -> int:
        """How many matrices went through Newton-Schulz on this rank."""
        return len(self.orthogonalized)

    @property
    def elementwise_count(self) -> int:
        """How many parameters stepped elementwise (auxiliary AdamW) on this rank."""
        return len(self.elementwise)

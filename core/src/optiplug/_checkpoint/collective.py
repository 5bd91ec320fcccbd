"""The ranks of a sharded checkpoint: who this rank is, and collectives that fail as one.

Without ``torch.distributed`` (or before a process group is up) there is one
rank, 0, and every collective is the identity.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from ..errors import CheckpointError

__all__: list[str] = []

_T = TypeVar("_T")


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _active() else 0


def _world() -> int:
    return dist.get_world_size() if _active() else 1


def _gather(value: _T) -> list[_T]:
    """Every rank's ``value``, in rank order (``[value]`` without a process group)."""
    if not _active():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def _from_rank0(value: _T) -> _T:
    """Rank 0's ``value`` on every rank."""
    if not _active():
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def _collective(
    path: Path, action: str, call: Callable[[], _T], on_disk: Callable[[], str] | None = None
) -> _T:
    """Run a collective step; a rank that died or timed out becomes a :class:`CheckpointError`.

    Args:
        path: the checkpoint, for the message.
        action: ``"saving"`` or ``"loading"``.
        call: the collective.
        on_disk: once the failure is known, says what ``path`` holds now
            (a save whose rank 0 may have committed before the failure);
            None: nothing can have been committed.
    """
    try:
        return call()
    except (RuntimeError, CheckpointException) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        outcome = on_disk() if on_disk is not None else "nothing was committed"
        message = (
            f"{action} {path} failed on rank {_rank()}: another rank failed or stopped "
            f"answering ({first[:300]}); {outcome}"
        )
        raise CheckpointError(message) from None


def _run_dcp(call: Callable[[], _T]) -> _T:
    """A DCP call; without a process group, minus DCP's warning that it runs in one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return call()

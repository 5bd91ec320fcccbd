"""Which process this is under ``torch.distributed``: the application's one place that asks."""

from __future__ import annotations

import torch

__all__ = ["active", "rank", "world_size"]


def active() -> bool:
    """Whether a ``torch.distributed`` process group is initialized in this process."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """This process's rank in the default group (0 when not distributed)."""
    return torch.distributed.get_rank() if active() else 0


def world_size() -> int:
    """Processes in the default group (1 when not distributed)."""
    return torch.distributed.get_world_size() if active() else 1

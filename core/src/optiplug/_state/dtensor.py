"""Sharded (``DTensor``) state: a shard stored quantized inside its ``DTensor``."""

from __future__ import annotations

import sys
from typing import Any

import torch

from .quantized import QuantizedState

__all__ = ["decoded", "is_dtensor", "local_of", "sharded_like"]


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a ``DTensor`` (none exists unless torch.distributed.tensor is loaded)."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and isinstance(value, dtensor)


def local_of(value: Any) -> Any:
    """A ``DTensor``'s local shard as it is stored (quantized or not); anything else as it is."""
    return value._local_tensor if is_dtensor(value) else value


def sharded_like(like: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as the shard of a ``DTensor`` with ``like``'s mesh, placements, shape and stride.

    A :class:`QuantizedState` shard stays quantized inside it (DTensor views
    its shard at the same shape, which shares the codes).
    """
    from torch.distributed.tensor import DTensor  # deferred: imports torch

    return DTensor.from_local(
        local,
        like.device_mesh,  # type: ignore[attr-defined]  # a DTensor's
        like.placements,  # type: ignore[attr-defined]
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def decoded(value: torch.Tensor) -> torch.Tensor:
    """``value`` with its quantized storage (its own, or its shard's) decoded; else as it is."""
    local = local_of(value)
    if not isinstance(local, QuantizedState):
        return value
    return sharded_like(value, local.dequantize()) if local is not value else local.dequantize()

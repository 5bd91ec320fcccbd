"""A state tensor's memory layout (its strides), kept through a checkpoint.

safetensors stores every tensor contiguous. A state tensor of another dense
layout (the column-major eigenvectors ``torch.linalg.eigh`` returns, which
SPlus keeps as its eigenbasis) then came back row-major, and the resumed
run's matrix products took another kernel path and rounded differently: not
bit-equal to the uninterrupted run. Such a tensor is stored contiguous and
tagged ``{"strided": {"tensor": name, "stride": [...]}}``; decoding rebuilds
it with those strides. Overlapping layouts (an expanded tensor) are stored
as before, contiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["STRIDED_TAG", "dense_stride", "restrided", "strided_record"]

STRIDED_TAG = "strided"


def dense_stride(tensor: torch.Tensor) -> list[int] | None:
    """The strides of a non-contiguous but dense, non-overlapping ``tensor``; else None."""
    if tensor.is_contiguous() or tensor.numel() <= 1:
        return None
    stride = list(tensor.stride())
    return stride if _dense(tuple(tensor.shape), stride) else None


def _dense(shape: tuple[int, ...], stride: list[int]) -> bool:
    """Whether ``stride`` lays ``shape`` out densely, without overlap (a permuted contiguous)."""
    if len(stride) != len(shape) or any(not isinstance(s, int) or s < 1 for s in stride):
        return False
    expected = 1
    for dim in sorted(range(len(shape)), key=lambda d: (stride[d], shape[d])):
        if shape[dim] != 1 and stride[dim] != expected:
            return False
        expected *= shape[dim]
    return True


def strided_record(name: str, stride: list[int]) -> dict[str, Any]:
    """The metadata value of a tensor stored contiguous that had ``stride``."""
    return {STRIDED_TAG: {"tensor": name, "stride": stride}}


def restrided(inner: Any, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The tensor a :func:`strided_record` names, in its strides; None when malformed."""
    if not isinstance(inner, Mapping) or set(inner) != {"tensor", "stride"}:
        return None
    name, stride = inner["tensor"], inner["stride"]
    stored = tensors.get(name) if isinstance(name, str) else None
    if stored is None or not isinstance(stride, list) or not _dense(tuple(stored.shape), stride):
        return None
    return torch.empty_strided(stored.shape, stride, dtype=stored.dtype).copy_(stored)

"""The state precisions' storage costs, torch-free (``optiplug show --params`` uses them).

The codec itself is :mod:`optiplug._state.codec`.
"""

from __future__ import annotations

from ..validators import STATE_PRECISIONS

__all__ = ["BLOCK_SIZES", "CODE_BITS", "STATE_PRECISIONS", "state_bytes_per_element"]

BLOCK_SIZES = {"int8": 256, "int4": 128}
"""Elements per float32 scale: torchao's and Li et al.'s choices (128 for 4-bit: finer
blocks keep an outlier from flattening its neighbours)."""

CODE_BITS = {"int8": 8, "int4": 4}
"""Bits per element of the coded precisions."""


def state_bytes_per_element(precision: str) -> float:
    """Stored bytes per element of a large float32 state tensor (codes and scales).

    Args:
        precision: one of :data:`STATE_PRECISIONS`.

    Returns:
        4.0 for fp32, 2.0 for bf16, ``bits/8 + 4/block`` for int8 (1.015625)
        and int4 (0.53125).
    """
    if precision == "fp32":
        return 4.0
    if precision == "bf16":
        return 2.0
    return CODE_BITS[precision] / 8 + 4 / BLOCK_SIZES[precision]

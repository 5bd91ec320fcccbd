"""The codec's decoding tables: dynamic-exponent and linear codes of 4 and 8 bits.

See :mod:`optiplug._state.codec` for what each table is for.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["dynamic_table", "linear_table"]


def _magnitudes(bits: int, signed: bool, zero: bool) -> list[float]:
    """A dynamic-exponent code's magnitudes, indexed by their code (see :func:`dynamic_table`).

    With ``k`` magnitude bits, index 0 is 0 (or ``10**-k`` without ``zero``)
    and decade ``e`` (values in ``(10**-(e+1), 10**-e]``) takes the
    ``2**(k-1-e)`` indices from ``2**(k-1-e)`` on, ascending.
    """
    k = bits - 1 if signed else bits
    magnitudes = [0.0 if zero else 10.0**-k]
    for e in range(k - 1, -1, -1):
        steps = 2 ** (k - 1 - e)
        magnitudes += [10.0**-e * (0.1 + 0.9 * (j + 1) / steps) for j in range(steps)]
    return magnitudes


@functools.cache
def dynamic_table(bits: int, signed: bool, zero: bool = True) -> tuple[float, ...]:
    """The values of a dynamic-exponent code of ``bits`` bits, sorted: ``table[code]`` decodes.

    With ``k`` magnitude bits (``bits - 1`` when signed), a magnitude in
    decade ``e`` is ``10**-e * (0.1 + 0.9 * (j + 1) / 2**f)`` with
    ``f = k - 1 - e`` fraction bits ``j``: the fewer leading decades, the
    finer the fraction, as in Dettmers et al.'s dynamic tree quantization.
    1.0 is exact, so a block's maximum is too; the smallest non-zero
    magnitude is ``10**-(k-1)`` (``10**-k`` takes zero's place without
    ``zero``). A signed table holds each magnitude with both signs and 0
    twice (its ``2**bits`` codes are one more than its values).

    Args:
        bits: 4 or 8.
        signed: whether negative values have codes.
        zero: whether 0 has a code (a second moment's table has not).

    Returns:
        ``2**bits`` values in ascending order.
    """
    magnitudes = _magnitudes(bits, signed, zero)
    if not signed:
        return tuple(sorted(magnitudes))
    values = magnitudes + [-m for m in magnitudes if m != 0.0]
    return tuple(sorted(values + [0.0] * (2**bits - len(values))))


@functools.cache
def linear_table(bits: int, signed: bool) -> tuple[float, ...]:
    """The values of the linear code of ``bits`` bits, sorted: ``table[code]`` decodes.

    Signed: the magnitudes ``i / top`` (``top = 2**(bits-1) - 1``, ``i =
    0..top``) with both signs, 0 twice, as in :func:`dynamic_table` (0 and
    +/-1 exact). Unsigned: ``(i + 1) / 2**bits`` for ``i = 0..2**bits-1``,
    without zero (Li et al.'s linear map for a second moment).

    Args:
        bits: 4 or 8.
        signed: whether negative values have codes.

    Returns:
        ``2**bits`` values in ascending order.
    """
    if not signed:
        return tuple((i + 1) / 2**bits for i in range(2**bits))
    top = 2 ** (bits - 1) - 1
    magnitudes = [i / top for i in range(top + 1)]
    return (*(-m if m else 0.0 for m in reversed(magnitudes)), *magnitudes)


@functools.cache
def _table(bits: int, signed: bool, device: torch.device, linear: bool = False) -> torch.Tensor:
    """The decoding table (float32, on ``device``); a second moment's has no zero."""
    values = linear_table(bits, signed) if linear else dynamic_table(bits, signed, zero=signed)
    return torch.tensor(values, dtype=torch.float32).to(device)

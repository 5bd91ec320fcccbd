"""The rule that gives a value its code in a dynamic-exponent table, as a few constants per decade.

With ``k`` magnitude bits (``bits - 1`` for a signed table), decade ``e``
(``0 <= e < k``) holds the magnitudes in ``(10**-(e+1), 10**-e]``: the
``S = 2**(k-1-e)`` table values ``10**-e * (0.1 + 0.9 * i / S)`` for
``i = 1..S``, and below them the top of the next decade down, ``i = 0``
(for a signed table's lowest decade that neighbour is 0 instead:
``10**-e * i`` for ``i = 0, 1``). The values of a decade are evenly spaced,
so the nearest one to a magnitude ``m`` of the decade is ``i = round(t)``
with ``t = (m * 10**e - 0.1) * S / 0.9``; its code is ``S - 1 + i``. The
rule computes that code directly as ``round((m * 10**e - shift) * slope)``
with ``slope = S / 0.9`` and ``shift = 0.1 - (S - 1) * 0.9 / S`` (the
code's offset folded in), in float32 as three rounded operations
(multiply, subtract, multiply; no fused multiply-add), rounded half to
even. It is never below -0.5, so no code is negative (below the lowest
decade of the unsigned table it is at least -1/9: code 0). That is the
nearest table value's code except where ``m`` lies within a few float32
ulps of a midpoint, and it needs no search: each path (torch ops on any
device, the C loops on a CPU) computes it with the same float32 operations
on the same constants, so they agree bit for bit.

The decade is the number of the thresholds ``10**-1 .. 10**-(k-1)`` at or
above ``m``. The C loops read it from ``m``'s float32 exponent instead: a
binade spans less than a decade, so the decade of the binade's lowest float
(:attr:`CodeRule.binade_decades`) is ``m``'s or one above it, told apart by
one comparison with that decade's threshold.

A *linear* table (evenly spaced magnitudes, :func:`code_rule` with
``linear=True``) is the same rule with one decade spanning all of [0, 1],
``round((m - shift) * slope)``; the unsigned one (without zero: its lowest
value is one step above zero) adds a second decade below half a step whose
scale is 0, so everything there takes code 0 and no code is negative.
"""

from __future__ import annotations

import functools
import struct

import attrs

LOWEST_EXPONENT = 96
"""The lowest float32 exponent field the C loops tell apart (``2**-31``): every
magnitude below it lies in the lowest decade of any table (``10**-7`` at most)."""

_BINADES = 32
"""Exponent fields ``LOWEST_EXPONENT`` to 127 (1.0), one register of int32 pairs."""


@attrs.frozen
class CodeRule:
    """One table's constants per decade ``e`` (index ``e``; see the module docstring).

    Attributes:
        thresholds: ``10**-e`` in float32: decade ``e`` ends there.
        scales: ``10**e``.
        shifts: ``0.1 - (S - 1) * 0.9 / S`` (0 for a signed table's lowest
            decade, whose ``i = 0`` is code 0).
        slopes: ``S / 0.9`` (1 for a signed table's lowest decade).
        binade_decades: the decade of the lowest float32 of each exponent
            field from :data:`LOWEST_EXPONENT` to 127.
    """

    thresholds: tuple[float, ...]
    scales: tuple[float, ...]
    shifts: tuple[float, ...]
    slopes: tuple[float, ...]
    binade_decades: tuple[int, ...]

    def decade_of(self, magnitude: float) -> int:
        """The decade of a float32 ``magnitude`` in [0, 1]: thresholds at or above it."""
        return sum(magnitude <= threshold for threshold in self.thresholds[1:])


def _float32(value: float) -> float:
    """``value`` rounded to float32, as a Python float."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


@functools.cache
def code_rule(bits: int, signed: bool, linear: bool = False) -> CodeRule:
    """The constants of the ``bits``-bit table (signed: a first moment's; else without zero).

    Args:
        bits: 4 or 8.
        signed: the signed table (with zero) or the unsigned one without zero.
        linear: the linear table of that kind instead of the dynamic one.

    Returns:
        The table's :class:`CodeRule`.
    """
    if linear:
        return _linear_rule(bits, signed)
    k = bits - 1 if signed else bits
    steps = [2 ** (k - 1 - e) for e in range(k)]
    lowest_is_zero = [signed and e == k - 1 for e in range(k)]
    partial = CodeRule(
        thresholds=tuple(_float32(10.0**-e) for e in range(k)),
        scales=tuple(_float32(10.0**e) for e in range(k)),
        shifts=tuple(
            0.0 if zero else _float32(0.1 - (s - 1) * 0.9 / s)
            for s, zero in zip(steps, lowest_is_zero, strict=True)
        ),
        slopes=tuple(
            1.0 if zero else _float32(s / 0.9)
            for s, zero in zip(steps, lowest_is_zero, strict=True)
        ),
        binade_decades=(),
    )
    return _with_binade_decades(partial)


def _linear_rule(bits: int, signed: bool) -> CodeRule:
    """Magnitudes ``i / top`` (signed, ``top = 2**(bits-1) - 1``, code ``i``) or
    ``(i + 1) / 2**bits`` (unsigned, without zero, code ``i``): one decade over [0, 1]
    (``round(m * top)``), or for the unsigned table ``round((m - 1/2**bits) * 2**bits)``
    above ``1/2**(bits+1)`` and a second decade below it whose every magnitude takes
    code 0 (scale 0), so no code is ever negative."""
    if signed:
        top = float(2 ** (bits - 1) - 1)
        partial = CodeRule((1.0,), (1.0,), (0.0,), (top,), ())
    else:
        count = 2**bits
        half_step = _float32(1 / (2 * count))
        partial = CodeRule((1.0, half_step), (1.0, 0.0), (_float32(1 / count), 0.0),
                           (float(count), 1.0), ())  # fmt: skip
    return _with_binade_decades(partial)


def _with_binade_decades(partial: CodeRule) -> CodeRule:
    """``partial`` with the decade of the lowest float32 of each exponent field filled in."""
    lowest_floats = [_float32(2.0 ** (exponent - 127)) for exponent in _exponents()]
    return attrs.evolve(partial, binade_decades=tuple(partial.decade_of(f) for f in lowest_floats))


def _exponents() -> range:
    return range(LOWEST_EXPONENT, LOWEST_EXPONENT + _BINADES)

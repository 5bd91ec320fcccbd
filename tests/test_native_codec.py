"""The state codec's decade rule (the nearest code), and its C loops against its torch ops, bit for bit.

Every table is covered: the dynamic ones and the linear ones (one decade), signed and not.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optiplug._state.code_rule import LOWEST_EXPONENT, code_rule
from optiplug._state.codec import (
    _codes,
    _decode_blocks,
    _encode_blocks,
    _encode_blocks_torch,
    _magnitudes,
    _table,
    linear_table,
)
from optiplug._state.native_codec import native_codec
from optiplug._state.precision import BLOCK_SIZES

KINDS = [(bits, signed, linear) for linear in (False, True) for bits in (8, 4)
         for signed in (True, False)]  # fmt: skip
needs_cc = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler"
)


def _table_magnitudes(bits: int, signed: bool, linear: bool) -> torch.Tensor:
    """The table's magnitudes, ascending, indexed by their code (float32)."""
    if linear:
        values = linear_table(bits, signed)
        values = values[len(values) // 2 :] if signed else values  # the positive half: 0 up
        return torch.tensor(values, dtype=torch.float32)
    return torch.tensor(_magnitudes(bits, signed, zero=signed), dtype=torch.float32)


def _midpoints(bits: int, signed: bool, linear: bool) -> torch.Tensor:
    """The float32 midpoints between consecutive magnitudes of the table."""
    magnitudes = _table_magnitudes(bits, signed, linear)
    return (magnitudes[1:] + magnitudes[:-1]) / 2


def _hard_values(bits: int, signed: bool, linear: bool) -> torch.Tensor:
    """Random magnitudes over eight decades, and every midpoint, power of ten, table value and
    power of two with its float32 neighbours: where a computed code could land one off."""
    generator = torch.Generator().manual_seed(bits * 4 + signed * 2 + linear)
    spread = torch.rand(20_000, generator=generator) * torch.pow(
        10.0, -8 * torch.rand(20_000, generator=generator)
    )
    magnitudes = _table_magnitudes(bits, signed, linear)
    powers = torch.tensor([10.0**-e for e in range(9)], dtype=torch.float32)
    binades = torch.tensor([2.0**-e for e in range(40)], dtype=torch.float32)
    exact = torch.cat(
        [magnitudes, _midpoints(bits, signed, linear), powers, binades, torch.tensor([0.0, 1.0])]
    )
    near = [exact, torch.nextafter(exact, torch.zeros(1)), torch.nextafter(exact, torch.ones(1))]
    values = torch.cat([spread, *near, torch.tensor([1e-45, 1e-38])]).clamp(0, 1)
    return torch.cat([values, -values]) if signed else values


def _distance_to_nearest_midpoint(magnitude: torch.Tensor, midpoints: torch.Tensor) -> torch.Tensor:
    """How far (in float64) each magnitude lies from the closest midpoint."""
    return (magnitude.double()[:, None] - midpoints.double()[None, :]).abs().min(dim=1).values


@pytest.mark.parametrize(("bits", "signed", "linear"), KINDS)
def test_the_code_is_the_nearest_values_away_from_midpoints(bits, signed, linear) -> None:
    """searchsorted(midpoints, |v|, right=True) (the nearest value, a tie going up), except
    within a few ulps of a midpoint, where the rule's float32 arithmetic may take the other."""
    values = _hard_values(bits, signed, linear)
    midpoints = _midpoints(bits, signed, linear)
    nearest = torch.searchsorted(midpoints, values.abs(), right=True).to(torch.int32)
    if signed:
        half = 1 << (bits - 1)
        nearest = torch.where(values < 0, half - 1 - nearest, half + nearest)
    got = _codes(values, bits, signed, linear)
    differ = got != nearest
    assert (got - nearest).abs().max() <= 1
    # t = (m * s - shift) * slope with s = 10**e, in code units: m * s <= 1 and
    # m * s - shift <= 1.8, so the three roundings, and the constants' own (slope's
    # relative 2**-24, shift's 2**-25), leave t within 6.8 * 2**-24 * slope; the float32
    # midpoints are within 2**-24 * m of the exact ones. In m that is 7.8 * 2**-24 / s:
    # with a margin of two, how far from a midpoint the rule may part from the nearest.
    # (A linear table is one decade, s = 1: m - shift <= 1, the same bound.)
    rule = code_rule(bits, signed, linear)
    decades = torch.tensor([rule.decade_of(float(m)) for m in values.abs()[differ]])
    bound = 16 * 2.0**-24 * torch.tensor(rule.thresholds, dtype=torch.float64)[decades]
    assert torch.all(_distance_to_nearest_midpoint(values.abs()[differ], midpoints) <= bound)
    # on the random magnitudes (the first 20,000; the rest crowd the midpoints on purpose)
    # a value within that bound of a midpoint is rare: one in 20,000 here
    assert int(differ[:20_000].sum()) <= 5


@pytest.mark.parametrize(("bits", "signed", "linear"), KINDS)
def test_every_binade_below_one_lies_in_at_most_two_decades(bits, signed, linear) -> None:
    """What the C loops' decade from the exponent relies on, and the decade the rule names."""
    rule = code_rule(bits, signed, linear)
    for offset, decade in enumerate(rule.binade_decades):
        lowest = 2.0 ** (LOWEST_EXPONENT + offset - 127)
        top = float(torch.nextafter(torch.tensor(2 * lowest), torch.zeros(())))
        assert rule.decade_of(min(top, 1.0)) in (decade, decade - 1)
    assert rule.binade_decades[0] == len(rule.thresholds) - 1  # everything lower: the last


@needs_cc
@pytest.mark.parametrize(("bits", "signed", "linear"), KINDS)
def test_the_c_loops_code_the_hard_values_as_the_torch_ops_do(bits, signed, linear) -> None:
    """Their decade comes from the exponent, torch's from the thresholds: the same codes."""
    values = torch.cat(
        [_hard_values(bits, signed, linear), torch.tensor([float("nan"), 3.0, float("inf")])]
    )
    values[0] = 1.0  # the block maxima stay 1 (or NaN, inf), so each value is coded as it is
    block = BLOCK_SIZES["int8" if bits == 8 else "int4"]
    assert native_codec() is not None
    codes, scales = _encode_blocks(values, bits, signed, block, linear)  # the C loops
    expected_codes, expected_scales = _encode_blocks_torch(values, bits, signed, block, linear)
    assert torch.equal(codes, expected_codes)
    torch.testing.assert_close(scales, expected_scales, rtol=0, atol=0, equal_nan=True)


@needs_cc
@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    numel=st.integers(1, 3000),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-30, 1e-6, 1.0, 3e4]),
    special=st.sampled_from(["none", "zero-block", "nan", "inf"]),
)
def test_the_c_loops_write_and_read_what_the_torch_ops_do(kind, numel, seed, scale, special):
    bits, signed, linear = kind
    block = BLOCK_SIZES["int8" if bits == 8 else "int4"]
    generator = torch.Generator().manual_seed(seed)
    value = torch.randn(numel, generator=generator) * scale
    if not signed:
        value = value.abs()
    if special == "zero-block":
        value[:block] = 0.0
    elif special in ("nan", "inf"):
        value[numel // 2] = float(special)
    assert native_codec() is not None
    codes, scales = _encode_blocks(value, bits, signed, block, linear)  # the C loops
    expected_codes, expected_scales = _encode_blocks_torch(value, bits, signed, block, linear)
    torch.testing.assert_close(scales, expected_scales, rtol=0, atol=0, equal_nan=True)
    if special not in ("nan", "inf"):  # a non-finite block's codes are undefined; its scale is not
        assert torch.equal(codes, expected_codes)
        decoded = _decode_blocks(codes, scales, bits, signed, numel, block, linear)
        unpacked = torch.stack((codes & 0xF, codes >> 4), dim=1).reshape(-1) if bits == 4 else codes
        values = _table(bits, signed, torch.device("cpu"), linear)
        reference = values[unpacked.int()].view(scales.numel(), -1) * scales.unsqueeze(1)
        assert torch.equal(decoded, reference.reshape(-1)[:numel])

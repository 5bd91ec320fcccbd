"""The state codec's nearest-code rule, and its C loops against its torch ops, bit for bit."""

from __future__ import annotations

import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optiplug._state.codec import (
    _codes,
    _decode_blocks,
    _encode_blocks,
    _encode_blocks_torch,
    _magnitudes,
    _table,
    code_tables,
)
from optiplug._state.native_codec import native_codec
from optiplug._state.precision import BLOCK_SIZES

KINDS = [(8, True), (8, False), (4, True), (4, False)]
needs_cc = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler"
)


def _hard_values(bits: int, signed: bool) -> torch.Tensor:
    """Random magnitudes over eight decades, and every midpoint, power of ten and table value
    with its float32 neighbours: where a computed code could land one off."""
    generator = torch.Generator().manual_seed(bits * 2 + signed)
    spread = torch.rand(20_000, generator=generator) * torch.pow(
        10.0, -8 * torch.rand(20_000, generator=generator)
    )
    magnitudes = torch.tensor(_magnitudes(bits, signed, zero=signed), dtype=torch.float32)
    midpoints = code_tables(bits, signed, torch.device("cpu"))[0][:-1]
    powers = torch.tensor([10.0**-e for e in range(9)], dtype=torch.float32)
    exact = torch.cat([magnitudes, midpoints, powers, torch.tensor([0.0, 1.0])])
    near = [exact, torch.nextafter(exact, torch.zeros(1)), torch.nextafter(exact, torch.ones(1))]
    values = torch.cat([spread, *near]).clamp(0, 1)
    return torch.cat([values, -values]) if signed else values


@pytest.mark.parametrize(("bits", "signed"), KINDS)
def test_the_code_is_the_count_of_midpoints_at_or_below_the_magnitude(bits, signed) -> None:
    """Exactly searchsorted(midpoints, |v|, right=True): the nearest value, a tie going up."""
    values = _hard_values(bits, signed)
    midpoints = code_tables(bits, signed, torch.device("cpu"))[0][:-1]
    index = torch.searchsorted(midpoints, values.abs(), right=True).to(torch.int32)
    if signed:
        half = 1 << (bits - 1)
        index = torch.where(values < 0, half - 1 - index, half + index)
    assert torch.equal(_codes(values, bits, signed), index)


@pytest.mark.parametrize(("bits", "signed"), KINDS)
def test_no_bucket_of_the_lookup_holds_two_midpoints(bits, signed) -> None:
    midpoints, _ = code_tables(bits, signed, torch.device("cpu"))
    buckets = midpoints[:-1].view(torch.int32) >> 16
    assert int(torch.bincount(buckets).max()) == 1


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
    bits, signed = kind
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
    codes, scales = _encode_blocks(value, bits, signed, block)  # the C loops
    expected_codes, expected_scales = _encode_blocks_torch(value, bits, signed, block)
    torch.testing.assert_close(scales, expected_scales, rtol=0, atol=0, equal_nan=True)
    if special not in ("nan", "inf"):  # a non-finite block's codes are undefined; its scale is not
        assert torch.equal(codes, expected_codes)
        decoded = _decode_blocks(codes, scales, bits, signed, numel)
        unpacked = torch.stack((codes & 0xF, codes >> 4), dim=1).reshape(-1) if bits == 4 else codes
        values = _table(bits, signed, torch.device("cpu"))
        reference = values[unpacked.int()].view(scales.numel(), -1) * scales.unsqueeze(1)
        assert torch.equal(decoded, reference.reshape(-1)[:numel])

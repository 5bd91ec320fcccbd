"""Blockwise encoding of float32 values into codes and per-block scales, and bf16 rounding.

The torch path runs on any device; on a CPU the C loops of
:mod:`.native_codec` compute the same codes, bit for bit.
"""

from __future__ import annotations

import functools

import torch

from .code_rule import code_rule
from .native_codec import NativeCodec, native_codec
from .tables import _table

__all__ = ["CHUNK", "seed_term"]

CHUNK = 1 << 18
"""Elements encoded at a time: the temporaries of a chunk (1 MB each) stay in cache,
which made encoding 2.4x faster than whole tensors on a 2-core CPU."""


def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    """``flat`` zero-padded to whole blocks, as ``(blocks, block)``."""
    padding = (-flat.numel()) % block
    if padding:
        flat = torch.nn.functional.pad(flat, (0, padding))
    return flat.view(-1, block)


@functools.cache
def _rule_tensors(
    bits: int, signed: bool, linear: bool, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """:func:`code_rule`'s thresholds, scales, shifts and slopes as float32 tensors on ``device``."""
    rule = code_rule(bits, signed, linear)
    return tuple(
        torch.tensor(values, dtype=torch.float32, device=device)
        for values in (rule.thresholds, rule.scales, rule.shifts, rule.slopes)
    )


def _codes(normalized: torch.Tensor, bits: int, signed: bool, linear: bool = False) -> torch.Tensor:
    """The code of each value in [-1, 1] by the table's decade rule (int32).

    A magnitude's decade is the number of thresholds at or above it; its
    index is ``round((m * scale - shift) * slope)`` in float32 with that
    decade's constants (:mod:`.code_rule`): the nearest table value's except
    within a few ulps of a midpoint. A magnitude above 1, inf
    or NaN reads 1. A negative value takes the mirrored code. ``linear``:
    the linear table's rule (one decade). The C loops of
    :mod:`.native_codec` compute the same, bit for bit.
    """
    magnitude = normalized.abs()
    magnitude = torch.where(magnitude <= 1.0, magnitude, 1.0)
    thresholds, scales, shifts, slopes = _rule_tensors(bits, signed, linear, magnitude.device)
    decade = torch.zeros(magnitude.shape, dtype=torch.int64, device=magnitude.device)
    for threshold in thresholds[1:]:
        decade += magnitude <= threshold
    index = torch.round((magnitude * scales[decade] - shifts[decade]) * slopes[decade])
    index = index.to(torch.int32)
    if not signed:
        return index
    half = 1 << (bits - 1)  # sorted: the negatives, 0 twice, the positives
    return torch.where(normalized < 0, (half - 1) - index, half + index)


def _encode_blocks(
    value: torch.Tensor, bits: int, signed: bool, block: int, linear: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (uint8; int4 packed two per byte) and per-block absolute maxima of ``value``.

    ``linear`` codes by :func:`linear_table`, otherwise by the dynamic table.
    """
    flat = value.detach().reshape(-1).float().contiguous()
    codec = _native_for(flat)
    if codec is None:
        return _encode_blocks_torch(flat, bits, signed, block, linear)
    blocks = -(-flat.numel() // block)
    codes = torch.empty(blocks * block * bits // 8, dtype=torch.uint8)
    scales = torch.empty(blocks, dtype=torch.float32)
    codec.encode(flat, bits, signed, block, (codes, scales), linear)
    return codes, scales


def _encode_blocks_torch(
    flat: torch.Tensor, bits: int, signed: bool, block: int, linear: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_encode_blocks` in torch ops (any device)."""
    blocks = _blocks(flat, block)
    scales = blocks.abs().amax(dim=1)
    inverses = scales.clamp_min(torch.finfo(torch.float32).tiny).reciprocal().unsqueeze(1)
    codes = torch.empty(blocks.shape, dtype=torch.uint8, device=blocks.device)
    rows = max(1, CHUNK // block)  # a chunk's temporaries stay in cache
    for start in range(0, blocks.shape[0], rows):
        part = slice(start, start + rows)
        codes[part] = _codes(blocks[part] * inverses[part], bits, signed, linear)
    flat_codes = codes.reshape(-1)
    if bits == 4:
        flat_codes = flat_codes[0::2] | (flat_codes[1::2] << 4)
    return flat_codes, scales


def _decode_blocks(
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    signed: bool,
    numel: int,
    block: int,
    linear: bool = False,
) -> torch.Tensor:
    """The float32 values :func:`_encode_blocks` stored (flat, ``numel`` elements).

    Raises:
        ValueError: ``codes`` or ``scales`` of another dtype or size than
            ``numel`` elements in blocks of ``block`` take: nothing is read.
    """
    _check_coded_parts(codes, scales, bits, block, numel)
    values = _table(bits, signed, codes.device, linear)
    codec = _native_for(codes)
    if codec is not None and codes.is_contiguous() and scales.is_contiguous():
        out = torch.empty(numel, dtype=torch.float32)
        codec.decode(codes, scales, bits, block, values, out)
        return out
    if bits == 4:
        codes = torch.stack((codes & 0xF, codes >> 4), dim=1).reshape(-1)
    decoded = values[codes.int()].view(scales.numel(), -1) * scales.unsqueeze(1)
    return decoded.reshape(-1)[:numel]


def _check_coded_parts(
    codes: torch.Tensor, scales: torch.Tensor, bits: int, block: int, numel: int
) -> None:
    """Raise ``ValueError`` unless ``codes``/``scales`` are what ``numel`` elements store."""
    blocks = -(-numel // block)
    code_bytes = blocks * block * bits // 8
    if (
        codes.dtype == torch.uint8
        and codes.numel() == code_bytes
        and scales.dtype == torch.float32
        and scales.numel() == blocks
    ):
        return
    raise ValueError(
        f"a {bits}-bit QuantizedState of {numel} elements stores {code_bytes} uint8 code "
        f"bytes and {blocks} float32 scales; it holds {codes.numel()} {codes.dtype} codes "
        f"and {scales.numel()} {scales.dtype} scales"
    )


def _native_for(tensor: torch.Tensor) -> NativeCodec | None:
    """The C codec when ``tensor`` is on a CPU and the codec is built, else None.

    Never waits for the build: until it is loaded (a background thread builds
    it) the torch ops run, which write the same codes bit for bit.
    """
    if tensor.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return native_codec(wait=False)


def _stochastic_bf16(value: torch.Tensor, seed: int) -> torch.Tensor:
    """``value`` (float32) rounded to bfloat16 stochastically, with bits hashed from ``seed``.

    The 16 random bits added below the kept ones are a hash of the element's
    index and ``seed`` (MurmurHash3's 32-bit finaliser), cheaper than a
    generator's draw and the same on every device.
    """
    bits = value.detach().float().contiguous().view(torch.int32)
    noise = _hashed(torch.arange(bits.numel(), dtype=torch.int32, device=bits.device), seed)
    rounded = (bits + noise.view(bits.shape)) & -65536  # the low 16 bits cleared: exact in bf16
    finite = torch.isfinite(value)
    return torch.where(finite, rounded.view(torch.float32), value.float()).to(torch.bfloat16)


_GOLDEN = -1640531535  # 0x9E3779B1 as an int32
_MIX = (-2048144789, -1028477387)  # MurmurHash3's fmix32 constants, as int32


def seed_term(seed: int) -> int:
    """What a write count ``seed`` adds to every hashed index (below 2**31)."""
    return seed * 0x27D4EB2F & 0x7FFFFFFF


def _hashed(index: torch.Tensor, seed: int) -> torch.Tensor:
    """16 well-mixed bits (0..65535) of each int32 ``index`` and ``seed``."""
    h = index * _GOLDEN + seed_term(seed)
    h = h ^ (h >> 16)
    h = h * _MIX[0]
    h = h ^ (h >> 13)
    h = h * _MIX[1]
    return (h ^ (h >> 16)) & 0xFFFF

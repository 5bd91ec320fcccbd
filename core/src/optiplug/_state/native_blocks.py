"""The codec's block loops in C, for a C step on low-precision state.

A C step on int8, int4 or bf16 state (an optimizer plugin's own, or one
:func:`~optiplug.base.build_state_kernel` generates) updates each block of
the codec (256 elements for int8, 128 for int4, 256 for bf16) in a small
float buffer: :data:`CODEC_C_SOURCE` gives the loops that read and write the
codec's layout with its own tables and bits (``decode``, ``block_scale``,
``encode``, ``bf16_rounded``), so the codes a step writes are the codec's by
construction. Everything a block needs stays in L1, and each loop over a
block vectorizes; with AVX-512 the int8 and int4 tables are looked up in
registers (permutes) rather than gathered.

The codes follow the codec's decade rule exactly (:mod:`.code_rule`, the C
of :data:`~optiplug._state.native_codec.RULE_SOURCE`). bf16 values are
decoded by a shift and rounded stochastically on write with the codec's
hashed bits (:func:`~optiplug._state.codec.seed_term`), the same bits its
torch path draws for that write.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import torch

from .._native import NativeLibrary, library_when_ready
from .codec import QuantizedState, _table, group_precision, seed_term
from .native_codec import RULE_SOURCE, RuleStructure, rule_structure
from .precision import BLOCK_SIZES, CODE_BITS

__all__ = [
    "CODEC_C_SOURCE",
    "CodecTables",
    "c_library_or_none",
    "c_step_applies",
    "codec_tables",
    "seed_term",
]

CODEC_C_SOURCE = (
    RULE_SOURCE
    + r"""
typedef struct {
  const float *table;         /* the decoded values, 2**bits */
  const uint8_t *planes;      /* 8 bits: byte k of every value, then byte k + 1: 4 x 256 bytes */
  const optiplug_rule *rule;  /* the code of a value (see code_rule) */
  int32_t half;               /* a signed table's first non-negative code; 0: unsigned */
} optiplug_codes;

/* out[j] = table[index[j]] * scale for a 16-value table, from registers where there are
   vector permutes (a gather costs more than the whole lookup). */
static inline void lookup16(const uint8_t *restrict index, int block, float scale,
                            const float *restrict table, float *restrict out) {
#if defined(__AVX512F__)
  const __m512 values = _mm512_loadu_ps(table), by = _mm512_set1_ps(scale);
  for (int j = 0; j < block; j += 16) {
    const __m512i at = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(index + j)));
    _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_permutexvar_ps(at, values), by));
  }
#elif defined(__AVX2__)
  const __m256 low = _mm256_loadu_ps(table), high = _mm256_loadu_ps(table + 8);
  const __m256 by = _mm256_set1_ps(scale);
  for (int j = 0; j < block; j += 8) {
    const __m256i at = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(index + j)));
    const __m256 upper = _mm256_castsi256_ps(_mm256_slli_epi32(at, 28)); /* bit 3 as the sign */
    const __m256 found = _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, at),
                                          _mm256_permutevar8x32_ps(high, at), upper);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(found, by));
  }
#else
  for (int j = 0; j < block; j++) out[j] = table[index[j]] * scale;
#endif
}

/* out[j] = table[codes[j]] * scale for a 256-value table: with AVX-512, from registers
   (eight two-register permutes by the low 5 bits, then the high 3 bits pick), since GCC
   emulates a gather with scalar loads here. */
static inline void lookup256(const uint8_t *restrict codes, int block, float scale,
                             const float *restrict table, float *restrict out) {
#if defined(__AVX512F__)
  __m512 t[16];
  for (int k = 0; k < 16; k++) t[k] = _mm512_loadu_ps(table + 16 * k);
  const __m512 by = _mm512_set1_ps(scale);
  for (int j = 0; j < block; j += 16) {
    const __m512i at = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + j)));
    __m512 part[8];
    for (int k = 0; k < 8; k++) part[k] = _mm512_permutex2var_ps(t[2 * k], at, t[2 * k + 1]);
    for (int bit = 5, width = 8; bit < 8; bit++, width /= 2) {
      const __mmask16 high = _mm512_test_epi32_mask(at, _mm512_set1_epi32(1 << bit));
      for (int k = 0; k < width / 2; k++)
        part[k] = _mm512_mask_blend_ps(high, part[2 * k], part[2 * k + 1]);
    }
    _mm512_storeu_ps(out + j, _mm512_mul_ps(part[0], by));
  }
#else
  for (int j = 0; j < block; j++) out[j] = table[codes[j]] * scale;
#endif
}

#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
/* lookup256 for 64 codes at a time (block a multiple of 64): each byte of the values is
   looked up in its own 256-byte plane by byte permutes, and the four bytes interleaved. The
   codes are first put where the interleaving (within 128-bit lanes) reads them in order. */
static inline void lookup256_bytes(const uint8_t *restrict codes, int block, float scale,
                                   const uint8_t *restrict planes, float *restrict out) {
  __m512i t[16];
  for (int k = 0; k < 16; k++) t[k] = _mm512_loadu_si512(planes + 64 * k);
  uint8_t order[64];
  for (int q = 0; q < 64; q++) order[q] = (uint8_t)(16 * ((q >> 2) & 3) + 4 * (q >> 4) + (q & 3));
  const __m512i arranged = _mm512_loadu_si512(order);
  const __m512 by = _mm512_set1_ps(scale);
  for (int j = 0; j < block; j += 64) {
    const __m512i at = _mm512_permutexvar_epi8(arranged, _mm512_loadu_si512(codes + j));
    const __mmask64 high = _mm512_movepi8_mask(at);
    __m512i b[4];
    for (int k = 0; k < 4; k++)
      b[k] = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(t[4 * k], at, t[4 * k + 1]),
                                    _mm512_permutex2var_epi8(t[4 * k + 2], at, t[4 * k + 3]));
    const __m512i low01 = _mm512_unpacklo_epi8(b[0], b[1]), high01 = _mm512_unpackhi_epi8(b[0], b[1]);
    const __m512i low23 = _mm512_unpacklo_epi8(b[2], b[3]), high23 = _mm512_unpackhi_epi8(b[2], b[3]);
    const __m512i value[4] = {_mm512_unpacklo_epi16(low01, low23), _mm512_unpackhi_epi16(low01, low23),
                              _mm512_unpacklo_epi16(high01, high23),
                              _mm512_unpackhi_epi16(high01, high23)};
    for (int k = 0; k < 4; k++)
      _mm512_storeu_ps(out + j + 16 * k, _mm512_mul_ps(_mm512_castsi512_ps(value[k]), by));
  }
}
#endif

static inline void decode(const uint8_t *restrict codes, int bits, int block, float scale,
                          const optiplug_codes *c, float *restrict out) {
  const float *restrict table = c->table;
  if (bits == 8) {
#if defined(__AVX512VBMI__) && defined(__AVX512BW__)
    if (block % 64 == 0) {
      lookup256_bytes(codes, block, scale, c->planes, out);
      return;
    }
#endif
    lookup256(codes, block, scale, table, out);
  } else {
    uint8_t nibbles[256];
    for (int j = 0; j < block / 2; j++) {
      nibbles[2 * j] = codes[j] & 15;
      nibbles[2 * j + 1] = codes[j] >> 4;
    }
    lookup16(nibbles, block, scale, table, out);
  }
}

/* A block scale from the largest magnitude's bits: NaN if they are a NaN's. */
static inline float scale_of_top(uint32_t top) { return top > 0x7f800000u ? NAN : float_of(top); }

/* The block's scale: its absolute maximum, NaN if it holds one (by the bits: |x| orders as
   an unsigned integer and every NaN is above inf). */
static inline float block_scale(const float *restrict x, int block) {
  uint32_t top = 0;
  for (int j = 0; j < block; j++) {
    const uint32_t u = bits_of(x[j]) & 0x7fffffffu;
    top = u > top ? u : top;
  }
  return scale_of_top(top);
}

static inline void encode(const float *restrict x, int bits, int block, float scale,
                          const optiplug_codes *c, uint8_t *restrict codes) {
  const float divisor = scale != scale ? scale : (scale < FLT_MIN ? FLT_MIN : scale);
  uint8_t local[256];
  block_codes(x, block, 1.0f / divisor, c->rule, c->half, local);
  if (bits == 8) {
    memcpy(codes, local, (size_t)block);
  } else {
    for (int j = 0; j < block / 2; j++)
      codes[j] = (uint8_t)(local[2 * j] | (local[2 * j + 1] << 4));
  }
}

/* bf16 state: 16 bits hashed from the element's index and the slot's write count, added
   below the kept ones before truncating (the codec's stochastic rounding, bit for bit:
   MurmurHash3's finaliser in int32 arithmetic, shifts arithmetic as torch's are). */
static inline uint32_t noise16(uint32_t index, uint32_t seed_term) {
  uint32_t h = index * 0x9E3779B1u + seed_term;
  h ^= (uint32_t)((int32_t)h >> 16);
  h *= 0x85EBCA6Bu;
  h ^= (uint32_t)((int32_t)h >> 13);
  h *= 0xC2B2AE35u;
  return (h ^ (h >> 16)) & 0xffffu;
}

static inline uint16_t bf16_rounded(float x, uint32_t index, uint32_t seed_term) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7f800000u) == 0x7f800000u)  /* inf keeps its bits, NaN is a quiet NaN */
    return (u & 0x007fffffu) ? (uint16_t)0x7fc0u : (uint16_t)(u >> 16);
  return (uint16_t)((u + noise16(index, seed_term)) >> 16);
}

"""
)
"""The codec's C: the ``optiplug_codes`` tables of a slot and the static block loops
``decode(codes, bits, block, scale, tables, out)``, ``block_scale(x, block)``,
``encode(x, bits, block, scale, tables, codes)`` and ``bf16_rounded(x, index,
seed)``; a C step's source starts with it."""


class _Codes(ctypes.Structure):
    _fields_ = [
        ("table", ctypes.c_void_p),
        ("planes", ctypes.c_void_p),
        ("rule", ctypes.POINTER(RuleStructure)),
        ("half", ctypes.c_int32),
    ]


class CodecTables:
    """One code's tables for the C loops, kept alive with the structure pointing at them.

    Attributes:
        bits: 8 or 4 (the codes' width), or 16 for bf16 (decoded by a shift:
            the int8 tables only fill the pointer).
        block: the codec's block size in that precision.
        codes: the ``optiplug_codes`` structure the C loops read.
    """

    def __init__(self, precision: str, signed: bool, linear: bool = False) -> None:
        self.bits = CODE_BITS.get(precision, 16)
        self.block = BLOCK_SIZES.get(precision, 256)
        bits = CODE_BITS.get(precision, 8)
        self.table = _table(bits, signed, torch.device("cpu"), linear).contiguous()
        # byte k of every value, for k = 0..3 (little-endian: the low byte first)
        self.planes = self.table.view(torch.uint8).view(-1, 4).t().contiguous()
        self.rule = rule_structure(bits, signed, linear)
        half = 1 << (bits - 1) if signed else 0
        pointers = self.table.data_ptr(), self.planes.data_ptr()
        self.codes = _Codes(*pointers, ctypes.pointer(self.rule), half)

    @property
    def address(self) -> int:
        """The address of :attr:`codes`, what a ``const optiplug_codes *`` argument takes."""
        return ctypes.addressof(self.codes)


@functools.cache
def codec_tables(precision: str, signed: bool, linear: bool = False) -> CodecTables:
    """The tables of a slot stored in ``precision`` (cached).

    Args:
        precision: ``"int8"``, ``"int4"`` or ``"bf16"``.
        signed: the signed table (a first moment) or the unsigned one.
        linear: the linear table of that kind instead of the dynamic one.

    Returns:
        The tables, with the bits and block size of ``precision``.
    """
    return CodecTables(precision, signed, linear)


def c_library_or_none(source: str, name: str, *, wait: bool = True) -> NativeLibrary | None:
    """:func:`~optiplug.base.build_c_library`, or None where it cannot be built (yet).

    A failed build warns once per process (with what running without the C
    kernels costs); ``OPTIPLUG_NATIVE=0`` returns None without a warning.
    A training step passes ``wait=False``: the first call then starts the
    build in a background thread and returns None until it is loaded, so
    the step runs its torch ops meanwhile and never waits for the compiler
    (:func:`optiplug._native.library_when_ready`).

    Args:
        source: the C source.
        name: names the built library.
        wait: wait for the build (True), or return None while it runs.
    """
    return library_when_ready(source, name=name, wait=wait)


def c_step_applies(
    param: torch.Tensor,
    grad: torch.Tensor,
    slots: Sequence[Any],
    precision: str,
    signed: Sequence[bool] | None = None,
) -> bool:
    """Whether a C step over the codec's blocks can take these tensors.

    ``param`` and ``grad`` must be contiguous dense float32 CPU tensors of
    one shape, and every slot a :class:`~optiplug.base.QuantizedState` of
    ``param``'s shape stored in ``precision`` as the codec lays it out.

    Args:
        param: the parameter.
        grad: its gradient.
        slots: the stored slots.
        precision: ``"int8"``, ``"int4"`` or ``"bf16"`` (anything else: False).
        signed: for int8 and int4, the table each slot must use (signed or
            not), in ``slots`` order; None takes each slot's own.
    """
    if precision not in (*CODE_BITS, "bf16") or not _dense_cpu_float(param, grad):
        return False
    wanted = [None] * len(slots) if signed is None else list(signed)
    return len(wanted) == len(slots) and all(
        isinstance(slot, QuantizedState)
        and _fits(slot, precision, slot.signed if sign is None else sign, param)
        for slot, sign in zip(slots, wanted, strict=True)
    )


def _dense_cpu_float(param: torch.Tensor, grad: torch.Tensor) -> bool:
    """Whether ``param`` and ``grad`` are contiguous dense float32 CPU tensors of one shape."""
    return (
        all(
            tensor.device.type == "cpu"
            and tensor.dtype == torch.float32
            and tensor.layout == torch.strided
            and tensor.is_contiguous()
            and type(tensor) in (torch.Tensor, torch.nn.Parameter)
            for tensor in (param, grad)
        )
        and grad.shape == param.shape
    )


def _fits(slot: QuantizedState, precision: str, signed: bool, param: torch.Tensor) -> bool:
    """Whether ``slot`` is ``param``'s moment stored in ``precision`` with the ``signed`` table."""
    if precision == "bf16":
        return (
            slot.precision == precision
            and slot.shape == param.shape
            and slot.dtype == torch.float32
            and slot.codes.device.type == "cpu"
            and slot.codes.dtype == torch.bfloat16
            and slot.codes.is_contiguous()
            and slot.codes.numel() == param.numel()
        )
    block = BLOCK_SIZES[precision]
    blocks = -(-param.numel() // block)
    return (
        slot.precision == precision
        and slot.signed == signed
        and slot.shape == param.shape
        and slot.dtype == torch.float32
        and slot.factors is None  # the C loops read codes and scales only
        and slot.codes.device.type == "cpu"
        and slot.codes.dtype == torch.uint8
        and slot.codes.is_contiguous()
        and slot.codes.numel() == blocks * block * CODE_BITS[precision] // 8
        and slot.scales.dtype == torch.float32
        and slot.scales.is_contiguous()
        and slot.scales.numel() == blocks
    )


# These are public as optiplug.base.* (the plugin toolkit); report that home.
for _public in (c_library_or_none, c_step_applies, codec_tables, seed_term, group_precision):
    _public.__module__ = "optiplug.base"

"""The codec's blockwise encoding and decoding as C loops, for float32 state on a CPU.

The same arithmetic as the torch path of :mod:`.codec` on the same inputs:
the block's absolute maximum (NaN if the block holds one), the value
multiplied by its float32 reciprocal, the code by the table's decade rule
(:mod:`.code_rule`, the C of :data:`RULE_SOURCE`), int4 codes packed two per
byte, low nibble first; decoding multiplies the table value by the block's
scale in float32. So either path writes the same codes and reads the same
values, bit for bit, and a checkpoint moves between them. One pass reads
the state and writes the codes (a block of 256 stays in L1), where the
torch path makes about a dozen passes; OpenMP splits the blocks over
torch's intra-op thread count when the compiler has it. Built by
:func:`optiplug._native.build_c_library` on first use.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from .._native import NativeLibrary, library_when_ready
from .code_rule import LOWEST_EXPONENT, code_rule

__all__ = ["RULE_SOURCE", "NativeCodec", "RuleStructure", "native_codec", "rule_structure"]

MAX_BLOCK = 256
"""The largest block the C loops take (their per-block buffer)."""

RULE_SOURCE = (
    f"#define LOWEST_EXPONENT {LOWEST_EXPONENT}\n"
    + r"""
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

typedef struct {
  int32_t binade_decades[32];  /* the decade of the lowest float32 of exponents from LOWEST_EXPONENT */
  float thresholds[16], scales[16], shifts[16], slopes[16];
} optiplug_rule;

static inline uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
static inline float float_of(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }

/* The table index of |value| by the decade rule: the magnitude clamped to 1 (NaN reads 1),
   its decade from its exponent and one comparison, then round((m * scale - shift) * slope)
   in float32, rounded half to even (never below -0.5). */
static inline int32_t magnitude_index(float value, const optiplug_rule *r) {
  uint32_t u = bits_of(value) & 0x7fffffffu;
  u = u < 0x3f800000u ? u : 0x3f800000u;
  const float m = float_of(u);
  const int32_t exponent = (int32_t)(u >> 23);
  int32_t e = r->binade_decades[exponent < LOWEST_EXPONENT ? 0 : exponent - LOWEST_EXPONENT];
  e -= m > r->thresholds[e];
  return (int32_t)nearbyintf((m * r->scales[e] - r->shifts[e]) * r->slopes[e]);
}

/* The code of value: its magnitude's index, mirrored below half for a negative value of a
   signed table (half 0: unsigned). */
static inline int32_t code_of(float value, const optiplug_rule *r, int32_t half) {
  const int32_t index = magnitude_index(value, r);
  return half == 0 ? index : (value < 0 ? half - 1 - index : half + index);
}

#if defined(__AVX512F__)
/* code_of for 16 values, the tables read from registers by permutes. */
static inline __m512i codes16(__m512 value, const optiplug_rule *r, int32_t half) {
  const __m512i u = _mm512_min_epu32(
      _mm512_and_si512(_mm512_castps_si512(value), _mm512_set1_epi32(0x7fffffff)),
      _mm512_set1_epi32(0x3f800000));
  const __m512 m = _mm512_castsi512_ps(u);
  const __m512i lowest = _mm512_set1_epi32(LOWEST_EXPONENT);
  const __m512i binade =
      _mm512_sub_epi32(_mm512_max_epi32(_mm512_srli_epi32(u, 23), lowest), lowest);
  const __m512i e0 = _mm512_permutex2var_epi32(_mm512_loadu_si512(r->binade_decades), binade,
                                               _mm512_loadu_si512(r->binade_decades + 16));
  const __mmask16 above = _mm512_cmp_ps_mask(
      m, _mm512_permutexvar_ps(e0, _mm512_loadu_ps(r->thresholds)), _CMP_GT_OQ);
  const __m512i e = _mm512_mask_sub_epi32(e0, above, e0, _mm512_set1_epi32(1));
  const __m512 scaled = _mm512_mul_ps(m, _mm512_permutexvar_ps(e, _mm512_loadu_ps(r->scales)));
  const __m512 shifted = _mm512_sub_ps(scaled, _mm512_permutexvar_ps(e, _mm512_loadu_ps(r->shifts)));
  const __m512 t = _mm512_mul_ps(shifted, _mm512_permutexvar_ps(e, _mm512_loadu_ps(r->slopes)));
  const __m512i index = _mm512_cvtps_epi32(t);
  if (half == 0) return index;
  const __mmask16 negative = _mm512_cmp_ps_mask(value, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_sub_epi32(_mm512_add_epi32(_mm512_set1_epi32(half), index), negative,
                               _mm512_set1_epi32(half - 1), index);
}
#endif

/* The codes of a block of values multiplied by inverse, one byte each. */
static inline void block_codes(const float *restrict x, int64_t block, float inverse,
                               const optiplug_rule *r, int32_t half, uint8_t *restrict out) {
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512 by = _mm512_set1_ps(inverse);
  for (; j + 16 <= block; j += 16)
    _mm_storeu_si128((__m128i *)(out + j),
                     _mm512_cvtepi32_epi8(codes16(_mm512_mul_ps(_mm512_loadu_ps(x + j), by), r, half)));
#endif
  for (; j < block; j++) out[j] = (uint8_t)code_of(x[j] * inverse, r, half);
}
"""
)
"""The C of the decade rule (:mod:`.code_rule`), shared by every C loop that encodes."""

_SOURCE = (
    RULE_SOURCE
    + r"""
void optiplug_encode_blocks(const float *restrict x, int64_t n, int64_t block, int bits,
                            int is_signed, const optiplug_rule *rule, uint8_t *restrict codes,
                            float *restrict scales, int threads) {
  const int64_t blocks = (n + block - 1) / block;
  const int32_t half = is_signed ? 1 << (bits - 1) : 0;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * block;
    const int64_t count = n - start < block ? n - start : block;
    float values[256];
    float top = 0.0f;
    int nan = 0;
    for (int64_t j = 0; j < block; j++) {
      values[j] = j < count ? x[start + j] : 0.0f;
      const float a = fabsf(values[j]);
      top = a > top ? a : top;
      nan |= a != a;
    }
    const float scale = nan ? NAN : top;
    const float divisor = nan ? scale : (scale < FLT_MIN ? FLT_MIN : scale);
    uint8_t local[256];
    block_codes(values, block, 1.0f / divisor, rule, half, local);
    if (bits == 8) {
      memcpy(codes + start, local, (size_t)block);
    } else {
      for (int64_t j = 0; j < block / 2; j++)
        codes[start / 2 + j] = (uint8_t)(local[2 * j] | (local[2 * j + 1] << 4));
    }
    scales[b] = scale;
  }
}

void optiplug_decode_blocks(const uint8_t *restrict codes, const float *restrict scales,
                            int64_t n, int64_t block, int bits, const float *restrict table,
                            float *restrict out, int threads) {
  const int64_t blocks = (n + block - 1) / block;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * block;
    const int64_t count = n - start < block ? n - start : block;
    const float scale = scales[b];
    if (bits == 8) {
      for (int64_t j = 0; j < count; j++) out[start + j] = table[codes[start + j]] * scale;
    } else {
      for (int64_t j = 0; j < count; j++) {
        const int64_t i = start + j;
        out[i] = table[(codes[i >> 1] >> (4 * (i & 1))) & 15] * scale;
      }
    }
  }
}
"""
)

_POINTER = ctypes.c_void_p
_ENCODE_ARGS: list[Any] = [_POINTER, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int, _POINTER,
                _POINTER, _POINTER, ctypes.c_int]  # fmt: skip


class RuleStructure(ctypes.Structure):
    """:class:`~optiplug._state.code_rule.CodeRule` as the C loops read it (``optiplug_rule``)."""

    _fields_ = [
        ("binade_decades", ctypes.c_int32 * 32),
        *((name, ctypes.c_float * 16) for name in ("thresholds", "scales", "shifts", "slopes")),
    ]


@functools.cache
def rule_structure(bits: int, signed: bool, linear: bool = False) -> RuleStructure:
    """The cached C structure of the ``bits``-bit table's rule (see :func:`code_rule`)."""
    rule = code_rule(bits, signed, linear)
    return RuleStructure(*(
        kind(*values) for kind, values in zip(
            (field[1] for field in RuleStructure._fields_),
            (rule.binade_decades, rule.thresholds, rule.scales, rule.shifts, rule.slopes),
            strict=True,
        )
    ))  # fmt: skip


_DECODE_ARGS: list[Any] = [_POINTER, _POINTER, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, _POINTER,
                _POINTER, ctypes.c_int]  # fmt: skip


class NativeCodec:
    """The loaded C functions (see the module docstring)."""

    def __init__(self, library: NativeLibrary) -> None:
        self._encode = library.function("optiplug_encode_blocks", _ENCODE_ARGS)
        self._decode = library.function("optiplug_decode_blocks", _DECODE_ARGS)

    def encode(
        self,
        flat: torch.Tensor,
        bits: int,
        signed: bool,
        block: int,
        out: tuple[torch.Tensor, torch.Tensor],
        linear: bool = False,
    ) -> None:
        """Encode contiguous float32 ``flat`` into ``out`` = (codes, scales), both preallocated.

        ``linear``: by the linear table's rule instead of the dynamic table's.
        """
        codes, scales = out
        self._encode(
            flat.data_ptr(), flat.numel(), block, bits, int(signed),
            ctypes.byref(rule_structure(bits, signed, linear)), codes.data_ptr(), scales.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip

    def decode(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        bits: int,
        block: int,
        table: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        """Decode ``codes``/``scales`` into the contiguous float32 ``out`` (``numel`` elements).

        Raises:
            ValueError: a buffer the loops would read past, or of another
                dtype or layout than they read; nothing is read.
        """
        _check_decode_buffers(codes, scales, bits, block, table, out)
        self._decode(
            codes.data_ptr(), scales.data_ptr(), out.numel(), block, bits, table.data_ptr(),
            out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip


def _check_decode_buffers(
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    block: int,
    table: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Raise ``ValueError`` unless every buffer covers what the C loops read for ``out``."""
    numel = out.numel()
    blocks = -(-numel // block) if block > 0 else -1
    ok = (
        bits in (4, 8)
        and block > 0
        and block * bits % 8 == 0
        and codes.dtype == torch.uint8
        and scales.dtype == torch.float32
        and table.dtype == torch.float32
        and out.dtype == torch.float32
        and all(t.is_contiguous() and t.device.type == "cpu" for t in (codes, scales, table, out))
        and codes.numel() >= blocks * block * bits // 8
        and scales.numel() >= blocks
        and table.numel() == 1 << bits
    )
    if not ok:
        raise ValueError(
            f"the C decoder reads {numel} {bits}-bit codes in blocks of {block}: given "
            f"{codes.numel()} {codes.dtype} codes, {scales.numel()} {scales.dtype} scales "
            f"and a table of {table.numel()}"
        )


def native_codec(wait: bool = True) -> NativeCodec | None:
    """The C codec, built once per process; None without a C compiler or with it switched off.

    Args:
        wait: wait for the build (True); with False, None while it builds in
            a background thread (the codec's torch ops write the same codes).
    """
    library = library_when_ready(_SOURCE, name="optiplug-codec", wait=wait)
    return None if library is None else _codec_of(library)


@functools.cache
def _codec_of(library: NativeLibrary) -> NativeCodec:
    return NativeCodec(library)

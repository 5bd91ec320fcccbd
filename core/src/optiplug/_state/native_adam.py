"""Adam and AdamW steps on int8, int4 or bf16 state in one C pass over the blocks.

:func:`fused_adam_step` updates one float32 parameter whose ``exp_avg`` and
``exp_avg_sq`` are int8 or int4 :class:`~optiplug._state.codec.QuantizedState`
slots without decoding them to whole tensors: each block of the codec (256
elements for int8, 128 for int4) is decoded into a small float buffer, the
step of torch's single-tensor Adam is applied to the parameter and both
moments, the block's new absolute maxima are taken and the moments are
encoded back into their codes and scales in place. Everything a block needs
stays in L1, and each loop over a block vectorizes; with AVX-512 the int8
and int4 tables are looked up in registers (permutes) rather than gathered.

The codes follow the codec's decade rule exactly (:mod:`.code_rule`, the C
of :data:`~optiplug._state.native_codec.RULE_SOURCE`): a few float32
operations per value and, with AVX-512, its per-decade constants read from
registers, with no search and no gather.

The arithmetic is float32 per element with the scalars computed in double,
as torch's ``_single_tensor_adam`` does, and rounds as ATen's vectorized
CPU loops do: ``lerp``, ``add(alpha=)`` and ``addcmul`` with fused
multiply-adds (``fmaf``) where ATen has them, everything else without
contraction. That is torch's single-tensor step bit for bit except where
ATen's vectorized ``sqrt`` is not correctly rounded (torch 2.13's AVX-512
one is off by an ulp for some inputs; ``sqrt`` here is IEEE's), and within
a few ulps of torch's ``fused=True`` kernel. OpenMP splits the blocks over
torch's intra-op thread count.

bf16 moments take the same pass over blocks of 256 elements: decoded by a
shift, stepped by the same arithmetic, and rounded stochastically on write
with the codec's hashed bits (:func:`~optiplug._state.codec.seed_term`), the
same bits its torch path draws for that write.

The codec's loops here (decoding, block scales, encoding, bf16 rounding) are
also what :mod:`.native_state` wraps around an elementwise optimizer's own
update (SGD's among them).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from .._native import NativeLibrary, build_c_library, warn_unbuilt
from ..errors import NativeBuildError
from .codec import QuantizedState, _table, group_precision, seed_term
from .native_codec import RULE_SOURCE, RuleStructure, rule_structure
from .precision import BLOCK_SIZES, CODE_BITS

__all__ = ["NativeAdam", "fused_adam_step", "native_adam"]

_SOURCE = (
    RULE_SOURCE
    + r"""
typedef struct {
  const float *table;         /* the decoded values, 2**bits */
  const uint8_t *planes;      /* 8 bits: byte k of every value, then byte k + 1: 4 x 256 bytes */
  const optiplug_rule *rule;  /* the code of a value (see code_rule) */
  int32_t half;               /* a signed table's first non-negative code; 0: unsigned */
} optiplug_codes;

typedef struct {
  float neg_step, bc2_sqrt, eps, weight1, beta2, one_minus_beta2, l2, decay;
  int32_t maximize, use_l2, use_decay;
} optiplug_adam;

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

/* sqrtf of a block (a multiple of 16) in vector instructions: a loop calling sqrtf is not
   vectorized by GCC while sqrtf may set errno. The same correctly rounded square roots. */
static inline void sqrt_block(const float *restrict x, float *restrict out, int block) {
#if defined(__AVX512F__)
  for (int j = 0; j < block; j += 16)
    _mm512_storeu_ps(out + j, _mm512_sqrt_ps(_mm512_loadu_ps(x + j)));
#elif defined(__AVX__)
  for (int j = 0; j < block; j += 8)
    _mm256_storeu_ps(out + j, _mm256_sqrt_ps(_mm256_loadu_ps(x + j)));
#elif defined(__SSE2__)
  for (int j = 0; j < block; j += 4) _mm_storeu_ps(out + j, _mm_sqrt_ps(_mm_loadu_ps(x + j)));
#else
  for (int j = 0; j < block; j++) out[j] = sqrtf(x[j]);
#endif
}

static inline void update(float *restrict p, const float *restrict g, int count, int block,
                          float *restrict m, float *restrict v, const optiplug_adam *h) {
  const float w = h->weight1, w_less = h->weight1 - 1.0f, l2 = h->l2, decay = h->decay;
  const float beta2 = h->beta2, rest2 = h->one_minus_beta2, bc2 = h->bc2_sqrt, eps = h->eps;
  const float neg_step = h->neg_step;
  const int small = w < 0.5f, maximize = h->maximize, use_l2 = h->use_l2;
  const int use_decay = h->use_decay;
  for (int j = 0; j < count; j++) {
    float grad = maximize ? -g[j] : g[j];
    float param = p[j];
    grad = use_l2 ? fmaf(param, l2, grad) : grad;
    param = use_decay ? param * decay : param;
    const float diff = grad - m[j];
    const float mj = small ? fmaf(w, diff, m[j]) : fmaf(w_less, diff, grad);
    m[j] = mj;
    v[j] = fmaf(rest2 * grad, grad, v[j] * beta2);
    p[j] = param;
  }
  float root[256];
  sqrt_block(v, root, block);
  for (int j = 0; j < count; j++) p[j] = p[j] + neg_step * m[j] / (root[j] / bc2 + eps);
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

#if defined(__AVX512F__)
/* update() and both block_scale()s of a whole block in one pass, 16 elements at a time: the
   same operations in the same order (the square root inline), the moments' absolute maxima
   taken on the way. */
static inline void update_whole_block(float *restrict p, const float *restrict g, int block,
                                      float *restrict m, float *restrict v, const optiplug_adam *h,
                                      float *m_scale, float *v_scale) {
  const __m512 w = _mm512_set1_ps(h->weight1), w_less = _mm512_set1_ps(h->weight1 - 1.0f);
  const __m512 l2 = _mm512_set1_ps(h->l2), decay = _mm512_set1_ps(h->decay);
  const __m512 beta2 = _mm512_set1_ps(h->beta2), rest2 = _mm512_set1_ps(h->one_minus_beta2);
  const __m512 bc2 = _mm512_set1_ps(h->bc2_sqrt), eps = _mm512_set1_ps(h->eps);
  const __m512 neg_step = _mm512_set1_ps(h->neg_step);
  const __m512i sign = _mm512_set1_epi32((int32_t)0x80000000u), magnitude = _mm512_set1_epi32(0x7fffffff);
  const int small = h->weight1 < 0.5f, maximize = h->maximize, use_l2 = h->use_l2;
  const int use_decay = h->use_decay;
  __m512i m_top = _mm512_setzero_si512(), v_top = _mm512_setzero_si512();
  for (int j = 0; j < block; j += 16) {
    __m512 grad = _mm512_loadu_ps(g + j), param = _mm512_loadu_ps(p + j);
    if (maximize) grad = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(grad), sign));
    if (use_l2) grad = _mm512_fmadd_ps(param, l2, grad);
    if (use_decay) param = _mm512_mul_ps(param, decay);
    const __m512 old = _mm512_loadu_ps(m + j), diff = _mm512_sub_ps(grad, old);
    const __m512 mj = small ? _mm512_fmadd_ps(w, diff, old) : _mm512_fmadd_ps(w_less, diff, grad);
    const __m512 vj = _mm512_fmadd_ps(_mm512_mul_ps(rest2, grad), grad,
                                      _mm512_mul_ps(_mm512_loadu_ps(v + j), beta2));
    _mm512_storeu_ps(m + j, mj);
    _mm512_storeu_ps(v + j, vj);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vj), bc2), eps);
    _mm512_storeu_ps(p + j, _mm512_add_ps(param, _mm512_div_ps(_mm512_mul_ps(neg_step, mj), denom)));
    m_top = _mm512_max_epu32(m_top, _mm512_and_si512(_mm512_castps_si512(mj), magnitude));
    v_top = _mm512_max_epu32(v_top, _mm512_and_si512(_mm512_castps_si512(vj), magnitude));
  }
  *m_scale = scale_of_top((uint32_t)_mm512_reduce_max_epu32(m_top));
  *v_scale = scale_of_top((uint32_t)_mm512_reduce_max_epu32(v_top));
}
#endif

static inline void adam_block(float *restrict p, const float *restrict g, int count, int bits,
                              int block, uint8_t *restrict m_codes, float *restrict m_scale,
                              uint8_t *restrict v_codes, float *restrict v_scale,
                              const optiplug_codes *mc, const optiplug_codes *vc,
                              const optiplug_adam *h) {
  float m[256], v[256];
  decode(m_codes, bits, block, *m_scale, mc, m);
  decode(v_codes, bits, block, *v_scale, vc, v);
#if defined(__AVX512F__)
  if (count == block) {
    update_whole_block(p, g, block, m, v, h, m_scale, v_scale);
  } else
#endif
  {
    update(p, g, count, block, m, v, h);
    for (int j = count; j < block; j++) m[j] = v[j] = 0.0f;  /* the encoder's zero padding */
    *m_scale = block_scale(m, block);
    *v_scale = block_scale(v, block);
  }
  encode(m, bits, block, *m_scale, mc, m_codes);
  encode(v, bits, block, *v_scale, vc, v_codes);
}

void optiplug_adam_encode(const float *restrict x, int64_t n, int bits, uint8_t *restrict codes,
                          float *restrict scales, const optiplug_codes *c, int threads) {
  const int block = bits == 8 ? 256 : 128;
  const int64_t blocks = (n + block - 1) / block;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * block;
    const int count = (int)(n - start < block ? n - start : block);
    float values[256];
    for (int j = 0; j < block; j++) values[j] = j < count ? x[start + j] : 0.0f;
    scales[b] = block_scale(values, block);
    encode(values, bits, block, scales[b], c, codes + start * bits / 8);
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

void optiplug_adam_bf16_step(float *restrict p, const float *restrict g, int64_t n,
                             uint16_t *restrict m16, uint16_t *restrict v16, uint32_t m_seed,
                             uint32_t v_seed, const optiplug_adam *h, int threads) {
  const int64_t blocks = (n + 255) / 256;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * 256;
    const int count = (int)(n - start < 256 ? n - start : 256);
    float m[256], v[256];
    for (int j = 0; j < 256; j++) {
      m[j] = j < count ? float_of((uint32_t)m16[start + j] << 16) : 0.0f;
      v[j] = j < count ? float_of((uint32_t)v16[start + j] << 16) : 0.0f;
    }
    update(p + start, g + start, count, 256, m, v, h);
    for (int j = 0; j < count; j++) {
      m16[start + j] = bf16_rounded(m[j], (uint32_t)(start + j), m_seed);
      v16[start + j] = bf16_rounded(v[j], (uint32_t)(start + j), v_seed);
    }
  }
}

void optiplug_adam_step(float *restrict p, const float *restrict g, int64_t n, int bits,
                        uint8_t *restrict m_codes, float *restrict m_scales,
                        uint8_t *restrict v_codes, float *restrict v_scales,
                        const optiplug_codes *mc, const optiplug_codes *vc,
                        const optiplug_adam *h, int threads) {
  const int block = bits == 8 ? 256 : 128;
  const int64_t blocks = (n + block - 1) / block;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * block;
    const int count = (int)(n - start < block ? n - start : block);
    const int64_t bytes = start * bits / 8;
    if (bits == 8)
      adam_block(p + start, g + start, count, 8, 256, m_codes + bytes, m_scales + b,
                 v_codes + bytes, v_scales + b, mc, vc, h);
    else
      adam_block(p + start, g + start, count, 4, 128, m_codes + bytes, m_scales + b,
                 v_codes + bytes, v_scales + b, mc, vc, h);
  }
}
"""
)


class _Codes(ctypes.Structure):
    _fields_ = [
        ("table", ctypes.c_void_p),
        ("planes", ctypes.c_void_p),
        ("rule", ctypes.POINTER(RuleStructure)),
        ("half", ctypes.c_int32),
    ]


class _Scalars(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_float) for name in ("neg_step", "bc2_sqrt", "eps", "weight1", "beta2")),
        *((name, ctypes.c_float) for name in ("one_minus_beta2", "l2", "decay")),
        *((name, ctypes.c_int32) for name in ("maximize", "use_l2", "use_decay")),
    ]


_POINTER = ctypes.c_void_p
_ENCODE_ARGS: list[Any] = [_POINTER, ctypes.c_int64, ctypes.c_int, _POINTER, _POINTER,
                           ctypes.POINTER(_Codes), ctypes.c_int]  # fmt: skip
_BF16_STEP_ARGS: list[Any] = [_POINTER, _POINTER, ctypes.c_int64, _POINTER, _POINTER,
                              ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(_Scalars),
                              ctypes.c_int]  # fmt: skip
_STEP_ARGS: list[Any] = [_POINTER, _POINTER, ctypes.c_int64, ctypes.c_int, _POINTER, _POINTER,
                         _POINTER, _POINTER, ctypes.POINTER(_Codes), ctypes.POINTER(_Codes),
                         ctypes.POINTER(_Scalars), ctypes.c_int]  # fmt: skip


class _SlotTables:
    """One code's tables for the C loop, kept alive with the structure pointing at them."""

    def __init__(self, bits: int, signed: bool, linear: bool = False) -> None:
        self.table = _table(bits, signed, torch.device("cpu"), linear).contiguous()
        # byte k of every value, for k = 0..3 (little-endian: the low byte first)
        self.planes = self.table.view(torch.uint8).view(-1, 4).t().contiguous()
        self.rule = rule_structure(bits, signed, linear)
        half = 1 << (bits - 1) if signed else 0
        pointers = self.table.data_ptr(), self.planes.data_ptr()
        self.codes = _Codes(*pointers, ctypes.pointer(self.rule), half)


@functools.cache
def _slot_tables(bits: int, signed: bool, linear: bool = False) -> _SlotTables:
    """The cached tables of ``bits``, ``signed`` and ``linear``."""
    return _SlotTables(bits, signed, linear)


class NativeAdam:
    """The loaded C step (see the module docstring)."""

    def __init__(self, library: NativeLibrary) -> None:
        self._step = library.function("optiplug_adam_step", _STEP_ARGS)
        self._bf16_step = library.function("optiplug_adam_bf16_step", _BF16_STEP_ARGS)
        self._encode = library.function("optiplug_adam_encode", _ENCODE_ARGS)

    def encode(
        self, flat: torch.Tensor, precision: str, signed: bool, linear: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes and scales of contiguous float32 ``flat`` by the step's own encoder.

        The codec's encoding computes the same, bit for bit; this entry point
        lets that be checked.

        Args:
            flat: a contiguous one-dimensional float32 CPU tensor.
            precision: ``"int8"`` or ``"int4"``.
            signed: the signed table (a first moment) or not.
            linear: the linear table of that kind instead of the dynamic one.

        Returns:
            ``(codes, scales)`` laid out as :class:`QuantizedState` keeps them.
        """
        bits, block = CODE_BITS[precision], BLOCK_SIZES[precision]
        blocks = -(-flat.numel() // block)
        codes = torch.empty(blocks * block * bits // 8, dtype=torch.uint8)
        scales = torch.empty(blocks, dtype=torch.float32)
        self._encode(
            flat.data_ptr(), flat.numel(), bits, codes.data_ptr(), scales.data_ptr(),
            ctypes.byref(_slot_tables(bits, signed, linear).codes), torch.get_num_threads(),
        )  # fmt: skip
        return codes, scales

    def step(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        slots: tuple[QuantizedState, QuantizedState],
        scalars: dict[str, float],
    ) -> None:
        """One step on contiguous float32 ``param`` and ``grad``, moments ``slots`` in place.

        Args:
            param: the parameter, updated in place.
            grad: its gradient.
            slots: ``(exp_avg, exp_avg_sq)``, both int8, both int4 or both bf16
                (whose values are rounded stochastically with the seeds their
                next write takes).
            scalars: the fields of the C structure of the step's scalars.
        """
        exp_avg, exp_avg_sq = slots
        if exp_avg.precision == "bf16":
            self._bf16_step(
                param.data_ptr(), grad.data_ptr(), param.numel(),
                exp_avg.codes.data_ptr(), exp_avg_sq.codes.data_ptr(),
                seed_term(exp_avg.writes + 1), seed_term(exp_avg_sq.writes + 1),
                ctypes.byref(_Scalars(**scalars)), torch.get_num_threads(),
            )  # fmt: skip
            return
        bits = CODE_BITS[exp_avg.precision]
        first = _slot_tables(bits, True, exp_avg.linear)
        second = _slot_tables(bits, False, exp_avg_sq.linear)
        self._step(
            param.data_ptr(), grad.data_ptr(), param.numel(), bits,
            exp_avg.codes.data_ptr(), exp_avg.scales.data_ptr(),
            exp_avg_sq.codes.data_ptr(), exp_avg_sq.scales.data_ptr(),
            ctypes.byref(first.codes), ctypes.byref(second.codes),
            ctypes.byref(_Scalars(**scalars)), torch.get_num_threads(),
        )  # fmt: skip


@functools.cache
def native_adam() -> NativeAdam | None:
    """The C step, built once per process; None without a C compiler or with it switched off."""
    try:
        return NativeAdam(build_c_library(_SOURCE, name="optiplug-adam"))
    except NativeBuildError as error:
        warn_unbuilt(str(error))
        return None


def fused_adam_step(optimizer: torch.optim.Optimizer, group: dict[str, Any], param: Any) -> bool:
    """One Adam/AdamW step of ``param`` on its int8/int4/bf16 moments in place, when the C step applies.

    The step is torch's single-tensor one (``maximize``, L2 weight decay for
    Adam, decoupled for AdamW, bias corrections from the incremented
    ``state["step"]``); both slots' ``writes`` grow by one, as a store does.

    Args:
        optimizer: a ``torch.optim.Adam`` (or ``AdamW``) whose state is low precision.
        group: ``param``'s group (its hyperparameters are read).
        param: the parameter, with a gradient.

    Returns:
        False, having changed nothing, when the C step does not apply (the
        group's implementation is not ``fused``, not a float32 CPU parameter with a dense contiguous gradient, an option
        it lacks, state not yet int8/int4/bf16 moments of the group's precision,
        no compiler); True when it stepped.
    """
    if torch.compiler.is_compiling() or not _plain_group(optimizer, group):
        return False
    state = optimizer.state.get(param)
    slots = _moments(state, group, param) if state else None
    if state is None or slots is None:
        return False
    kernel = native_adam()
    if kernel is None:
        return False
    step = _incremented(state)
    kernel.step(param, param.grad, slots, _scalars(optimizer, group, step))
    for slot in slots:
        slot.writes += 1
    return True


def _plain_group(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether ``group`` runs the fused implementation with options the C step has.

    The C step is ``impl="fused"``'s kernel for low-precision state; ``loop``
    and ``foreach`` keep torch's own arithmetic on the decoded state.
    """
    if not group.get("fused"):
        return False
    if group.get("amsgrad") or group.get("differentiable") or group.get("capturable"):
        return False
    if getattr(optimizer, "grad_scale", None) is not None:
        return False
    if getattr(optimizer, "found_inf", None) is not None:
        return False
    betas = group.get("betas", ())
    scalars = [group.get("lr"), group.get("eps"), group.get("weight_decay"), *betas]
    return len(betas) == 2 and all(isinstance(value, (int, float)) for value in scalars)


def _moments(
    state: dict[str, Any], group: dict[str, Any], param: torch.Tensor
) -> tuple[QuantizedState, QuantizedState] | None:
    """``(exp_avg, exp_avg_sq)`` when the C step can take them and ``param``, else None."""
    grad = param.grad
    if "step" not in state or grad is None or not _dense_cpu_float(param, grad):
        return None
    first, second = state.get("exp_avg"), state.get("exp_avg_sq")
    precision = group_precision(group)
    if precision not in CODE_BITS and precision != "bf16":
        return None
    for slot, signed in ((first, True), (second, False)):
        if not isinstance(slot, QuantizedState) or not _fits(slot, precision, signed, param):
            return None
    assert isinstance(first, QuantizedState) and isinstance(second, QuantizedState)
    return first, second


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


def _incremented(state: dict[str, Any]) -> float:
    """``state["step"]`` plus one, in place as torch keeps it (a tensor), and its new value."""
    step = state["step"]
    if isinstance(step, torch.Tensor):
        step += 1
        return float(step.item())
    state["step"] = step + 1
    return float(state["step"])


def _scalars(
    optimizer: torch.optim.Optimizer, group: dict[str, Any], step: float
) -> dict[str, Any]:
    """The C step's scalars, computed in double as torch's single-tensor Adam does."""
    lr, eps, decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
    beta1, beta2 = (float(beta) for beta in group["betas"])
    decoupled = bool(group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW)))
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    return {
        "neg_step": -(lr / bias_correction1),
        "bc2_sqrt": bias_correction2**0.5,
        "eps": eps,
        "weight1": 1 - beta1,
        "beta2": beta2,
        "one_minus_beta2": 1 - beta2,
        "l2": decay,
        "decay": 1 - lr * decay,
        "maximize": int(bool(group.get("maximize"))),
        "use_l2": int(decay != 0 and not decoupled),
        "use_decay": int(decay != 0 and decoupled),
    }

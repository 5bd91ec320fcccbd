"""The codec's blockwise encoding and decoding as C loops, for float32 state on a CPU.

The same arithmetic as the torch path of :mod:`.codec` on the same inputs:
the block's absolute maximum (NaN if the block holds one), the value divided
by it in float32, the code from the bucket table and one comparison with the
next midpoint (see :func:`optiplug._state.codec.code_tables`), int4 codes
packed two per byte, low nibble first; decoding multiplies the table value by
the block's scale in float32. So either path writes the same codes and reads
the same values, bit for bit, and a checkpoint moves between them. One pass
reads the state and writes the codes (a block of 256 stays in L1), where the
torch path makes about a dozen passes; OpenMP splits the blocks over torch's
intra-op thread count when the compiler has it. Built by
:func:`optiplug._native.build_c_library` on first use.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from .._native import NativeLibrary, build_c_library
from ..errors import NativeBuildError

__all__ = ["NativeCodec", "native_codec"]

MAX_BLOCK = 256
"""The largest block the C loops take (their per-block buffer)."""

_SOURCE = r"""
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }

static inline int code_of(float v, int is_signed, int half, const float *mids,
                          const uint8_t *guess, uint32_t last_bucket) {
  const float m = fabsf(v);
  uint32_t bucket = bits_of(m) >> 16;
  bucket = bucket < last_bucket ? bucket : last_bucket;
  int index = guess[bucket];
  index += m >= mids[index];
  if (!is_signed) return index;
  return v < 0 ? half - 1 - index : half + index;
}

void optiplug_encode_blocks(const float *restrict x, int64_t n, int64_t block, int bits,
                            int is_signed, const float *restrict mids,
                            const uint8_t *restrict guess, int64_t last_bucket,
                            uint8_t *restrict codes, float *restrict scales, int threads) {
  const int64_t blocks = (n + block - 1) / block;
  const int half = 1 << (is_signed ? bits - 1 : bits);
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
    for (int64_t j = 0; j < block; j++)
      local[j] = (uint8_t)code_of(values[j] / divisor, is_signed, half, mids, guess,
                                  (uint32_t)last_bucket);
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

_POINTER = ctypes.c_void_p
_ENCODE_ARGS: list[Any] = [_POINTER, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int, _POINTER,
                _POINTER, ctypes.c_int64, _POINTER, _POINTER, ctypes.c_int]  # fmt: skip
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
        tables: tuple[torch.Tensor, torch.Tensor],
        out: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        """Encode contiguous float32 ``flat`` into ``out`` = (codes, scales), both preallocated."""
        mids, guess = tables
        codes, scales = out
        self._encode(
            flat.data_ptr(), flat.numel(), block, bits, int(signed), mids.data_ptr(),
            guess.data_ptr(), guess.numel() - 1, codes.data_ptr(), scales.data_ptr(),
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
        """Decode ``codes``/``scales`` into the contiguous float32 ``out`` (``numel`` elements)."""
        self._decode(
            codes.data_ptr(), scales.data_ptr(), out.numel(), block, bits, table.data_ptr(),
            out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip


@functools.cache
def native_codec() -> NativeCodec | None:
    """The C codec, built once per process; None without a C compiler or with it switched off."""
    try:
        return NativeCodec(build_c_library(_SOURCE, name="optiplug-codec"))
    except NativeBuildError:
        return None

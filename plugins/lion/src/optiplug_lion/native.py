"""Lion's fused CPU kernel in C, built with the system's C compiler on first use.

The same update as :func:`optiplug_lion.functional._lion_kernel`, element by
element, in the parameter's precision (float32 or float64; bfloat16 and
float16 widened to float32 and rounded back to nearest-even, as the eager
kernel does), with the same order of operations (so it rounds as the eager
update does) and torch's ``sign`` (0 for zero and NaN). One pass reads ``p``, ``g``, ``m``
and writes ``p``, ``m``: the 20-bytes-per-parameter floor. It is built by
:func:`optiplug.base.build_c_library` in 0.1-0.2 s (kept per machine), where
``torch.compile``'s first build takes 6-20 s on two cores; OpenMP splits
each tensor over torch's thread count when the compiler has it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
from torch import Tensor

from optiplug.base import build_c_library

__all__ = ["NATIVE_DTYPES", "native_kernel"]

NATIVE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
"""The parameter dtypes the C kernels are built for."""

_SOURCE = r"""
#include <stdint.h>

#define LION_KERNEL(NAME, T)                                                        \
void NAME(T *restrict p, const T *restrict g, T *restrict m, int64_t n,             \
          double lr_, double wd_, double b1_, double b2_, double dir_,              \
          double cautious_, int threads) {                                          \
  const T lr = (T)lr_, wd = (T)wd_, b1 = (T)b1_, b2 = (T)b2_, dir = (T)dir_;        \
  const T one = (T)1, keep1 = one - b1, keep2 = one - b2, lrwd = lr * wd;           \
  const T other = one - (T)cautious_;                                               \
  _Pragma("omp parallel for simd num_threads(threads) schedule(static)")            \
  for (int64_t i = 0; i < n; i++) {                                                 \
    const T gi = g[i] * dir, mi = m[i], pi = p[i];                                  \
    const T c = mi * b1 + gi * keep1;                                               \
    const T update = (T)((c > 0) - (c < 0));                                        \
    const T mask = update * pi >= 0 ? one : other;                                  \
    p[i] = pi * (one - lrwd * mask) - lr * update;                                  \
    m[i] = mi + keep2 * (gi - mi);                                                  \
  }                                                                                 \
}

LION_KERNEL(optiplug_lion_f32, float)
LION_KERNEL(optiplug_lion_f64, double)
"""

# Half precisions: each element widened to float32, updated as above (the eager kernel's
# ``promote_types(dtype, float32)``), and rounded back to nearest-even as torch rounds a
# float32 into bfloat16 (NaN to 0x7FC0) or float16. A library of its own: a compiler
# without ``_Float16`` loses only these, which then take ``torch.compile``.
_HALF_SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline float from_f16(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t to_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }

#define LION_HALF(NAME, LOAD, STORE)                                                \
void NAME(uint16_t *restrict p, const uint16_t *restrict g, uint16_t *restrict m,   \
          int64_t n, double lr_, double wd_, double b1_, double b2_, double dir_,   \
          double cautious_, int threads) {                                          \
  const float lr = (float)lr_, wd = (float)wd_, b1 = (float)b1_, b2 = (float)b2_;   \
  const float dir = (float)dir_, one = 1.0f, keep1 = one - b1, keep2 = one - b2;    \
  const float lrwd = lr * wd, other = one - (float)cautious_;                       \
  _Pragma("omp parallel for simd num_threads(threads) schedule(static)")            \
  for (int64_t i = 0; i < n; i++) {                                                 \
    const float gi = LOAD(g[i]) * dir, mi = LOAD(m[i]), pi = LOAD(p[i]);            \
    const float c = mi * b1 + gi * keep1;                                           \
    const float update = (float)((c > 0) - (c < 0));                                \
    const float mask = update * pi >= 0 ? one : other;                              \
    p[i] = STORE(pi * (one - lrwd * mask) - lr * update);                           \
    m[i] = STORE(mi + keep2 * (gi - mi));                                           \
  }                                                                                 \
}

LION_HALF(optiplug_lion_bf16, from_bf16, to_bf16)
LION_HALF(optiplug_lion_f16, from_f16, to_f16)
"""

_FUNCTIONS = {
    torch.float32: ("optiplug-lion", _SOURCE, "optiplug_lion_f32"),
    torch.float64: ("optiplug-lion", _SOURCE, "optiplug_lion_f64"),
    torch.bfloat16: ("optiplug-lion-half", _HALF_SOURCE, "optiplug_lion_bf16"),
    torch.float16: ("optiplug-lion-half", _HALF_SOURCE, "optiplug_lion_f16"),
}
"""dtype -> (library name, its source, the function)."""
_ARGTYPES = [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [ctypes.c_double] * 6 + [ctypes.c_int]


def native_kernel(dtype: torch.dtype) -> Callable[[Tensor, Tensor, Tensor, Tensor], None]:
    """The C kernel for ``dtype``, with ``_lion_kernel``'s signature.

    Args:
        dtype: float32, float64, bfloat16 or float16.

    Returns:
        ``kernel(param, grad, exp_avg, packed)`` updating the contiguous CPU
        tensors ``param`` and ``exp_avg`` in place; ``packed`` holds
        ``(lr, weight_decay, beta1, beta2, +-1, cautious)``.

    Raises:
        NativeBuildError: no C compiler, a failed build, or native kernels
            switched off.
        KeyError: another dtype.
    """
    name, source, symbol = _FUNCTIONS[dtype]
    function = build_c_library(source, name=name).function(symbol, _ARGTYPES)

    def kernel(param: Tensor, grad: Tensor, exp_avg: Tensor, packed: Tensor) -> None:
        lr, weight_decay, beta1, beta2, direction, cautious = packed.tolist()
        function(
            param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), param.numel(),
            lr, weight_decay, beta1, beta2, direction, cautious, torch.get_num_threads(),
        )  # fmt: skip

    return kernel

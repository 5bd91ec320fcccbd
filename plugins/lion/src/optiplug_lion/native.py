"""Lion's fused CPU kernel in C, built with the system's C compiler on first use.

The same update as :func:`optiplug_lion.functional._lion_kernel`, element by
element, in the parameter's own precision (float32 or float64), with the
same order of operations (so it rounds as the eager update does) and
torch's ``sign`` (0 for zero and NaN). One pass reads ``p``, ``g``, ``m``
and writes ``p``, ``m``: the 20-bytes-per-parameter floor. It is built by
:func:`optiplug.base.build_c_library` in about 0.1 s (kept per machine), where
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

NATIVE_DTYPES = (torch.float32, torch.float64)
"""The parameter dtypes the C kernel is built for (half precisions use ``torch.compile``)."""

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

_FUNCTIONS = {torch.float32: "optiplug_lion_f32", torch.float64: "optiplug_lion_f64"}
_ARGTYPES = [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [ctypes.c_double] * 6 + [ctypes.c_int]


def native_kernel(dtype: torch.dtype) -> Callable[[Tensor, Tensor, Tensor, Tensor], None]:
    """The C kernel for ``dtype``, with ``_lion_kernel``'s signature.

    Args:
        dtype: float32 or float64.

    Returns:
        ``kernel(param, grad, exp_avg, packed)`` updating the contiguous CPU
        tensors ``param`` and ``exp_avg`` in place; ``packed`` holds
        ``(lr, weight_decay, beta1, beta2, +-1, cautious)``.

    Raises:
        NativeBuildError: no C compiler, a failed build, or native kernels
            switched off.
        KeyError: another dtype.
    """
    function = getattr(build_c_library(_SOURCE, name="optiplug-lion").library, _FUNCTIONS[dtype])
    function.argtypes = _ARGTYPES
    function.restype = None

    def kernel(param: Tensor, grad: Tensor, exp_avg: Tensor, packed: Tensor) -> None:
        lr, weight_decay, beta1, beta2, direction, cautious = packed.tolist()
        function(
            param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), param.numel(),
            lr, weight_decay, beta1, beta2, direction, cautious, torch.get_num_threads(),
        )  # fmt: skip

    return kernel

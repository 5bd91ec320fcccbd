"""The Triton kernels: one multi-tensor launch updates every tensor of a bucket.

A *bucket* is the tensors of one param group on one device with one
parameter dtype. Its table lives on the device as two int64 tensors:

* ``rows``: one row of :data:`ROW` int64 per tensor: the element count, then
  the addresses (``data_ptr``) of the parameter, the gradient and up to four
  state tensors (see the ``COL_*`` constants), then a per-tensor flag;
* ``blocks``: one entry per program, ``tensor_index << 32 | chunk``; the
  program updates elements ``[chunk * BLOCK, (chunk + 1) * BLOCK)`` of that
  tensor (masked at its end).

This is the idea of torch's ``multi_tensor_apply``, with the tensor list in
device memory: a launch costs the same for 3 tensors or 10,000, and the
table is built once and reused while the tensors stay the same.

Every kernel loads its pointers from the table and casts them
(``tl.load(rows + c).to(tl.pointer_type(...))``); triton's CPU interpreter
(``TRITON_INTERPRET=1``) dereferences such pointers into CPU memory as the
GPU does into device memory, so the same kernel source runs in both. The
kernel functions below are plain Python functions, wrapped by
:func:`kernel` per mode (``triton.JITFunction``, what ``triton.jit``
builds, for CUDA tensors; triton's ``InterpretedFunction``, what
``triton.jit`` builds under ``TRITON_INTERPRET=1``, for CPU tensors), so
CPU and CUDA tensors can be
updated in one process whatever ``TRITON_INTERPRET`` was when triton was
imported. For the same reason the kernels call no other ``@triton.jit``
function (``tl.rand`` included): the random bits of stochastic rounding come
from an inline counter-based hash.

All arithmetic is fp32 (the parameter is loaded in its dtype and converted),
with IEEE round-to-nearest divisions and square roots (``tl.div_rn``,
``tl.sqrt_rn``: triton's ``/`` and ``tl.sqrt`` are approximate on a GPU,
torch's kernels are not);
the bias corrections of Adam, ``1 - beta**step``, are computed as
``1 - exp(step * ln(beta))`` in fp64 from the fp32 step count, with ``ln(beta)``
passed as an fp32 scalar (triton's float arguments are fp32): its rounding
(at most 2**-24 relative, about 6e-8) bounds the relative error of
``step * ln(beta)``. The state tensors are fp32.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from optiplug.errors import HyperparameterError

__all__ = [
    "BLOCK",
    "BLOCKS",
    "COL_FLAG",
    "COL_GRAD",
    "COL_NUMEL",
    "COL_PARAM",
    "COL_STATE",
    "NUM_WARPS",
    "ROW",
    "STEP_BLOCK",
    "WARPS",
    "has_launch_config",
    "kernel",
    "launch_config",
    "reset_launch_config",
    "set_launch_config",
]

ROW = 8
"""int64 entries per tensor in the ``rows`` table."""
COL_NUMEL = 0
COL_PARAM = 1
COL_GRAD = 2
COL_STATE = 3
"""Columns 3-6: the algorithm's state tensors, in its order (Adam: exp_avg,
exp_avg_sq, max_exp_avg_sq, step; SGD: momentum_buffer; Lion: exp_avg)."""
COL_FLAG = 7
"""SGD: 1 until the momentum buffer has been initialised from the gradient."""

BLOCK = 2048
"""Default elements per program: 8 per thread with 8 warps, loaded as 16-byte vectors.

The default of a device without a measured choice (:func:`set_launch_config`,
:func:`optiplug_fused.tuning.sweep`). Compiled for sm_90a, 4096 elements per
8 warps need about twice the registers per thread of 2048 (16 elements each,
held at once), which halves the blocks an SM can hold; 2048 keeps four.
"""
NUM_WARPS = 8
"""Default warps per program."""
STEP_BLOCK = 1024
"""Tensors per program of the step-counter kernel."""
BLOCKS = (512, 1024, 2048, 4096, 8192)
"""Accepted elements per program (a power of two: ``tl.arange`` needs one)."""
WARPS = (1, 2, 4, 8, 16)
"""Accepted warps per program."""

_launch_configs: dict[str, tuple[int, int]] = {}


def _device_key(device: Any) -> str:
    """``"cuda:0"``-style key of a device (the current CUDA device for a bare ``"cuda"``)."""
    import torch  # deferred: imports torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def launch_config(device: Any) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` for tables built from now on for ``device``.

    Args:
        device: a ``torch.device`` or its name.

    Returns:
        The choice set by :func:`set_launch_config` for this device, else
        ``(BLOCK, NUM_WARPS)``.
    """
    return _launch_configs.get(_device_key(device), (BLOCK, NUM_WARPS))


def has_launch_config(device: Any) -> bool:
    """Whether :func:`set_launch_config` chose ``device``'s configuration.

    Args:
        device: a ``torch.device`` or its name.

    Returns:
        False when ``device`` uses the defaults.
    """
    return _device_key(device) in _launch_configs


def set_launch_config(device: Any, block: int, num_warps: int) -> None:
    """Use ``(block, num_warps)`` for the tables built from now on for ``device``.

    Tables already built keep theirs until rebuilt (``optimizer.refresh()``).

    Args:
        device: a ``torch.device`` or its name.
        block: elements per program, one of :data:`BLOCKS`.
        num_warps: warps per program, one of :data:`WARPS`.

    Raises:
        HyperparameterError: ``block`` or ``num_warps`` is not an accepted
            value (naming it).
    """
    if block not in BLOCKS or isinstance(block, bool):
        raise HyperparameterError("block", block, f"must be one of {BLOCKS}")
    if num_warps not in WARPS or isinstance(num_warps, bool):
        raise HyperparameterError("num_warps", num_warps, f"must be one of {WARPS}")
    _launch_configs[_device_key(device)] = (block, num_warps)


def reset_launch_config(device: Any) -> None:
    """Forget ``device``'s choice: tables built from now on use the defaults.

    Args:
        device: a ``torch.device`` or its name.
    """
    _launch_configs.pop(_device_key(device), None)


# The kernels below are compiled by triton (or run by its interpreter), never
# called as Python. Their arguments: ``blocks``/``rows`` the table, ``*_ptr``
# 0-d device tensors (a placeholder when the matching flag is off), the rest
# scalars; the upper-case ones are compile-time constants.


def _adam_kernel(  # type: ignore[no-untyped-def]
    blocks,
    rows,
    lr_ptr,
    lr,
    beta2,
    weight1,
    weight2,
    ln_beta1,
    ln_beta2,
    eps,
    weight_decay,
    decay,
    scale_ptr,
    found_ptr,
    rng_ptr,
    seed,
    P_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
    LR_TENSOR: tl.constexpr,
    DECOUPLED: tl.constexpr,
    HAS_WD: tl.constexpr,
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """Adam/AdamW (``torch.optim.Adam``'s single-tensor arithmetic); step already incremented."""
    packed = tl.load(blocks + tl.program_id(0))
    index = packed >> 32
    row = rows + index * 8
    numel = tl.load(row)
    if HAS_INF:  # skipped step: every element is masked off
        numel = tl.where(tl.load(found_ptr) == 0, numel, 0)
    param_base = tl.load(row + 1).to(tl.pointer_type(P_DTYPE))
    grad_base = tl.load(row + 2).to(tl.pointer_type(P_DTYPE))
    m_base = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    v_base = tl.load(row + 4).to(tl.pointer_type(tl.float32))
    vmax_base = tl.load(row + 5).to(tl.pointer_type(tl.float32))
    step_addr = tl.load(row + 6)
    if ALIGNED:  # 16-byte aligned addresses, sizes a multiple of 8: 16-byte vector accesses
        numel = tl.multiple_of(numel, 8)
        param_base = tl.multiple_of(param_base, 16)
        grad_base = tl.multiple_of(grad_base, 16)
        m_base = tl.multiple_of(m_base, 16)
        v_base = tl.multiple_of(v_base, 16)
        vmax_base = tl.multiple_of(vmax_base, 16)
    offsets = (packed & 0xFFFFFFFF) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    param_ptr = param_base + offsets
    grad_ptr = grad_base + offsets
    m_ptr = m_base + offsets
    v_ptr = v_base + offsets
    step = tl.load(step_addr.to(tl.pointer_type(tl.float32))).to(tl.float64)

    p = tl.load(param_ptr, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(grad_ptr, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr, mask=mask, other=0.0)
    v = tl.load(v_ptr, mask=mask, other=0.0)
    if HAS_SCALE:
        g = tl.div_rn(g, tl.load(scale_ptr).to(tl.float32))
    if MAXIMIZE:
        g = -g
    lr_value = tl.load(lr_ptr).to(tl.float32) if LR_TENSOR else lr
    if HAS_WD:
        if DECOUPLED:
            p = p * (1.0 - lr_value * weight_decay) if LR_TENSOR else p * decay
        else:
            g = g + weight_decay * p
    # torch's lerp(m, g, w): m + w * (g - m) for w < 0.5, else g - (g - m) * (1 - w)
    m = tl.where(weight1 < 0.5, m + weight1 * (g - m), g - (g - m) * (1.0 - weight1))
    v = v * beta2 + weight2 * (g * g)
    step = tl.maximum(step, 1.0)  # a skipped step (found_inf) reads 0 and updates nothing
    bias1 = 1.0 - tl.exp(step * ln_beta1)
    bias2 = 1.0 - tl.exp(step * ln_beta2)
    step_size = (lr_value / bias1).to(tl.float32)
    bias2_sqrt = tl.sqrt(bias2).to(tl.float32)  # fp64: IEEE
    if AMSGRAD:
        vmax_ptr = vmax_base + offsets
        vmax = tl.maximum(tl.load(vmax_ptr, mask=mask, other=0.0), v)
        tl.store(vmax_ptr, vmax, mask=mask)
        denom = tl.div_rn(tl.sqrt_rn(vmax), bias2_sqrt) + eps
    else:
        denom = tl.div_rn(tl.sqrt_rn(v), bias2_sqrt) + eps
    p = p - step_size * tl.div_rn(m, denom)
    tl.store(m_ptr, m, mask=mask)
    tl.store(v_ptr, v, mask=mask)

    if ROUND_BF16:  # fp32 -> bf16 on the bits: the same rounding compiled and interpreted
        bits = p.to(tl.uint32, bitcast=True)
        if STOCHASTIC:  # + a uniform 16-bit integer, then truncate: unbiased
            counter = tl.load(rng_ptr).to(tl.uint32)
            key = seed.to(tl.uint32) ^ (counter * 0x9E3779B9)
            key = key ^ (key >> 16)
            key = key * 0x85EBCA6B
            key = key ^ (key >> 13)
            key = key * 0xC2B2AE35
            key = key ^ (key >> 16)
            key = key ^ (index.to(tl.uint32) * 0xA7D4EB2F)
            h = offsets.to(tl.uint32) ^ key
            h = h ^ (h >> 16)
            h = h * 0x85EBCA6B
            h = h ^ (h >> 13)
            h = h * 0xC2B2AE35
            h = h ^ (h >> 16)
            increment = h & 0xFFFF
        else:  # to nearest, ties to even
            increment = 0x7FFF + ((bits >> 16) & 1)
        special = (bits & 0x7F800000) == 0x7F800000  # inf keeps its bits, NaN stays a NaN
        quiet = tl.where((bits & 0x7FFFFF) != 0, 0x400000, 0)
        bits = tl.where(special, bits | quiet, bits + increment)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        tl.store(param_ptr, rounded, mask=mask)
    else:
        tl.store(param_ptr, p.to(P_DTYPE), mask=mask)


def _sgd_kernel(  # type: ignore[no-untyped-def]
    blocks,
    rows,
    lr_ptr,
    lr,
    momentum,
    weight1,
    weight_decay,
    scale_ptr,
    found_ptr,
    rng_ptr,
    seed,
    P_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
    LR_TENSOR: tl.constexpr,
    HAS_MOMENTUM: tl.constexpr,
    NESTEROV: tl.constexpr,
    HAS_WD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """SGD (``torch.optim.SGD``'s single-tensor arithmetic); the flag column marks a new buffer."""
    packed = tl.load(blocks + tl.program_id(0))
    index = packed >> 32
    row = rows + index * 8
    numel = tl.load(row)
    if HAS_INF:  # skipped step: every element is masked off
        numel = tl.where(tl.load(found_ptr) == 0, numel, 0)
    param_base = tl.load(row + 1).to(tl.pointer_type(P_DTYPE))
    grad_base = tl.load(row + 2).to(tl.pointer_type(P_DTYPE))
    buf_base = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    if ALIGNED:  # 16-byte aligned addresses, sizes a multiple of 8: 16-byte vector accesses
        numel = tl.multiple_of(numel, 8)
        param_base = tl.multiple_of(param_base, 16)
        grad_base = tl.multiple_of(grad_base, 16)
        buf_base = tl.multiple_of(buf_base, 16)
    offsets = (packed & 0xFFFFFFFF) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    param_ptr = param_base + offsets
    grad_ptr = grad_base + offsets

    p = tl.load(param_ptr, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(grad_ptr, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        g = tl.div_rn(g, tl.load(scale_ptr).to(tl.float32))
    if MAXIMIZE:
        g = -g
    if HAS_WD:
        g = g + weight_decay * p
    if HAS_MOMENTUM:
        buf_ptr = buf_base + offsets
        fresh = tl.load(row + 7) != 0
        buf = tl.load(buf_ptr, mask=mask, other=0.0)
        buf = tl.where(fresh, g, buf * momentum + weight1 * g)
        tl.store(buf_ptr, buf, mask=mask)
        g = g + momentum * buf if NESTEROV else buf
    lr_value = tl.load(lr_ptr).to(tl.float32) if LR_TENSOR else lr
    p = p - lr_value * g

    if ROUND_BF16:  # fp32 -> bf16 on the bits: the same rounding compiled and interpreted
        bits = p.to(tl.uint32, bitcast=True)
        if STOCHASTIC:  # + a uniform 16-bit integer, then truncate: unbiased
            counter = tl.load(rng_ptr).to(tl.uint32)
            key = seed.to(tl.uint32) ^ (counter * 0x9E3779B9)
            key = key ^ (key >> 16)
            key = key * 0x85EBCA6B
            key = key ^ (key >> 13)
            key = key * 0xC2B2AE35
            key = key ^ (key >> 16)
            key = key ^ (index.to(tl.uint32) * 0xA7D4EB2F)
            h = offsets.to(tl.uint32) ^ key
            h = h ^ (h >> 16)
            h = h * 0x85EBCA6B
            h = h ^ (h >> 13)
            h = h * 0xC2B2AE35
            h = h ^ (h >> 16)
            increment = h & 0xFFFF
        else:  # to nearest, ties to even
            increment = 0x7FFF + ((bits >> 16) & 1)
        special = (bits & 0x7F800000) == 0x7F800000  # inf keeps its bits, NaN stays a NaN
        quiet = tl.where((bits & 0x7FFFFF) != 0, 0x400000, 0)
        bits = tl.where(special, bits | quiet, bits + increment)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        tl.store(param_ptr, rounded, mask=mask)
    else:
        tl.store(param_ptr, p.to(P_DTYPE), mask=mask)


def _lion_kernel(  # type: ignore[no-untyped-def]
    blocks,
    rows,
    lr_ptr,
    lr,
    beta1,
    weight1,
    weight2,
    weight_decay,
    decay,
    scale_ptr,
    found_ptr,
    rng_ptr,
    seed,
    P_DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr,
    LR_TENSOR: tl.constexpr,
    HAS_WD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    """Lion (as optiplug-lion): ``p -= lr * sign(beta1*m + (1-beta1)*g)``, ``m = lerp(m, g, 1-beta2)``."""
    packed = tl.load(blocks + tl.program_id(0))
    index = packed >> 32
    row = rows + index * 8
    numel = tl.load(row)
    if HAS_INF:  # skipped step: every element is masked off
        numel = tl.where(tl.load(found_ptr) == 0, numel, 0)
    param_base = tl.load(row + 1).to(tl.pointer_type(P_DTYPE))
    grad_base = tl.load(row + 2).to(tl.pointer_type(P_DTYPE))
    m_base = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    if ALIGNED:  # 16-byte aligned addresses, sizes a multiple of 8: 16-byte vector accesses
        numel = tl.multiple_of(numel, 8)
        param_base = tl.multiple_of(param_base, 16)
        grad_base = tl.multiple_of(grad_base, 16)
        m_base = tl.multiple_of(m_base, 16)
    offsets = (packed & 0xFFFFFFFF) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    param_ptr = param_base + offsets
    grad_ptr = grad_base + offsets
    m_ptr = m_base + offsets

    p = tl.load(param_ptr, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(grad_ptr, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr, mask=mask, other=0.0)
    if HAS_SCALE:
        g = tl.div_rn(g, tl.load(scale_ptr).to(tl.float32))
    if MAXIMIZE:
        g = -g
    lr_value = tl.load(lr_ptr).to(tl.float32) if LR_TENSOR else lr
    c = m * beta1 + g * weight1
    direction = tl.where(c > 0, 1.0, tl.where(c < 0, -1.0, 0.0))
    if HAS_WD:
        p = p * (1.0 - lr_value * weight_decay) if LR_TENSOR else p * decay
    p = p - lr_value * direction
    # torch's lerp(m, g, w): m + w * (g - m) for w < 0.5, else g - (g - m) * (1 - w)
    m = tl.where(weight2 < 0.5, m + weight2 * (g - m), g - (g - m) * (1.0 - weight2))
    tl.store(m_ptr, m, mask=mask)

    if ROUND_BF16:  # fp32 -> bf16 on the bits: the same rounding compiled and interpreted
        bits = p.to(tl.uint32, bitcast=True)
        if STOCHASTIC:  # + a uniform 16-bit integer, then truncate: unbiased
            counter = tl.load(rng_ptr).to(tl.uint32)
            key = seed.to(tl.uint32) ^ (counter * 0x9E3779B9)
            key = key ^ (key >> 16)
            key = key * 0x85EBCA6B
            key = key ^ (key >> 13)
            key = key * 0xC2B2AE35
            key = key ^ (key >> 16)
            key = key ^ (index.to(tl.uint32) * 0xA7D4EB2F)
            h = offsets.to(tl.uint32) ^ key
            h = h ^ (h >> 16)
            h = h * 0x85EBCA6B
            h = h ^ (h >> 13)
            h = h * 0xC2B2AE35
            h = h ^ (h >> 16)
            increment = h & 0xFFFF
        else:  # to nearest, ties to even
            increment = 0x7FFF + ((bits >> 16) & 1)
        special = (bits & 0x7F800000) == 0x7F800000  # inf keeps its bits, NaN stays a NaN
        quiet = tl.where((bits & 0x7FFFFF) != 0, 0x400000, 0)
        bits = tl.where(special, bits | quiet, bits + increment)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        tl.store(param_ptr, rounded, mask=mask)
    else:
        tl.store(param_ptr, p.to(P_DTYPE), mask=mask)


def _step_kernel(  # type: ignore[no-untyped-def]
    rows,
    count,
    found_ptr,
    COLUMN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_INF: tl.constexpr,
):
    """Add 1 to every tensor's fp32 step counter (nothing when ``found_inf`` is nonzero)."""
    if HAS_INF:  # skipped step: no tensor's counter moves
        count = tl.where(tl.load(found_ptr) == 0, count, 0)
    indices = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = indices < count
    addresses = tl.load(rows + indices * 8 + COLUMN, mask=mask, other=0)
    step_ptr = addresses.to(tl.pointer_type(tl.float32))
    steps = tl.load(step_ptr, mask=mask, other=0.0)
    tl.store(step_ptr, steps + 1.0, mask=mask)


_SOURCES: dict[str, Callable[..., None]] = {
    "adam": _adam_kernel,
    "sgd": _sgd_kernel,
    "lion": _lion_kernel,
    "step": _step_kernel,
}
_lock = threading.Lock()
_built: dict[tuple[str, bool], Any] = {}


def kernel(name: str, interpret: bool) -> Any:
    """The launchable kernel ``name`` (``kernel[grid](...)``), compiled or interpreted.

    Args:
        name: ``"adam"``, ``"sgd"``, ``"lion"`` or ``"step"``.
        interpret: True for triton's CPU interpreter (CPU tensors), False
            for the compiler (CUDA tensors).

    Returns:
        A triton ``JITFunction`` or ``InterpretedFunction``, built once per
        (name, mode).

    Raises:
        KeyError: an unknown kernel name.
    """
    key = (name, interpret)
    with _lock:
        if key not in _built:
            source = _SOURCES[name]
            _built[key] = InterpretedFunction(source) if interpret else triton.JITFunction(source)
        return _built[key]


TRITON_DTYPES: dict[str, Any] = {
    "float32": tl.float32,
    "bfloat16": tl.bfloat16,
    "float16": tl.float16,
}
"""torch dtype name -> triton dtype of the parameter pointers."""

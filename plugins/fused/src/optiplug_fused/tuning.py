"""Measure the update kernels' ``(BLOCK, num_warps)`` on a device and keep the fastest.

The best launch configuration depends on the device (registers per SM,
bandwidth, latency): compiled for sm_90a, one configuration can hold half the
blocks per SM of another. :func:`sweep` times AdamW steps over synthetic
parameters (half of them of a size that is a multiple of 8, half not: both
the aligned and the unaligned kernel variants run) for each candidate, and
with ``apply=True`` makes the fastest the device's choice
(:func:`optiplug_fused.kernels.set_launch_config`) for tables built
afterwards in this process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import kernels

__all__ = ["CANDIDATES", "LaunchTiming", "sweep"]

CANDIDATES: tuple[tuple[int, int], ...] = (
    (1024, 4),
    (2048, 4),
    (2048, 8),
    (4096, 4),
    (4096, 8),
    (8192, 8),
    (8192, 16),
)
"""``(BLOCK, num_warps)`` pairs tried by default: 4 to 32 elements per thread."""


@dataclass(frozen=True)
class LaunchTiming:
    """One candidate's time per AdamW step over the sweep's parameters."""

    block: int
    num_warps: int
    seconds: float


def sweep(
    device: Any,
    *,
    dtype: torch.dtype = torch.float32,
    numel: int = 1 << 26,
    tensors: int = 8,
    steps: int = 20,
    candidates: Sequence[tuple[int, int]] = CANDIDATES,
    apply: bool = True,
) -> list[LaunchTiming]:
    """Time AdamW steps for every candidate on ``device``; fastest first.

    Args:
        device: a CUDA device (or the CPU under ``TRITON_INTERPRET=1``).
        dtype: the parameters' dtype (state is fp32 whatever it is).
        numel: about how many parameters, split over ``tensors`` tensors.
        tensors: how many tensors (every other one a size not a multiple of 8).
        steps: timed steps per candidate, after two untimed (compiling) ones.
        candidates: the ``(BLOCK, num_warps)`` pairs to try.
        apply: make the fastest the device's launch configuration; otherwise
            the configuration is left as it was.

    Returns:
        One timing per candidate, fastest first.

    Raises:
        HyperparameterError: a candidate outside ``kernels.BLOCKS`` /
            ``kernels.WARPS``.
    """
    device = torch.device(device)
    before = kernels.launch_config(device)
    had_choice = kernels.has_launch_config(device)
    size = max(1, numel // max(1, tensors)) // 8 * 8 or 8
    grads = [torch.randn(size + i % 2, device=device).to(dtype) for i in range(tensors)]
    results = []
    try:
        for block, num_warps in candidates:
            kernels.set_launch_config(device, block, num_warps)
            seconds = _time_adamw(grads, steps)
            results.append(LaunchTiming(block, num_warps, seconds))
    finally:
        if had_choice:
            kernels.set_launch_config(device, *before)
        else:
            kernels.reset_launch_config(device)
    results.sort(key=lambda timing: timing.seconds)
    if apply and results:
        kernels.set_launch_config(device, results[0].block, results[0].num_warps)
    return results


def _time_adamw(grads: list[torch.Tensor], steps: int) -> float:
    """Seconds per step of a triton AdamW over fresh parameters with ``grads`` kept."""
    from .optimizers import TritonAdamW  # deferred: imports torch

    params = [torch.nn.Parameter(torch.zeros_like(grad)) for grad in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    optimizer = TritonAdamW(params, lr=1e-4)
    device = grads[0].device
    for _ in range(2):  # compiles, builds the table and the state
        optimizer.step()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        return (time.perf_counter() - start) / max(1, steps)
    torch.cuda.synchronize(device)
    begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    begin.record()
    for _ in range(steps):
        optimizer.step()
    end.record()
    end.synchronize()
    return float(begin.elapsed_time(end)) / 1e3 / max(1, steps)

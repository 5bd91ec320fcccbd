"""Choose the fastest implementation by measurement, once per process.

On a CPU torch's foreach paths are slower than its per-tensor loop and fused
kernels beat both; on a GPU foreach beats the loop. No fixed order is right
everywhere, so ``impl=None`` times each supported implementation for a few
steps on synthetic tensors shaped like the user's (never touching them or the
global RNG) and caches the winner per (algorithm, device type, dtype,
candidates). ``OPTIPLUG_AUTOTUNE=0`` skips measuring and uses each
implementation's declared ``priority``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ._specs import ImplementationSpec

__all__ = ["choose", "clear_cache", "decisions", "synthetic_parameters", "time_steps"]

_MAX_TENSORS = 8
_MAX_ELEMENTS = 1 << 18
_WARMUP_STEPS = 2
_TIMED_STEPS = 5

_lock = threading.Lock()
_decisions: dict[tuple[Any, ...], tuple[str, dict[str, float]]] = {}


def decisions() -> dict[tuple[Any, ...], tuple[str, dict[str, float]]]:
    """The cached choices: key -> (winner, {implementation: median seconds})."""
    with _lock:
        return dict(_decisions)


def clear_cache() -> None:
    """Forget every measured choice (e.g. after changing threads)."""
    with _lock:
        _decisions.clear()


def synthetic_parameters(params: Sequence[torch.Tensor], seed: int = 0) -> list[torch.Tensor]:
    """Fresh tensors like ``params`` (device, dtype, shape), sized for a quick timing.

    Up to 8 tensors; those larger than 2**18 elements are replaced by flat
    tensors of that size, so timing stays in the milliseconds. Gradients are
    filled from a private generator; the global RNG is not touched.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    made = []
    for param in list(params)[:_MAX_TENSORS]:
        shape = param.shape if param.numel() <= _MAX_ELEMENTS else (_MAX_ELEMENTS,)
        values = torch.randn(shape, generator=generator, dtype=torch.float32)
        tensor = values.to(device=param.device, dtype=param.dtype).requires_grad_(True)
        tensor.grad = torch.randn(shape, generator=generator).to(param.device, param.dtype)
        made.append(tensor)
    return made


def time_steps(optimizer: torch.optim.Optimizer, steps: int, device: torch.device) -> float:
    """Median wall time of one ``optimizer.step()`` over ``steps`` steps."""
    times = []
    for _ in range(steps):
        _synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(
    impl: ImplementationSpec, params: Sequence[torch.Tensor], hparams: Mapping[str, Any]
) -> float:
    sample = synthetic_parameters(params)
    optimizer = impl.factory(sample, **hparams)
    time_steps(optimizer, _WARMUP_STEPS, sample[0].device)
    return time_steps(optimizer, _TIMED_STEPS, sample[0].device)


def choose(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
) -> ImplementationSpec:
    """Return the fastest of ``candidates`` (all of which support ``params``).

    Args:
        algorithm: the algorithm's name (part of the cache key).
        candidates: implementations that can run ``params``; at least one.
        params: the user's parameter tensors (only their metadata is used).
        hparams: hyperparameters to time with (e.g. momentum changes the work).

    Returns:
        The fastest candidate; by declared priority, then name, when there is
        a single candidate, no parameters, or ``OPTIPLUG_AUTOTUNE=0``.
    """
    ranked = sorted(candidates, key=lambda impl: (-impl.priority, impl.name))
    if len(ranked) == 1 or not params or os.environ.get("OPTIPLUG_AUTOTUNE", "1") == "0":
        return ranked[0]
    first = params[0]
    key = (algorithm, first.device.type, first.dtype, tuple(impl.name for impl in ranked))
    with _lock:
        cached = _decisions.get(key)
    if cached is None:
        timings = {impl.name: _measure(impl, params, hparams) for impl in ranked}
        winner = min(ranked, key=lambda impl: timings[impl.name]).name
        cached = (winner, timings)
        with _lock:
            _decisions[key] = cached
    return next(impl for impl in ranked if impl.name == cached[0])

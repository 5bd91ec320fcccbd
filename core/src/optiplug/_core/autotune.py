"""Choose the fastest implementation by measurement, once per process.

On a CPU torch's foreach paths are slower than its per-tensor loop and fused
kernels beat both; on a GPU foreach beats the loop. No fixed order is right
everywhere, so ``impl=None`` times each supported implementation for a few
steps on synthetic tensors shaped like the user's (never touching them or the
global RNG) and caches the winner per (algorithm, device type, dtype,
candidates). ``OPTIPLUG_AUTOTUNE=0`` skips measuring and uses each
implementation's declared ``priority``.

A candidate that raises (while being timed, or while its ``supports`` check
runs) is skipped, recorded in :func:`implementation_failures` and warned
about once per process (:func:`report_failure`); the others still compete.

Under ``torch.distributed`` every rank must run the same kernels: fused and
loop kernels round differently (by an ulp), so ranks that each picked their
own winner drift apart. Inside :func:`agreed_across_ranks` (which
``Graph.set_optimizer`` enters on every rank) each rank measures and the
slowest rank's time decides, through one all-reduce; elsewhere in a
multi-process group nothing is measured and the declared priority decides.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import statistics
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import HyperparameterError, PluginWarning
from . import ranks as _ranks
from .specs import ImplementationSpec

__all__ = [
    "agreed_across_ranks",
    "choose",
    "clear_cache",
    "decisions",
    "implementation_failures",
    "report_failure",
    "select",
    "synthetic_parameters",
    "tensor_kinds",
    "time_steps",
]

_MAX_TENSORS = 8
_MAX_ELEMENTS = 1 << 18
_WARMUP_STEPS = 2
_TIMED_STEPS = 5

_lock = threading.Lock()
_decisions: dict[tuple[Any, ...], tuple[str, dict[str, float]]] = {}
_agreed: dict[tuple[Any, ...], tuple[str, dict[str, float]]] = {}
_failures: dict[tuple[str, str, str], str] = {}
_agreement: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar(
    "optiplug_autotune_agreement", default=None
)


def decisions(agreed: bool = False) -> dict[tuple[Any, ...], tuple[str, dict[str, float]]]:
    """The cached choices: key -> (winner, {implementation: median seconds}).

    Args:
        agreed: the choices agreed across ranks (slowest rank's times)
            instead of this process's own.
    """
    with _lock:
        return dict(_agreed if agreed else _decisions)


def clear_cache() -> None:
    """Forget every measured choice, own and agreed, and every recorded failure."""
    with _lock:
        _decisions.clear()
        _agreed.clear()
        _failures.clear()


def implementation_failures() -> dict[tuple[str, str, str], str]:
    """Implementations skipped in this process: ``(algorithm, name, plugin) -> error``.

    The error is ``"TypeName: message"``; the plugin is ``""`` for a record
    without a provider. The latest failure of each implementation is kept.
    """
    with _lock:
        return dict(_failures)


def report_failure(impl: ImplementationSpec, error: BaseException) -> None:
    """Record that ``impl`` failed and is skipped; warn the first time in this process.

    Args:
        impl: the implementation that raised.
        error: what it raised.
    """
    plugin = impl.provider.plugin if impl.provider is not None else ""
    key = (impl.algorithm, impl.name, plugin)
    text = f"{type(error).__name__}: {error}"
    with _lock:
        first = key not in _failures
        _failures[key] = text
    if first:
        origin = f" from plugin {impl.provider}" if impl.provider is not None else ""
        warnings.warn(
            f"optiplug: implementation {impl.name!r} of {impl.algorithm!r}{origin} failed "
            f"and is skipped ({text}); the next candidate is used, impl={impl.name!r} forces it",
            PluginWarning,
            stacklevel=5,
        )


@contextlib.contextmanager
def agreed_across_ranks(device: torch.device) -> Iterator[None]:
    """Within: choices are measured on every rank and agreed by one all-reduce each.

    Every rank of the default process group must create the same optimizers
    inside the block (as ``Graph.set_optimizer`` does), or the all-reduce
    waits for the missing ranks until the group's timeout.

    Args:
        device: where the all-reduced timings live (CUDA for NCCL, CPU for gloo).
    """
    token = _agreement.set(torch.device(device))
    try:
        yield
    finally:
        _agreement.reset(token)


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


def _measured(
    impl: ImplementationSpec, params: Sequence[torch.Tensor], hparams: Mapping[str, Any]
) -> float:
    """:func:`_measure`, or infinity (never the winner) for a candidate that raises."""
    try:
        return _measure(impl, params, hparams)
    except Exception as error:
        report_failure(impl, error)
        return math.inf


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
        The fastest candidate (across ranks inside :func:`agreed_across_ranks`);
        by declared priority, then name, when there is a single candidate, no
        parameters, ``OPTIPLUG_AUTOTUNE=0``, or several ranks and no agreement.
        A candidate that raises while timed counts as infinitely slow (on
        every rank, when agreed), so it wins only if all of them raised.
    """
    ranked = sorted(candidates, key=lambda impl: (-impl.priority, impl.name))
    if len(ranked) == 1 or not params or os.environ.get("OPTIPLUG_AUTOTUNE", "1") == "0":
        return ranked[0]
    agreement = _agreement.get()
    if agreement is None and _ranks.world_size() > 1:
        return ranked[0]
    first = params[0]
    key = (algorithm, first.device.type, first.dtype, tuple(impl.name for impl in ranked))
    cache = _decisions if agreement is None else _agreed
    with _lock:
        cached = cache.get(key)
    if cached is None:
        timings = {impl.name: _measured(impl, params, hparams) for impl in ranked}
        if agreement is not None:
            timings = _slowest_rank(timings, agreement)
        winner = min(ranked, key=lambda impl: timings[impl.name]).name
        cached = (winner, timings)
        with _lock:
            cache[key] = cached
    return next(impl for impl in ranked if impl.name == cached[0])


def select(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    impl: str | None,
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
) -> ImplementationSpec | None:
    """The implementation to run: ``impl`` when forced (checked), else the fastest runnable.

    The one place the rules live, for :func:`optiplug.create` and for
    optimizer classes built on :mod:`optiplug.base`.

    Args:
        algorithm: the algorithm's name (errors and the cache key).
        candidates: every implementation of the algorithm.
        impl: the implementation the user forced, or None to choose.
        params: the parameter tensors.
        hparams: hyperparameters to time with.

    Returns:
        The chosen record; None when ``impl`` is None and no candidate can
        run ``params``.

    Raises:
        HyperparameterError: ``impl`` names no candidate, or one that cannot
            run ``params``.
    """
    if impl is not None:
        chosen = next((c for c in candidates if c.name == impl), None)
        if chosen is None:
            names = ", ".join(sorted(c.name for c in candidates)) or "none registered"
            raise HyperparameterError(
                "impl", impl, f"no such implementation; available: {names}", algorithm=algorithm
            )
        if not chosen.can_run(params):
            raise HyperparameterError(
                "impl",
                impl,
                f"does not support these parameters ({tensor_kinds(params)})",
                algorithm=algorithm,
            )
        return chosen
    runnable = _runnable(candidates, params)
    return choose(algorithm, runnable, params, hparams) if runnable else None


def _runnable(
    candidates: Sequence[ImplementationSpec], params: Sequence[torch.Tensor]
) -> list[ImplementationSpec]:
    """The candidates that can run ``params``; one whose check raises is reported and skipped."""
    found = []
    for candidate in candidates:
        try:
            if candidate.can_run(params):
                found.append(candidate)
        except Exception as error:
            report_failure(candidate, error)
    return found


def tensor_kinds(params: Sequence[torch.Tensor]) -> str:
    """``"cpu/torch.float32, cuda/torch.bfloat16"``: the device/dtype pairs in ``params``."""
    return ", ".join(sorted({f"{p.device.type}/{p.dtype}" for p in params}))


def _slowest_rank(timings: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each implementation's time on the slowest rank (one MAX all-reduce).

    MAX is exact, so every rank gets bit-identical times and the same winner.
    """
    names = list(timings)
    values = torch.tensor([timings[name] for name in names], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
    return dict(zip(names, values.tolist(), strict=True))

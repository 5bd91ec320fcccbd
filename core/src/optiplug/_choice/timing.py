"""Timing implementations on synthetic parameters: the stateless half of implementation choice.

How a choice is measured (:meth:`ImplementationChooser.measure
<optiplug._choice.chooser.ImplementationChooser.measure>`):

* the sample (:func:`synthetic_parameters`) has the parameters' own shapes
  while they hold at most :func:`sample_bound` elements in all (64M on CUDA,
  4M elsewhere); beyond it, a size-stratified subset of the tensors keeps
  count and elements in the same proportion (per-launch and per-byte costs
  scale together), shrunk further only if one tensor alone is too big;
* each candidate is built and stepped :data:`WARMUP_STEPS` times untimed
  (compilation, first call, allocation of its state), in a worker thread
  joined with a time budget (:func:`budgets`): a candidate whose warm-up
  exceeds it is dropped from timing, with the reason recorded, and finishes
  its current step in the background instead of being waited for;
* the others are timed in paired rounds of one step each (the order
  rotating) by :mod:`.rounds`, which decides from the ratios within rounds,
  sees preemption in the CPU time the timing thread got (:class:`OptimizerTimer`)
  and goes on timing while the decision is in doubt; rounds after the first
  stop when the overall budget is spent.

Nothing here keeps state: the records of what was measured belong to a
registry's chooser.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

from .._core.lifecycle import set_training
from .._core.specs import ImplementationSpec
from ..errors import HyperparameterError
from .rounds import MIN_ROUNDS, StepSample

__all__ = [
    "BUDGET_VARIABLE",
    "MAX_BUDGET",
    "TIMED_ROUNDS",
    "WARMUP_STEPS",
    "Measurement",
    "OptimizerTimer",
    "availability_reason",
    "budgets",
    "copies",
    "sample_bound",
    "synchronize",
    "synthetic_parameters",
    "tensor_kinds",
    "time_steps",
    "timed_step",
]

WARMUP_STEPS = 2
"""Untimed steps per candidate: the first pays compilation and state allocation."""

TIMED_ROUNDS = MIN_ROUNDS
"""Paired rounds of one timed step per candidate always timed (:data:`.rounds.MIN_ROUNDS`)."""

BUDGET_VARIABLE = "OPTIPLUG_AUTOTUNE_BUDGET"
"""Environment variable: seconds one candidate's warm-up may take (the overall budget is twice)."""

_SAMPLE_BOUND = {"cuda": 64 << 20}
_DEFAULT_SAMPLE_BOUND = 4 << 20
_CANDIDATE_BUDGET = {"cuda": 10.0}
_DEFAULT_CANDIDATE_BUDGET = 4.0

MAX_BUDGET = 86400.0
"""The most seconds ``OPTIPLUG_AUTOTUNE_BUDGET`` gives a candidate's warm-up (one day): a
larger value means "no limit", and counts as this (beyond about 9.2e9 s a wait cannot be set)."""

_OVERALL_FACTOR = 2.0

_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
"""Per-thread resource usage (Linux); None where the system has none."""


@attrs.frozen
class Measurement:
    """One timing of an algorithm's candidates, as a chooser measures it.

    Attributes:
        winner: the fastest timed candidate (by priority, then name, when none
            could be timed).
        timings: seconds per step of every candidate (its typical step time,
            placed by its paired ratios to the others: see :mod:`.rounds`);
            ``math.inf`` for one that was dropped or raised.
        dropped: candidate -> why it was not timed (its warm-up exceeded the
            budget, is still running from an earlier measurement, or raised).
        late: the dropped candidates that ran out of time (not those that
            raised): their one-time cost is still being paid.
        tensors: how many synthetic tensors were timed.
        elements: how many elements they hold in all.
        seconds: wall time the whole measurement took.
        source: ``"measured"`` in this process, ``"cache"``: read from the
            autotune cache file, nothing timed (the timings are the stored
            ones, ``tensors`` and ``elements`` are 0), or ``"pending"``: being
            measured in the background, ``winner`` being the implementation
            in use meanwhile (no timings yet).
        trusted: whether the rounds decided beyond doubt (:mod:`.rounds`); a
            measurement in doubt is neither kept nor written to the cache file.
        doubt: why it is in doubt ("" when trusted).
        rounds: how many paired rounds were timed.
        preempted: the share of timed steps during which the timing thread
            was preempted (see :class:`OptimizerTimer`).
    """

    winner: str
    timings: dict[str, float]
    dropped: dict[str, str] = attrs.field(factory=dict)
    late: tuple[str, ...] = ()
    tensors: int = 0
    elements: int = 0
    seconds: float = 0.0
    source: str = "measured"
    trusted: bool = True
    doubt: str = ""
    rounds: int = 0
    preempted: float = 0.0


def sample_bound(device: torch.device) -> int:
    """Most elements the synthetic tensors of one timing hold in all on ``device``.

    64M (2**26) on CUDA, where launches dominate anything smaller; 4M (2**22)
    elsewhere, so that on a CPU the slowest implementation's steps stay in the
    tens of milliseconds and creating an optimizer stays fast.

    Args:
        device: the parameters' device.

    Returns:
        The bound, in elements.
    """
    return _SAMPLE_BOUND.get(torch.device(device).type, _DEFAULT_SAMPLE_BOUND)


def budgets(device: torch.device) -> tuple[float, float]:
    """Seconds one candidate's warm-up may take, and the whole measurement.

    Defaults: 10 s per candidate on CUDA (a first compilation there takes
    seconds), 4 s elsewhere; the overall budget is twice the per-candidate
    one. ``OPTIPLUG_AUTOTUNE_BUDGET=SECONDS`` sets the per-candidate budget;
    a value above :data:`MAX_BUDGET` (one day) counts as one day.

    Args:
        device: the parameters' device.

    Returns:
        ``(per candidate, overall)``.

    Raises:
        HyperparameterError: ``OPTIPLUG_AUTOTUNE_BUDGET`` is not a positive number.
    """
    raw = os.environ.get(BUDGET_VARIABLE)
    if raw is None or not raw.strip():
        per = _CANDIDATE_BUDGET.get(torch.device(device).type, _DEFAULT_CANDIDATE_BUDGET)
    else:
        try:
            per = float(raw)
        except ValueError:
            per = math.nan
        if not math.isfinite(per) or per <= 0:
            raise HyperparameterError(
                BUDGET_VARIABLE, raw, "must be a positive number of seconds", algorithm="autotune"
            )
        per = min(per, MAX_BUDGET)
    return per, per * _OVERALL_FACTOR


def _sample_plan(shapes: Sequence[torch.Size], bound: int) -> list[tuple[int, tuple[int, ...]]]:
    """``(index into shapes, shape to time)``: every shape when they fit ``bound``, else a subset.

    Beyond the bound the tensors are sorted by size and one is taken from the
    middle of each of ``count`` equal strata, ``count`` being the number of
    tensors scaled like the elements (at least one), so per-tensor and
    per-element costs shrink together; if the picked ones still hold more
    than ``bound`` elements (a few huge tensors), the largest are shrunk to a
    common cap, the smaller ones kept as they are.
    """
    sizes = [math.prod(shape) for shape in shapes]
    total = sum(sizes)
    if total <= bound:
        return [(index, tuple(shape)) for index, shape in enumerate(shapes)]
    count = max(1, min(len(shapes), round(len(shapes) * bound / total)))
    order = sorted(range(len(shapes)), key=lambda index: sizes[index])
    picked = [order[int((i + 0.5) * len(order) / count)] for i in range(count)]
    cap = _cap([sizes[index] for index in picked], bound)
    return [
        (index, _shrunk(tuple(shapes[index]), min(1.0, cap / max(1, sizes[index]))))
        for index in picked
    ]


def _cap(sizes: Sequence[int], bound: int) -> int:
    """The largest ``cap`` with ``sum(min(size, cap)) <= bound`` (any cap when they fit)."""
    if sum(sizes) <= bound:
        return max(sizes, default=0)
    remaining, ordered = bound, sorted(sizes)
    for position, size in enumerate(ordered):
        share = remaining // (len(ordered) - position)
        if size > share:
            return max(1, share)
        remaining -= size
    return max(1, remaining)


def _shrunk(shape: tuple[int, ...], factor: float) -> tuple[int, ...]:
    """``shape`` holding about ``factor`` of its elements: fewer rows, else flat."""
    if factor >= 1.0:
        return shape
    target = max(1, int(math.prod(shape) * factor))
    if len(shape) >= 2:
        rest = math.prod(shape[1:])
        if rest <= target:
            return (target // rest, *shape[1:])
    return (target,)


def synthetic_parameters(
    params: Sequence[torch.Tensor], seed: int = 0, *, bound: int | None = None
) -> list[torch.Tensor]:
    """Fresh tensors like ``params`` (device, dtype, size distribution), for timing.

    While ``params`` hold at most ``bound`` elements in all (default
    :func:`sample_bound` of the first parameter's device) the tensors have
    their shapes exactly; beyond it, a size-stratified subset with tensors
    and elements scaled by the same factor (see the module docstring).
    Values and gradients come from a private generator; the global RNG is
    not touched.

    Args:
        params: the parameters to imitate (only their metadata is read).
        seed: the private generator's seed.
        bound: most elements in all; None for :func:`sample_bound`.

    Returns:
        Leaf tensors with ``requires_grad`` and a ``.grad``.
    """
    params = list(params)
    if not params:
        return []
    limit = sample_bound(params[0].device) if bound is None else bound
    generators: dict[torch.device, torch.Generator] = {}
    made = []
    for index, shape in _sample_plan([p.shape for p in params], limit):
        source = params[index]
        device = source.device
        # On CUDA the values are drawn there (copying 64M elements from the host
        # would cost more than the timing); elsewhere on the host, then moved.
        where = device if device.type == "cuda" else torch.device("cpu")
        if where not in generators:
            generators[where] = torch.Generator(device=where).manual_seed(seed)
        draws = [
            torch.randn(shape, generator=generators[where], device=where, dtype=torch.float32)
            for _ in range(2)
        ]
        values, grad = (draw.to(device=device, dtype=source.dtype) for draw in draws)
        tensor = values.requires_grad_(True)
        tensor.grad = grad
        made.append(tensor)
    return made


def copies(sample: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Independent copies of ``sample`` (values and gradients), one set per candidate."""
    copies = []
    for tensor in sample:
        copy = tensor.detach().clone().requires_grad_(True)
        copy.grad = None if tensor.grad is None else tensor.grad.clone()
        copies.append(copy)
    return copies


def time_steps(optimizer: torch.optim.Optimizer, steps: int, device: torch.device) -> float:
    """Median wall time of one ``optimizer.step()`` over ``steps`` steps.

    Args:
        optimizer: the optimizer to step (its parameters need gradients).
        steps: how many steps to time, one by one.
        device: synchronized around each step when it is a CUDA device.

    Returns:
        Seconds.
    """
    set_training(optimizer, True)  # a schedule-free optimizer steps in its training mode only
    times = []
    step = timed_step(optimizer)
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class OptimizerTimer:
    """The chooser's :class:`~.rounds.StepTimer`: one real step of a warmed-up optimizer.

    Reports the step's wall time and, on a CPU, what the scheduler did to
    the calling thread meanwhile, which runs a CPU step itself (it is its
    OpenMP team's first thread): its involuntary context switches where the
    system counts them per thread (``getrusage(RUSAGE_THREAD)``, Linux),
    else its CPU time (:func:`time.thread_time`). Its CPU time alone would
    call every multi-threaded step preempted, as the first thread sleeps at
    each barrier while the others finish. A CUDA step waits in a
    synchronize, so there it reports neither.

    Args:
        optimizers: the candidates' optimizers by name.
        device: their device (synchronized around each CUDA step).
    """

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer], device: torch.device):
        for optimizer in optimizers.values():
            set_training(optimizer, True)  # a schedule-free optimizer steps in training mode only
        self._steps = {name: timed_step(optimizer) for name, optimizer in optimizers.items()}
        self._device = torch.device(device)

    def __call__(self, name: str) -> StepSample:
        """Take and time one step of ``name``."""
        step = self._steps[name]
        synchronize(self._device)
        switches, wall, cpu = _switches(), time.perf_counter(), time.thread_time()
        step()
        synchronize(self._device)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        if self._device.type == "cuda":
            return StepSample(wall)
        after = _switches()
        return StepSample(
            wall, cpu, None if switches is None or after is None else after - switches
        )


def _switches() -> int | None:
    """The calling thread's involuntary context switches so far, where the system counts them."""
    if _RUSAGE_THREAD is None:
        return None
    return int(resource.getrusage(_RUSAGE_THREAD).ru_nivcsw)


def timed_step(optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
    """What one timed step calls: a step on the gradients the sample already holds.

    A class whose ``step`` requires a closure (torch's L-BFGS, schedule-free's
    closure forms) is given one that leaves those gradients as they are and
    returns a zero loss: the step's arithmetic is what is timed.

    Args:
        optimizer: the optimizer to step.

    Returns:
        A callable taking one step.
    """
    try:
        closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    except (TypeError, ValueError):
        closure = None
    if closure is not None and closure.default is inspect.Parameter.empty:
        return functools.partial(optimizer.step, lambda: 0.0)
    return optimizer.step


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def availability_reason(impl: ImplementationSpec) -> str | None:
    """Why ``impl`` cannot run on this machine, or None when it can.

    An availability check that raises makes the implementation unavailable,
    with the error as the reason; it never breaks the other implementations.

    Args:
        impl: the implementation record.

    Returns:
        ``impl.unavailable_reason()``, or ``"availability check raised
        TypeName: message"``.
    """
    try:
        reason = impl.unavailable_reason()
    except Exception as error:
        return f"availability check raised {type(error).__name__}: {error}"
    return None if reason is None else str(reason)


def tensor_kinds(params: Sequence[torch.Tensor]) -> str:
    """``"cpu/torch.float32, cuda/torch.bfloat16 DTensor"``: the device/dtype pairs in ``params``.

    Args:
        params: tensors.

    Returns:
        The sorted, comma-separated pairs.
    """
    return ", ".join(sorted({f"{p.device.type}/{p.dtype}{_sharded(p)}" for p in params}))


def _sharded(tensor: torch.Tensor) -> str:
    """`` DTensor`` for a distributed tensor (FSDP2's parameters), else nothing."""
    return " DTensor" if type(tensor).__name__ == "DTensor" else ""

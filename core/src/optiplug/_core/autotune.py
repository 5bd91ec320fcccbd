"""Choose the fastest implementation by measurement, once per process.

On a CPU torch's foreach paths are slower than its per-tensor loop and fused
kernels beat both; on a GPU foreach beats the loop. No fixed order is right
everywhere, and the answer changes with the sizes (launch costs dominate
small tensors, memory traffic large ones), so ``impl=None`` times each
available implementation that supports the parameters on synthetic tensors
with the user's size distribution (never touching the user's tensors or the
global RNG) and caches the winner per (algorithm, device type, dtype,
candidates). ``OPTIPLUG_AUTOTUNE=0`` (or ``false``, ``no``, ``off``) skips
measuring and uses each implementation's declared ``priority``.

How a choice is measured (:func:`measure`):

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
* the others are timed in :data:`TIMED_ROUNDS` interleaved rounds of one
  step each (the order rotating), and each one's time is the median; rounds
  after the first stop when the overall budget is spent.

A candidate that raises (while being timed, or while its ``supports`` check
runs) is skipped, recorded in :func:`implementation_failures` and warned
about once per process (:func:`report_failure`); the others still compete.
An implementation whose ``availability`` says it cannot run on this machine
(:func:`availability_reason`) never competes; forcing it raises
:class:`~optiplug.errors.OptimizerUnavailableError`.

Under ``torch.distributed`` every rank must run the same kernels: fused and
loop kernels round differently (by an ulp), so ranks that each picked their
own winner drift apart. Inside :func:`agreed_across_ranks` (which
``Graph.set_optimizer`` enters on every rank) each rank measures and the
slowest rank's time decides, through one all-reduce; elsewhere in a
multi-process group nothing is measured and the declared priority decides.

Choices also persist across processes (:mod:`.autotune_cache`): a measured
choice is written to a JSON file per machine, keyed by the algorithm, the
candidates, the parameters' sizes, dtype and device, torch's version, the
device's name and torch's thread count, and a later process with the same key
takes it from there without measuring (its :func:`measurements` record says
``source="cache"``). Only a complete measurement is written. In the
background, one left provisional because a candidate ran out of warm-up time
(a first compilation) is measured again once that warm-up is done; nothing
is measured at exit, where a compilation can fail or abort the interpreter.
``OPTIPLUG_AUTOTUNE_CACHE=0`` neither reads nor writes the file;
:func:`clear_autotune_cache` removes it. Under ``torch.distributed`` the file
is not used: the ranks agree on a measured choice as above.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import math
import os
import statistics
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from ..errors import HyperparameterError, OptimizerUnavailableError, PluginWarning
from . import autotune_cache as _stored
from . import decision as _decision
from . import ranks as _ranks
from .decision import Prepared
from .env import env_flag
from .specs import ImplementationSpec

__all__ = [
    "BUDGET_VARIABLE",
    "MAX_BUDGET",
    "TIMED_ROUNDS",
    "WARMUP_STEPS",
    "Measurement",
    "agreed_across_ranks",
    "autotune_cache_path",
    "availability_reason",
    "budgets",
    "choose",
    "clear_autotune_cache",
    "clear_cache",
    "decisions",
    "exclusions",
    "implementation_failures",
    "measure",
    "measurements",
    "report_failure",
    "sample_bound",
    "select",
    "synthetic_parameters",
    "tensor_kinds",
    "time_steps",
]

WARMUP_STEPS = 2
"""Untimed steps per candidate: the first pays compilation and state allocation."""

TIMED_ROUNDS = 5
"""Interleaved rounds of one timed step per candidate; a candidate's time is their median."""

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
_EXIT_WAIT = 300.0

_lock = threading.Lock()
_decisions: dict[tuple[Any, ...], tuple[str, dict[str, float]]] = {}
_agreed: dict[tuple[Any, ...], tuple[str, dict[str, float]]] = {}
_measurements: dict[tuple[Any, ...], Measurement] = {}
_failures: dict[tuple[str, str, str], str] = {}
_exclusions: dict[tuple[str, str], dict[str, str]] = {}
_warming: dict[tuple[str, str, str, str], threading.Thread] = {}
_exiting = threading.Event()
"""Set once the interpreter starts to exit: background measurements start nothing more."""
_agreement: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar(
    "optiplug_autotune_agreement", default=None
)


@attrs.frozen
class Measurement:
    """One timing of an algorithm's candidates, as :func:`measure` returns it.

    Attributes:
        winner: the fastest timed candidate (by priority, then name, when none
            could be timed).
        timings: median seconds per step of every candidate; ``math.inf`` for
            one that was dropped or raised.
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
    """

    winner: str
    timings: dict[str, float]
    dropped: dict[str, str] = attrs.field(factory=dict)
    late: tuple[str, ...] = ()
    tensors: int = 0
    elements: int = 0
    seconds: float = 0.0
    source: str = "measured"


@attrs.define(eq=False)
class Tuning:
    """A choice being measured in a background thread (see :func:`choose`).

    The optimizer built meanwhile runs :attr:`ready` and holds this record;
    at its next ``step()`` after :attr:`finished` is set it switches to
    :attr:`winner` (None when the measurement failed: it keeps :attr:`ready`).

    Attributes:
        key: the in-process decision key.
        ready: the implementation in use until the measurement completes.
        winner: the measured-fastest implementation, once measured.
        finished: set when the measurement is done (or failed).
    """

    key: tuple[Any, ...]
    ready: str
    winner: str | None = None
    finished: threading.Event = attrs.field(factory=threading.Event)
    thread: threading.Thread | None = attrs.field(default=None, repr=False)

    @property
    def pending(self) -> bool:
        """Whether the measurement is still running."""
        return not self.finished.is_set()


_tunings: dict[tuple[Any, ...], Tuning] = {}


def wait_for_measurements(timeout: float | None = None) -> bool:
    """Wait for the background measurements started so far (see :func:`choose`).

    Args:
        timeout: seconds to wait for each; None waits until each is done.

    Returns:
        True when none is still running.
    """
    with _lock:
        running = list(_tunings.values())
    return all(tuning.finished.wait(timeout) for tuning in running)


def decisions(agreed: bool = False) -> dict[tuple[Any, ...], tuple[str, dict[str, float]]]:
    """The cached choices: key -> (winner, {implementation: median seconds}).

    Measurements running in the background are waited for first.

    Args:
        agreed: the choices agreed across ranks (slowest rank's times)
            instead of this process's own.

    Returns:
        A copy of the cache; keys are ``(algorithm, device type, dtype,
        candidate names)``.
    """
    wait_for_measurements()
    with _lock:
        return dict(_agreed if agreed else _decisions)


def measurements(wait: bool = True) -> dict[tuple[Any, ...], Measurement]:
    """The latest :class:`Measurement` per cache key, dropped candidates and their reasons included.

    Measurements running in the background are waited for first, unless
    ``wait`` is False: then each shows as its ``source="pending"`` record.

    A measurement in which a candidate was dropped for its budget is kept
    here but not cached as a decision (outside an agreement across ranks):
    the next creation measures again, when that candidate's one-time cost
    has been paid in the background. A choice taken from the autotune cache
    file is recorded here too, with ``source="cache"``.

    Args:
        wait: wait for the background measurements (see :func:`choose`).

    Returns:
        A copy: key -> measurement.
    """
    if wait:
        wait_for_measurements()
    with _lock:
        return dict(_measurements)


def exclusions() -> dict[tuple[str, str], dict[str, str]]:
    """Implementations ``impl=None`` left out, and why: ``(algorithm, tensor kinds) -> {name: reason}``.

    The tensor kinds are :func:`tensor_kinds` of the parameters (a
    ``DTensor`` is marked so: FSDP2's sharded parameters). The latest
    choice for each key is kept.

    Returns:
        A copy of the record.
    """
    with _lock:
        return {key: dict(value) for key, value in _exclusions.items()}


def clear_cache() -> None:
    """Forget every measured choice, own and agreed, and every recorded failure.

    The autotune cache file is kept (:func:`clear_autotune_cache` removes it);
    background measurements still running are waited for first.
    """
    wait_for_measurements(MAX_BUDGET)
    with _lock:
        _decisions.clear()
        _agreed.clear()
        _measurements.clear()
        _failures.clear()
        _exclusions.clear()


def autotune_cache_path() -> Path:
    """The autotune cache file of this user and machine.

    Returns:
        ``autotune.json`` in ``$OPTIPLUG_CACHE_DIR``, else in
        ``$XDG_CACHE_HOME/optiplug``, else in ``~/.cache/optiplug``.
    """
    return _stored.path()


def clear_autotune_cache() -> bool:
    """Remove the autotune cache file, so that later processes measure again.

    The choices already made in this process are kept (:func:`clear_cache`
    forgets them).

    Returns:
        Whether there was a file to remove.
    """
    return _stored.clear()


def implementation_failures() -> dict[tuple[str, str, str], str]:
    """Implementations skipped in this process: ``(algorithm, name, plugin) -> error``.

    The error is ``"TypeName: message"``; the plugin is ``""`` for a record
    without a provider. The latest failure of each implementation is kept.

    Returns:
        A copy of the record.
    """
    with _lock:
        return dict(_failures)


def report_failure(impl: ImplementationSpec, error: BaseException) -> None:
    """Record that ``impl`` failed and is skipped; warn the first time in this process.

    Args:
        impl: the implementation that raised.
        error: what it raised.
    """
    key = (impl.algorithm, impl.name, _plugin(impl))
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


@contextlib.contextmanager
def agreed_across_ranks(device: torch.device) -> Iterator[None]:
    """Within: choices are measured on every rank and agreed by one all-reduce each.

    Every rank of the default process group must create the same optimizers
    inside the block (as ``Graph.set_optimizer`` does), or the all-reduce
    waits for the missing ranks until the group's timeout.

    Args:
        device: where the all-reduced timings live (CUDA for NCCL, CPU for gloo).

    Yields:
        Nothing; the agreement holds inside the block.
    """
    token = _agreement.set(torch.device(device))
    try:
        yield
    finally:
        _agreement.reset(token)


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


def _copies(sample: Sequence[torch.Tensor]) -> list[torch.Tensor]:
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


def _finish_background_warmups() -> None:
    """Let warm-ups left running past their budget end their current step before exit.

    Interpreter shutdown would otherwise stop a thread inside native code (a
    compilation), which aborts the process. Registered with the hooks that
    run before ``concurrent.futures`` shuts its executors down (compilers use
    them), where this Python has them, else with :mod:`atexit`. Background
    measurements start no further candidate from then on (a compilation
    started while the interpreter shuts down can fail or abort it), so they
    end soon, storing nothing.
    """
    _exiting.set()
    _join_warmups()


def _join_warmups() -> None:
    with _lock:
        threads = list(_warming.values())
        threads += [t.thread for t in _tunings.values() if t.thread is not None]
    for thread in threads:
        thread.join(_EXIT_WAIT)


getattr(threading, "_register_atexit", atexit.register)(_finish_background_warmups)


def _plugin(impl: ImplementationSpec) -> str:
    return impl.provider.plugin if impl.provider is not None else ""


class _Warmup:
    """Build one candidate and run its untimed steps, in a worker thread."""

    def __init__(
        self,
        impl: ImplementationSpec,
        sample: list[torch.Tensor],
        hparams: Mapping[str, Any],
        device: torch.device,
        config: Any = None,
    ) -> None:
        self.impl = impl
        self.sample = sample
        self.hparams = dict(hparams)
        self.config = config
        self.device = device
        self.threads = torch.get_num_threads()
        self.optimizer: torch.optim.Optimizer | None = None
        self.error: Exception | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"optiplug-autotune-{impl.algorithm}-{impl.name}", daemon=True
        )

    def _run(self) -> None:
        try:
            # OpenMP's thread count is per thread: a new thread starts from the
            # default, and a kernel compiled here would fix that count in its code.
            torch.set_num_threads(self.threads)
            context = (
                torch.cuda.device(self.device)
                if self.device.type == "cuda"
                else contextlib.nullcontext()
            )
            with context:
                decided = Prepared(
                    self.impl.algorithm, self.sample, self.hparams, self.config, self.impl
                )
                optimizer = _decision.build(self.impl.factory, decided)
                for _ in range(WARMUP_STEPS):
                    if self.stop.is_set():
                        return
                    optimizer.step()
                _synchronize(self.device)
            self.optimizer = optimizer
        except Exception as error:
            self.error = error

    def within(self, seconds: float) -> bool:
        """Start and wait up to ``seconds``; False (and asked to stop) when still running."""
        self.thread.start()
        self.thread.join(min(max(seconds, 0.0), MAX_BUDGET))
        if self.thread.is_alive():
            self.stop.set()
            return False
        return True


def measure(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    *,
    budget: tuple[float, float] | None = None,
    config: Any = None,
) -> Measurement:
    """Time every candidate on a synthetic sample of ``params`` (nothing is cached).

    Args:
        algorithm: the algorithm's name (for the records).
        candidates: implementations that can run ``params``; at least one.
        params: the user's parameter tensors (only their metadata is used).
        hparams: hyperparameters to time with (e.g. momentum changes the work).
        budget: ``(per-candidate warm-up, overall)`` seconds; None for
            :func:`budgets`.
        config: the validated config instance of ``hparams``, handed to
            each candidate with the decision (None: the candidate validates).

    Returns:
        The timings, the winner and the candidates dropped, with reasons. A
        candidate that raises is reported (:func:`report_failure`).

    Raises:
        ValueError: no candidates or no parameters.
    """
    if not candidates or not params:
        raise ValueError(f"{algorithm}: measuring needs candidates and parameters")
    device = params[0].device
    per_candidate, overall = budgets(device) if budget is None else budget
    started = time.perf_counter()
    deadline = started + overall
    sample = synthetic_parameters(params)
    ranked = sorted(candidates, key=lambda impl: (-impl.priority, impl.name))
    ready: dict[str, torch.optim.Optimizer] = {}
    dropped: dict[str, str] = {}
    late = []
    for impl in ranked:
        _stop_if_exiting()
        outcome = _warm(impl, sample, hparams, device, (per_candidate, deadline), ready, config)
        if outcome is not None:
            dropped[impl.name], out_of_time = outcome
            if out_of_time:
                late.append(impl.name)
    times: dict[str, list[float]] = {name: [] for name in ready}
    for index in range(TIMED_ROUNDS):
        if index and time.perf_counter() > deadline:
            break
        names = list(times)
        shift = index % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            try:
                times[name].append(time_steps(ready[name], 1, device))
            except Exception as error:
                impl = next(i for i in ranked if i.name == name)
                report_failure(impl, error)
                dropped[name] = f"raised while timed: {type(error).__name__}: {error}"
                del times[name]
    timings = {impl.name: math.inf for impl in ranked}
    timings.update({name: statistics.median(values) for name, values in times.items()})
    winner = min(ranked, key=lambda impl: timings[impl.name]).name
    return Measurement(
        winner=winner,
        timings=timings,
        dropped=dropped,
        late=tuple(late),
        tensors=len(sample),
        elements=sum(t.numel() for t in sample),
        seconds=time.perf_counter() - started,
    )


class _Cancelled(Exception):
    """A background measurement stopped because the interpreter is exiting."""


def _stop_if_exiting() -> None:
    """Raise :class:`_Cancelled` in a background thread once the interpreter exits."""
    if _exiting.is_set() and threading.current_thread() is not threading.main_thread():
        raise _Cancelled


def _warm(
    impl: ImplementationSpec,
    sample: list[torch.Tensor],
    hparams: Mapping[str, Any],
    device: torch.device,
    limits: tuple[float, float],
    ready: dict[str, torch.optim.Optimizer],
    config: Any = None,
) -> tuple[str, bool] | None:
    """Warm ``impl`` up within its budget: None (its optimizer is put in ``ready``), else why not.

    Returns:
        None, or ``(reason, whether it ran out of time)``.
    """
    key = (impl.algorithm, impl.name, _plugin(impl), str(device))
    with _lock:
        running = _warming.get(key)
        if running is not None and not running.is_alive():
            del _warming[key]
    if running is not None and running.is_alive():
        return "its warm-up from an earlier measurement is still running in the background", True
    per_candidate, deadline = limits
    allowed = min(per_candidate, deadline - time.perf_counter())
    if allowed <= 0:
        return "the overall time budget was spent before its warm-up", True
    warmup = _Warmup(impl, _copies(sample), hparams, device, config)
    if not warmup.within(allowed):
        with _lock:
            _warming[key] = warmup.thread
        reason = (
            f"warm-up (building it and {WARMUP_STEPS} untimed steps) exceeded the "
            f"{allowed:.1f} s budget; not timed, it finishes its current step in the background"
        )
        return reason, True
    if warmup.error is not None:
        report_failure(impl, warmup.error)
        return f"raised during warm-up: {type(warmup.error).__name__}: {warmup.error}", False
    if warmup.optimizer is None:  # pragma: no cover - the thread either built one or raised
        return "warm-up produced no optimizer", False
    ready[impl.name] = warmup.optimizer
    return None


def choose(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    *,
    config: Any = None,
    follow: list[Tuning] | None = None,
) -> ImplementationSpec:
    """Return the fastest of ``candidates`` (all of which support ``params``).

    Args:
        algorithm: the algorithm's name (part of the cache key).
        candidates: implementations that can run ``params``; at least one.
        params: the user's parameter tensors (only their metadata is used).
        hparams: hyperparameters to time with (e.g. momentum changes the work).
        config: their validated config instance, if known (see :func:`measure`).
        follow: where the caller takes a :class:`Tuning` to attach to the
            optimizer it builds; None measures on the calling thread.

    Never blocking: with ``follow`` given, a single process, and candidates
    that are implementations of one optimizer class able to switch between
    them (``switch_implementation``), a choice neither in memory nor in the
    cache file is measured in a background thread. The candidate returned
    meanwhile is the one ready now: the highest-priority one that needs no
    compilation (:attr:`~optiplug.ImplementationSpec.compiles`). The
    :class:`Tuning` appended to ``follow`` tells the optimizer when to
    switch; the measured choice is kept and written to the cache file.

    Outside :func:`agreed_across_ranks` and with a single process, the choice
    stored in the autotune cache file for these parameters is taken without
    measuring, and a complete measurement is stored there (a provisional one
    is not).

    Returns:
        The fastest candidate (across ranks inside :func:`agreed_across_ranks`);
        by declared priority, then name, when there is a single candidate, no
        parameters, ``OPTIPLUG_AUTOTUNE=0``, or several ranks and no agreement.
        A candidate that raises or exceeds its budget counts as infinitely
        slow (on every rank, when agreed), so it wins only if none was timed,
        and then the priority order decides.

    Raises:
        EnvironmentVariableError: ``OPTIPLUG_AUTOTUNE`` or
            ``OPTIPLUG_AUTOTUNE_CACHE`` is not a boolean word.
    """
    ranked = sorted(candidates, key=lambda impl: (-impl.priority, impl.name))
    if len(ranked) == 1 or not params or not env_flag("OPTIPLUG_AUTOTUNE", default=True):
        return ranked[0]
    agreement = _agreement.get()
    if agreement is None and _ranks.world_size() > 1:
        return ranked[0]
    first = params[0]
    key = (algorithm, first.device.type, first.dtype, tuple(impl.name for impl in ranked))
    cache = _decisions if agreement is None else _agreed
    with _lock:
        cached = cache.get(key)
    if cached is None and agreement is None and follow is not None and _switchable(ranked):
        cached = _stored_choice(key, algorithm, ranked, params)
        if cached is None:
            tuning = _background(key, algorithm, ranked, params, hparams, config)
            follow.append(tuning)
            return next(impl for impl in ranked if impl.name == tuning.ready)
    if cached is None:
        if agreement is None:
            cached = _own_choice(key, algorithm, ranked, params, hparams, config)
        else:
            cached = _agreed_choice(key, agreement, algorithm, ranked, params, hparams, config)
    return next(impl for impl in ranked if impl.name == cached[0])


def _agreed_choice(
    key: tuple[Any, ...],
    agreement: torch.device,
    algorithm: str,
    ranked: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    config: Any = None,
) -> tuple[str, dict[str, float]]:
    """Measured on every rank, the slowest rank's times deciding; the cache file is not used."""
    found = measure(algorithm, ranked, params, hparams, config=config)
    timings = _slowest_rank(found.timings, agreement)
    winner = min(ranked, key=lambda impl: timings[impl.name]).name
    with _lock:
        _measurements[key] = attrs.evolve(found, winner=winner, timings=timings)
        _agreed[key] = (winner, timings)
    return winner, timings


def _own_choice(
    key: tuple[Any, ...],
    algorithm: str,
    ranked: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    config: Any = None,
) -> tuple[str, dict[str, float]]:
    """This process's choice: from the cache file when it has one, else measured (and stored)."""
    stored = _stored_choice(key, algorithm, ranked, params)
    if stored is not None:
        return stored
    return _measured_choice(key, algorithm, ranked, params, hparams, config)


def _stored_choice(
    key: tuple[Any, ...],
    algorithm: str,
    ranked: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
) -> tuple[str, dict[str, float]] | None:
    """The choice the cache file holds for these parameters (then kept in memory), or None."""
    where = _cache_key(algorithm, ranked, params)
    started = time.perf_counter()
    stored = None if where is None else _stored.load(*where)
    if stored is not None:
        record = Measurement(
            stored[0], stored[1], seconds=time.perf_counter() - started, source="cache"
        )
        with _lock:
            _measurements[key] = record
            _decisions[key] = stored
    return stored


def _measured_choice(
    key: tuple[Any, ...],
    algorithm: str,
    ranked: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    config: Any = None,
) -> tuple[str, dict[str, float]]:
    """Measure now; keep the choice (unless provisional) and write it to the cache file."""
    where = _cache_key(algorithm, ranked, params)
    found = measure(algorithm, ranked, params, hparams, config=config)
    with _lock:
        _measurements[key] = found
        if not found.late:
            _decisions[key] = (found.winner, found.timings)
    if where is not None:
        _remember(*where, found)
    return found.winner, found.timings


def _switchable(ranked: Sequence[ImplementationSpec]) -> bool:
    """Whether every candidate is one optimizer class, which can switch between them."""
    try:
        classes = {_decision.prepared_class(impl.factory) for impl in ranked}
    except Exception:  # a factory that cannot be imported: measured (and reported) as before
        return False
    (found,) = classes if len(classes) == 1 else (None,)
    return found is not None and callable(getattr(found, "switch_implementation", None))


def _background(
    key: tuple[Any, ...],
    algorithm: str,
    ranked: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    config: Any,
) -> Tuning:
    """The :class:`Tuning` of ``key``: the one running, or a new one, started."""
    ready = next((impl for impl in ranked if not impl.compiles), ranked[0]).name
    with _lock:
        running = _tunings.get(key)
        if running is not None:
            return running
        tuning = Tuning(key, ready)
        _tunings[key] = tuning
        _measurements[key] = Measurement(ready, {}, source="pending")
    tensors = list(params)  # only their metadata is read, as when measuring on this thread
    threads = torch.get_num_threads()  # per thread: time with the caller's, as it will run

    def run() -> None:
        try:
            torch.set_num_threads(threads)
            tuning.winner = _measured_choice(key, algorithm, ranked, tensors, hparams, config)[0]
            if _measurements[key].late:  # a first compilation outlasted its budget
                tuning.winner = _measured_again(key, algorithm, ranked, tensors, hparams, config)
        except _Cancelled:  # the interpreter is exiting: keep the ready implementation
            pass
        except Exception as error:  # keep the ready implementation; say why once
            report_failure(ranked[0], error)
        finally:
            with _lock:
                _tunings.pop(key, None)
            tuning.finished.set()

    tuning.thread = threading.Thread(target=run, name=f"optiplug-autotune-{algorithm}", daemon=True)
    tuning.thread.start()
    return tuning


def _measured_again(
    key: tuple[Any, ...],
    algorithm: str,
    ranked: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    config: Any,
) -> str:
    """Once the late candidates' warm-ups (their one-time cost) are done, measure again.

    Still in the background, while training goes on: the optimizer then
    switches to the complete measurement's winner, which is written to the
    cache file, instead of settling on the provisional one.
    """
    with _lock:
        warming = list(_warming.values())
    for thread in warming:
        thread.join(_EXIT_WAIT)
        _stop_if_exiting()
    return _measured_choice(key, algorithm, ranked, params, hparams, config)[0]


def _cache_key(
    algorithm: str, ranked: Sequence[ImplementationSpec], params: Sequence[torch.Tensor]
) -> tuple[dict[str, Any], Path] | None:
    """This choice's key in the cache file, and the file; None when it is not used.

    It is not used when ``OPTIPLUG_AUTOTUNE_CACHE`` is off, under several
    ranks, or when no cache directory can be named (no home directory).

    Raises:
        EnvironmentVariableError: ``OPTIPLUG_AUTOTUNE_CACHE`` is not a boolean word.
    """
    if not _stored.enabled() or _ranks.world_size() > 1:
        return None
    try:
        file = _stored.path()
    except (RuntimeError, KeyError):  # Path.home() without a home directory
        return None
    first = params[0]
    names = [impl.name for impl in ranked]
    shapes = [tuple(p.shape) for p in params]
    return _stored.key_fields(algorithm, names, shapes, first.dtype, first.device), file


def _remember(fields: dict[str, Any], file: Path, found: Measurement) -> None:
    """Write a complete measurement to the cache file; a provisional one is not written."""
    if not found.late:
        _stored.store(fields, found.winner, found.timings, file)


def select(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    impl: str | None,
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    *,
    config: Any = None,
    follow: list[Tuning] | None = None,
) -> ImplementationSpec | None:
    """The implementation to run: ``impl`` when forced (checked), else the fastest runnable.

    The one place the rules live, for :func:`optiplug.create` and for
    optimizer classes built on :mod:`optiplug.base`.

    Args:
        algorithm: the algorithm's name (errors and the cache key).
        candidates: every implementation of the algorithm.
        impl: the implementation the user forced, or None to choose.
        params: the parameter tensors.
        hparams: hyperparameters to time with (validated).
        config: their validated config instance, if known: the candidates
            timed are built from it without validating again.
        follow: given, a first measurement runs in the background (see
            :func:`choose`) and its :class:`Tuning` is appended here.

    Returns:
        The chosen record; None when ``impl`` is None and no available
        candidate can run ``params``.

    Raises:
        HyperparameterError: ``impl`` names no candidate, or one that cannot
            run ``params``.
        OptimizerUnavailableError: ``impl`` names a candidate that cannot run
            on this machine (its availability check gives the reason).
    """
    if impl is not None:
        chosen = next((c for c in candidates if c.name == impl), None)
        if chosen is None:
            names = ", ".join(sorted(c.name for c in candidates)) or "none registered"
            raise HyperparameterError(
                "impl", impl, f"no such implementation; available: {names}", algorithm=algorithm
            )
        reason = availability_reason(chosen)
        if reason is not None:
            origin = f" from plugin {chosen.provider}" if chosen.provider is not None else ""
            raise OptimizerUnavailableError(
                f"{algorithm}: implementation {impl!r}{origin} (impl={impl!r}) is unavailable "
                f"on this machine: {reason}"
            )
        if not chosen.can_run(params):
            raise HyperparameterError(
                "impl",
                impl,
                f"does not support these parameters ({tensor_kinds(params)})",
                algorithm=algorithm,
            )
        return chosen
    runnable = _runnable(algorithm, candidates, params)
    if not runnable:
        return None
    return choose(algorithm, runnable, params, hparams, config=config, follow=follow)


def _runnable(
    algorithm: str, candidates: Sequence[ImplementationSpec], params: Sequence[torch.Tensor]
) -> list[ImplementationSpec]:
    """The available candidates that can run ``params``; the others are recorded with why.

    One that is unavailable on this machine is left out; one whose
    ``supports`` check raises is reported and skipped. What was left out,
    and the reason, is kept for :func:`exclusions`.
    """
    kinds = tensor_kinds(params)
    found, left_out = [], {}
    for candidate in candidates:
        reason = availability_reason(candidate)
        if reason is None:
            try:
                if candidate.can_run(params):
                    found.append(candidate)
                    continue
                reason = f"does not support these parameters ({kinds})"
            except Exception as error:
                report_failure(candidate, error)
                reason = f"its supports check raised {type(error).__name__}: {error}"
        left_out[candidate.name] = reason
    with _lock:
        _exclusions[(algorithm, kinds)] = left_out
    return found


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


def _slowest_rank(timings: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each implementation's time on the slowest rank (one MAX all-reduce).

    MAX is exact, so every rank gets bit-identical times and the same winner.
    """
    names = list(timings)
    values = torch.tensor([timings[name] for name in names], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
    return dict(zip(names, values.tolist(), strict=True))

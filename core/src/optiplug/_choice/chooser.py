"""A registry's implementation choices: measured without blocking, agreed across ranks, kept on disk.

How the rounds decide, contention included, is :mod:`.rounds`'s; this
module keeps what they decided.

On a CPU torch's foreach paths are slower than its per-tensor loop and fused
kernels beat both; on a GPU foreach beats the loop. No fixed order is right
everywhere, and the answer changes with the sizes (launch costs dominate
small tensors, memory traffic large ones), so ``impl=None`` times each
available implementation that supports the parameters on synthetic tensors
with the user's size distribution (:mod:`.timing`; never touching the user's
tensors or the global RNG) and keeps the winner per (algorithm, device type,
dtype, candidates). ``OPTIPLUG_AUTOTUNE=0`` (or ``false``, ``no``, ``off``)
skips measuring and uses each implementation's declared ``priority``.

Every :class:`~optiplug.Registry` owns one :class:`ImplementationChooser`
(``registry.chooser``): what was measured, agreed, left out or failed is
that registry's, never the module's, so two registries with different
plugins never share a choice.

A candidate that raises (while being timed, or while its ``supports`` check
runs) is skipped, recorded in :meth:`~ImplementationChooser.implementation_failures`
and warned about once per chooser; the others still compete. An
implementation whose ``availability`` says it cannot run on this machine
never competes; forcing it raises
:class:`~optiplug.errors.OptimizerUnavailableError`.

Under ``torch.distributed`` every rank must run the same kernels: fused and
loop kernels round differently (by an ulp), so ranks that each picked their
own winner drift apart. Inside :meth:`~ImplementationChooser.agreed_across_ranks`
(which ``Graph.set_optimizer`` enters on every rank) each rank measures and
the slowest rank's time decides, through one all-reduce; elsewhere in a
multi-process group nothing is measured and the declared priority decides.

Choices also persist across processes (:mod:`.cache`): a measured choice is
written to a JSON file per machine, keyed by the algorithm, the candidates,
the parameters' sizes, dtype and device, torch's version, the device's name
and torch's thread count, and a later process with the same key takes it
from there without measuring (its measurement record says
``source="cache"``). Only a complete measurement that the rounds trust
(:attr:`~.timing.Measurement.trusted`) is written; in the background one
in doubt is measured once more, and the best guess of that second
measurement is kept for this process only. In the
background, one left provisional because a candidate ran out of warm-up time
(a first compilation) is measured again once that warm-up is done; nothing
is measured at exit, where a compilation can fail or abort the interpreter.
``OPTIPLUG_AUTOTUNE_CACHE=0`` neither reads nor writes the file. Under
``torch.distributed`` the file is not used: the ranks agree on a measured
choice as above.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch

from .._core import ranks as _ranks
from .._core.env import env_flag
from .._core.registry import bound_registry
from .._core.specs import ImplementationSpec
from ..errors import PluginWarning
from . import cache as _stored
from .questions import Question, cache_key, forced, plugin_of, switchable
from .questions import ranked as by_priority
from .questions import slowest_rank as _slowest_rank
from .rounds import Clock, StepTimer, Verdict, run_rounds
from .timing import (
    MAX_BUDGET,
    WARMUP_STEPS,
    Measurement,
    OptimizerTimer,
    availability_reason,
    budgets,
    copies,
    synthetic_parameters,
    tensor_kinds,
)
from .warmup import Cancelled, Warmup, call_at_exit

__all__ = ["ImplementationChooser", "Tuning", "chooser_of"]

_EXIT_WAIT = 300.0
"""Seconds a background thread is waited for at exit (it ends its current step)."""

Decision = tuple[str, dict[str, float]]
"""``(winner, {implementation: seconds per step})``."""

TimerFactory = Callable[[Mapping[str, torch.optim.Optimizer], torch.device], StepTimer]
"""Makes the :class:`~.rounds.StepTimer` of one measurement from its optimizers and their device."""


@attrs.define(eq=False)
class Tuning:
    """A choice being measured in a background thread (see :meth:`ImplementationChooser.choose`).

    The optimizer built meanwhile runs :attr:`ready` and holds this record;
    at its next ``step()`` after :attr:`finished` is set it switches to
    :attr:`winner` (None when the measurement failed: it keeps :attr:`ready`).

    Attributes:
        key: the in-memory decision key.
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


class ImplementationChooser:
    """The implementation choices of one registry, and the records of how they were made.

    Thread-safe. A registry creates its own (``registry.chooser``); nothing
    is shared between choosers except the cache file on disk.
    """

    def __init__(self, *, timer: TimerFactory | None = None, clock: Clock | None = None) -> None:
        """A chooser with nothing decided yet.

        Args:
            timer: makes the timer of one measurement's rounds from the
                warmed-up optimizers and their device (default
                :class:`~.timing.OptimizerTimer`: one real step, wall and CPU time).
            clock: the clock the rounds' deadline is read on (default
                :func:`time.perf_counter`).
        """
        self._timer: TimerFactory = OptimizerTimer if timer is None else timer
        self._clock: Clock = time.perf_counter if clock is None else clock
        self._lock = threading.Lock()
        self._decisions: dict[tuple[Any, ...], Decision] = {}
        self._agreed: dict[tuple[Any, ...], Decision] = {}
        self._measurements: dict[tuple[Any, ...], Measurement] = {}
        self._failures: dict[tuple[str, str, str], str] = {}
        self._exclusions: dict[tuple[str, str], dict[str, str]] = {}
        self._warming: dict[tuple[str, str, str, str], threading.Thread] = {}
        self._tunings: dict[tuple[Any, ...], Tuning] = {}
        self._exiting = threading.Event()
        self._agreement: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar(
            f"optiplug_agreement_{id(self):x}", default=None
        )
        call_at_exit(weakref.WeakMethod(self._finish_background_work))

    # ------------------------------------------------------------ records
    def wait_for_measurements(self, timeout: float | None = None) -> bool:
        """Wait for the background measurements started so far (see :meth:`choose`).

        Args:
            timeout: seconds to wait for each; None waits until each is done.

        Returns:
            True when none is still running.
        """
        with self._lock:
            running = list(self._tunings.values())
        return all(tuning.finished.wait(timeout) for tuning in running)

    def decisions(self, agreed: bool = False) -> dict[tuple[Any, ...], Decision]:
        """The choices kept: key -> (winner, {implementation: seconds per step}).

        Measurements running in the background are waited for first.

        Args:
            agreed: the choices agreed across ranks (slowest rank's times)
                instead of this process's own.

        Returns:
            A copy; keys are ``(algorithm, device type, dtype, candidate names)``.
        """
        self.wait_for_measurements()
        with self._lock:
            return dict(self._agreed if agreed else self._decisions)

    def measurements(self, wait: bool = True) -> dict[tuple[Any, ...], Measurement]:
        """The latest :class:`~.timing.Measurement` per key, dropped candidates and reasons included.

        A measurement in which a candidate was dropped for its budget is kept
        here but not as a decision (outside an agreement across ranks): the
        next creation measures again, once that candidate's one-time cost
        has been paid in the background. A choice taken from the cache file
        is recorded too, with ``source="cache"``.

        Args:
            wait: wait for the background measurements first; if False, each
                running one shows as its ``source="pending"`` record.

        Returns:
            A copy: key -> measurement.
        """
        if wait:
            self.wait_for_measurements()
        with self._lock:
            return dict(self._measurements)

    def exclusions(self) -> dict[tuple[str, str], dict[str, str]]:
        """Implementations ``impl=None`` left out, and why: ``(algorithm, tensor kinds) -> {name: reason}``.

        The tensor kinds are :func:`~.timing.tensor_kinds` of the parameters
        (a ``DTensor`` is marked so: FSDP2's sharded parameters). The latest
        choice for each key is kept.

        Returns:
            A copy of the record.
        """
        with self._lock:
            return {key: dict(value) for key, value in self._exclusions.items()}

    def implementation_failures(self) -> dict[tuple[str, str, str], str]:
        """Implementations skipped: ``(algorithm, name, plugin) -> "TypeName: message"``.

        The plugin is ``""`` for a record without a provider; the latest
        failure of each implementation is kept.

        Returns:
            A copy of the record.
        """
        with self._lock:
            return dict(self._failures)

    def clear(self) -> None:
        """Forget every choice, own and agreed, every measurement and every recorded failure.

        The cache file on disk is kept (``optiplug bench --clear-cache``
        removes it); background measurements still running are waited for first.
        """
        self.wait_for_measurements(MAX_BUDGET)
        with self._lock:
            for record in (self._decisions, self._agreed, self._measurements):
                record.clear()
            self._failures.clear()
            self._exclusions.clear()

    def report_failure(self, impl: ImplementationSpec, error: BaseException) -> None:
        """Record that ``impl`` failed and is skipped; warn the first time.

        Args:
            impl: the implementation that raised.
            error: what it raised.
        """
        key = (impl.algorithm, impl.name, plugin_of(impl))
        text = f"{type(error).__name__}: {error}"
        with self._lock:
            first = key not in self._failures
            self._failures[key] = text
        if first:
            origin = f" from plugin {impl.provider}" if impl.provider is not None else ""
            warnings.warn(
                f"optiplug: implementation {impl.name!r} of {impl.algorithm!r}{origin} failed "
                f"and is skipped ({text}); the next candidate is used, impl={impl.name!r} forces it",
                PluginWarning,
                stacklevel=5,
            )

    @contextlib.contextmanager
    def agreed_across_ranks(self, device: torch.device) -> Iterator[None]:
        """Within: choices are measured on every rank and agreed by one all-reduce each.

        Every rank of the default process group must create the same
        optimizers inside the block (as ``Graph.set_optimizer`` does), or the
        all-reduce waits for the missing ranks until the group's timeout.

        Args:
            device: where the all-reduced timings live (CUDA for NCCL, CPU for gloo).

        Yields:
            Nothing; the agreement holds inside the block.
        """
        token = self._agreement.set(torch.device(device))
        try:
            yield
        finally:
            self._agreement.reset(token)

    # ------------------------------------------------------------ choosing
    def select(
        self,
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
            algorithm: the algorithm's name (errors and the decision key).
            candidates: every implementation of the algorithm.
            impl: the implementation the user forced, or None to choose.
            params: the parameter tensors.
            hparams: hyperparameters to time with (validated).
            config: their validated config instance, if known: the candidates
                timed are built from it without validating again.
            follow: given, a first measurement runs in the background (see
                :meth:`choose`) and its :class:`Tuning` is appended here.

        Returns:
            The chosen record; None when ``impl`` is None and no available
            candidate can run ``params``.

        Raises:
            HyperparameterError: ``impl`` names no candidate, or one that
                cannot run ``params``.
            OptimizerUnavailableError: ``impl`` names a candidate that cannot
                run on this machine (its availability check gives the reason).
        """
        if impl is not None:
            return forced(algorithm, candidates, impl, params)
        runnable = self._runnable(algorithm, candidates, params)
        if not runnable:
            return None
        return self.choose(algorithm, runnable, params, hparams, config=config, follow=follow)

    def choose(
        self,
        algorithm: str,
        candidates: Sequence[ImplementationSpec],
        params: Sequence[torch.Tensor],
        hparams: Mapping[str, Any],
        *,
        config: Any = None,
        follow: list[Tuning] | None = None,
    ) -> ImplementationSpec:
        """Return the fastest of ``candidates`` (all of which support ``params``).

        Never blocking: with ``follow`` given, a single process, and
        candidates that are implementations of one optimizer class able to
        switch between them (``switch_implementation``), a choice neither in
        memory nor in the cache file is measured in a background thread. The
        candidate returned meanwhile is the one ready now: the
        highest-priority one that needs no compilation
        (:attr:`~optiplug.ImplementationSpec.compiles`). The :class:`Tuning`
        appended to ``follow`` tells the optimizer when to switch; the
        measured choice is kept and written to the cache file.

        Outside :meth:`agreed_across_ranks` and with a single process, the
        choice stored in the cache file for these parameters is taken
        without measuring, and a complete measurement is stored there.

        Returns:
            The fastest candidate (across ranks inside :meth:`agreed_across_ranks`);
            by declared priority, then name, when there is a single
            candidate, no parameters, ``OPTIPLUG_AUTOTUNE=0``, or several
            ranks and no agreement. A candidate that raises or exceeds its
            budget counts as infinitely slow (on every rank, when agreed), so
            it wins only if none was timed, and then the priority order decides.

        Raises:
            EnvironmentVariableError: ``OPTIPLUG_AUTOTUNE`` or
                ``OPTIPLUG_AUTOTUNE_CACHE`` is not a boolean word.
        """
        ranked = by_priority(candidates)
        if len(ranked) == 1 or not params or not env_flag("OPTIPLUG_AUTOTUNE", default=True):
            return ranked[0]
        agreement = self._agreement.get()
        if agreement is None and _ranks.world_size() > 1:
            return ranked[0]
        first = params[0]
        key = (algorithm, first.device.type, first.dtype, tuple(impl.name for impl in ranked))
        question = Question(key, algorithm, ranked, tuple(params), hparams, config)
        if agreement is not None:
            return question.named(self._agreed_choice(question, agreement)[0])
        return question.named(self._own_choice(question, follow))

    def measure(
        self,
        algorithm: str,
        candidates: Sequence[ImplementationSpec],
        params: Sequence[torch.Tensor],
        hparams: Mapping[str, Any],
        *,
        budget: tuple[float, float] | None = None,
        config: Any = None,
    ) -> Measurement:
        """Time every candidate on a synthetic sample of ``params`` (nothing is kept).

        Args:
            algorithm: the algorithm's name (for the records).
            candidates: implementations that can run ``params``; at least one.
            params: the user's parameter tensors (only their metadata is used).
            hparams: hyperparameters to time with (e.g. momentum changes the work).
            budget: ``(per-candidate warm-up, overall)`` seconds; None for
                :func:`~.timing.budgets`.
            config: the validated config instance of ``hparams``, handed to
                each candidate with the decision (None: the candidate validates).

        Returns:
            The timings, the winner and the candidates dropped, with reasons.
            A candidate that raises is reported (:meth:`report_failure`).

        Raises:
            ValueError: no candidates or no parameters.
        """
        if not candidates or not params:
            raise ValueError(f"{algorithm}: measuring needs candidates and parameters")
        device = params[0].device
        per_candidate, overall = budgets(device) if budget is None else budget
        started = time.perf_counter()
        sample = synthetic_parameters(params)
        ranked = by_priority(candidates)
        ready, dropped, late = self._warm_all(
            ranked, sample, hparams, (per_candidate, started + overall), config
        )
        verdict = self._timed_rounds(ranked, ready, dropped, device, started + overall)
        timings = {impl.name: math.inf for impl in ranked} | verdict.timings
        return Measurement(
            winner=min(ranked, key=lambda impl: timings[impl.name]).name,
            timings=timings,
            dropped=dropped,
            late=tuple(late),
            tensors=len(sample),
            elements=sum(t.numel() for t in sample),
            seconds=time.perf_counter() - started,
            # None timed (every candidate raised): nothing contention could change.
            trusted=verdict.trusted or verdict.winner is None,
            doubt=verdict.reason if verdict.winner is not None else "",
            rounds=verdict.rounds,
            preempted=verdict.preempted,
        )

    # ------------------------------------------------------------ internals
    def _warm_all(
        self,
        ranked: Sequence[ImplementationSpec],
        sample: list[torch.Tensor],
        hparams: Mapping[str, Any],
        limits: tuple[float, float],
        config: Any,
    ) -> tuple[dict[str, torch.optim.Optimizer], dict[str, str], list[str]]:
        """Warm every candidate up: the ready ones, the dropped ones (why), and the late ones."""
        device = sample[0].device
        ready: dict[str, torch.optim.Optimizer] = {}
        dropped: dict[str, str] = {}
        late: list[str] = []
        for impl in ranked:
            self._stop_if_exiting()
            outcome = self._warm(impl, sample, hparams, device, limits, ready, config)
            if outcome is not None:
                dropped[impl.name], out_of_time = outcome
                if out_of_time:
                    late.append(impl.name)
        return ready, dropped, late

    def _timed_rounds(
        self,
        ranked: Sequence[ImplementationSpec],
        ready: dict[str, torch.optim.Optimizer],
        dropped: dict[str, str],
        device: torch.device,
        deadline: float,
    ) -> Verdict:
        """Paired rounds of the warmed-up candidates (:func:`~.rounds.run_rounds`); raisers dropped."""
        names = [impl.name for impl in ranked if impl.name in ready]

        def failed(name: str, error: Exception) -> None:
            self.report_failure(next(i for i in ranked if i.name == name), error)
            dropped[name] = f"raised while timed: {type(error).__name__}: {error}"

        remaining = deadline - time.perf_counter()
        timer = self._timer({name: ready[name] for name in names}, device)
        return run_rounds(names, timer, self._clock, self._clock() + remaining, failed)

    def _warm(
        self,
        impl: ImplementationSpec,
        sample: list[torch.Tensor],
        hparams: Mapping[str, Any],
        device: torch.device,
        limits: tuple[float, float],
        ready: dict[str, torch.optim.Optimizer],
        config: Any = None,
    ) -> tuple[str, bool] | None:
        """Warm ``impl`` up within its budget: None (its optimizer put in ``ready``), else why not.

        Returns:
            None, or ``(reason, whether it ran out of time)``.
        """
        key = (impl.algorithm, impl.name, plugin_of(impl), str(device))
        if self._still_warming(key):
            return (
                "its warm-up from an earlier measurement is still running in the background",
                True,
            )
        per_candidate, deadline = limits
        allowed = min(per_candidate, deadline - time.perf_counter())
        if allowed <= 0:
            return "the overall time budget was spent before its warm-up", True
        warmup = Warmup(impl, copies(sample), hparams, device, config)
        if not warmup.within(allowed):
            with self._lock:
                self._warming[key] = warmup.thread
            reason = (
                f"warm-up (building it and {WARMUP_STEPS} untimed steps) exceeded the "
                f"{allowed:.1f} s budget; not timed, it finishes its current step in the background"
            )
            return reason, True
        if warmup.error is not None:
            self.report_failure(impl, warmup.error)
            return f"raised during warm-up: {type(warmup.error).__name__}: {warmup.error}", False
        if warmup.optimizer is None:  # pragma: no cover - the thread either built one or raised
            return "warm-up produced no optimizer", False
        ready[impl.name] = warmup.optimizer
        return None

    def _still_warming(self, key: tuple[str, str, str, str]) -> bool:
        """Whether an earlier measurement's warm-up of this candidate is still running."""
        with self._lock:
            running = self._warming.get(key)
            if running is not None and not running.is_alive():
                del self._warming[key]
                return False
        return running is not None

    def _stop_if_exiting(self) -> None:
        """Raise :class:`Cancelled` in a background thread once the interpreter exits."""
        if self._exiting.is_set() and threading.current_thread() is not threading.main_thread():
            raise Cancelled

    def _finish_background_work(self) -> None:
        """At exit: start nothing more, and let running warm-ups end their current step.

        Interpreter shutdown would otherwise stop a thread inside native code
        (a compilation), which aborts the process; a compilation started
        while the interpreter shuts down can fail or abort it, so background
        measurements end soon, storing nothing.
        """
        self._exiting.set()
        with self._lock:
            threads = list(self._warming.values())
            threads += [t.thread for t in self._tunings.values() if t.thread is not None]
        for thread in threads:
            thread.join(_EXIT_WAIT)

    def _own_choice(self, question: Question, follow: list[Tuning] | None) -> str:
        """This process's choice: kept, or from the cache file, or measured (maybe in the background)."""
        with self._lock:
            kept = self._decisions.get(question.key)
        if kept is not None:
            return kept[0]
        stored = self._stored_choice(question)
        if stored is not None:
            return stored[0]
        if follow is not None and switchable(question.ranked):
            tuning = self._background(question)
            follow.append(tuning)
            return tuning.ready
        return self._measured_choice(question)[0]

    def _agreed_choice(self, question: Question, agreement: torch.device) -> Decision:
        """Measured on every rank, the slowest rank's times deciding; the cache file is not used."""
        with self._lock:
            kept = self._agreed.get(question.key)
        if kept is not None:
            return kept
        found = self.measure(
            question.algorithm,
            question.ranked,
            question.params,
            question.hparams,
            config=question.config,
        )
        timings = _slowest_rank(found.timings, agreement)
        winner = min(question.ranked, key=lambda impl: timings[impl.name]).name
        with self._lock:
            self._measurements[question.key] = attrs.evolve(found, winner=winner, timings=timings)
            self._agreed[question.key] = (winner, timings)
        return winner, timings

    def _stored_choice(self, question: Question) -> Decision | None:
        """The choice the cache file holds for these parameters (then kept in memory), or None."""
        where = cache_key(question)
        started = time.perf_counter()
        stored = None if where is None else _stored.load(*where)
        if stored is not None:
            record = Measurement(
                stored[0], stored[1], seconds=time.perf_counter() - started, source="cache"
            )
            with self._lock:
                self._measurements[question.key] = record
                self._decisions[question.key] = stored
        return stored

    def _measured_choice(self, question: Question, *, last_try: bool = False) -> Decision:
        """Measure now; keep the choice (unless provisional) and write it to the cache file.

        A choice still in doubt on the ``last_try`` is kept for the rest of
        this process (so every optimizer it creates for these parameters
        runs the same kernel), but never written to the cache file: another
        process measures for itself.
        """
        where = cache_key(question)
        found = self.measure(
            question.algorithm,
            question.ranked,
            question.params,
            question.hparams,
            config=question.config,
        )
        keep = found.trusted and not found.late  # a provisional or doubtful one is not stored
        with self._lock:
            self._measurements[question.key] = found
            if keep or (last_try and not found.late):
                self._decisions[question.key] = (found.winner, found.timings)
        if where is not None and keep:
            fields, file = where
            _stored.store(fields, found.winner, found.timings, file)
        return found.winner, found.timings

    def _background(self, question: Question) -> Tuning:
        """The :class:`Tuning` of ``question``: the one running, or a new one, started."""
        ready = next((impl for impl in question.ranked if not impl.compiles), question.ranked[0])
        with self._lock:
            running = self._tunings.get(question.key)
            if running is not None:
                return running
            tuning = Tuning(question.key, ready.name)
            self._tunings[question.key] = tuning
            self._measurements[question.key] = Measurement(ready.name, {}, source="pending")
        threads = torch.get_num_threads()  # per thread: time with the caller's, as it will run
        tuning.thread = threading.Thread(
            target=self._measure_in_background,
            args=(question, tuning, threads),
            name=f"optiplug-autotune-{question.algorithm}",
            daemon=True,
        )
        tuning.thread.start()
        return tuning

    def _measure_in_background(self, question: Question, tuning: Tuning, threads: int) -> None:
        """The background thread of :meth:`_background`: measure, and again if provisional."""
        try:
            torch.set_num_threads(threads)
            tuning.winner = self._measured_choice(question)[0]
            found = self._measurements[question.key]
            if found.late:  # a first compilation outlasted its budget
                tuning.winner = self._measured_again(question)
            elif not found.trusted:  # contention left it in doubt: once more, then the best guess
                tuning.winner = self._measured_choice(question, last_try=True)[0]
        except Cancelled:  # the interpreter is exiting: keep the ready implementation
            pass
        except Exception as error:  # keep the ready implementation; say why once
            self.report_failure(question.ranked[0], error)
        finally:
            with self._lock:
                self._tunings.pop(question.key, None)
            tuning.finished.set()

    def _measured_again(self, question: Question) -> str:
        """Once the late candidates' warm-ups (their one-time cost) are done, measure again.

        Still in the background, while training goes on: the optimizer then
        switches to the complete measurement's winner, which is written to
        the cache file, instead of settling on the provisional one.
        """
        with self._lock:
            warming = list(self._warming.values())
        for thread in warming:
            thread.join(_EXIT_WAIT)
            self._stop_if_exiting()
        return self._measured_choice(question)[0]

    def _runnable(
        self,
        algorithm: str,
        candidates: Sequence[ImplementationSpec],
        params: Sequence[torch.Tensor],
    ) -> list[ImplementationSpec]:
        """The available candidates that can run ``params``; the others are recorded with why.

        One that is unavailable on this machine is left out; one whose
        ``supports`` check raises is reported and skipped. What was left
        out, and the reason, is kept for :meth:`exclusions`.
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
                    self.report_failure(candidate, error)
                    reason = f"its supports check raised {type(error).__name__}: {error}"
            left_out[candidate.name] = reason
        with self._lock:
            self._exclusions[(algorithm, kinds)] = left_out
        return found


def chooser_of(registry: Any = None) -> ImplementationChooser:
    """The chooser ``registry`` owns (the default registry's when None).

    Args:
        registry: a :class:`~optiplug.Registry`, or None for the default one.

    Returns:
        Its :class:`ImplementationChooser`.

    Raises:
        TypeError: the registry was given a chooser of another kind, which
            keeps none of the records asked for.
    """
    chooser = bound_registry(registry).chooser
    if not isinstance(chooser, ImplementationChooser):
        raise TypeError(
            f"the registry's chooser is a {type(chooser).__name__}, not an ImplementationChooser"
        )
    return chooser

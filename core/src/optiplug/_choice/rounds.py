"""Deciding which candidate is fastest from interleaved timed rounds, robust to contention.

The decision is pure arithmetic over what an injectable :class:`StepTimer`
reports and an injectable :class:`Clock` says, so it can be tested with
timings made up to order (contention included) and never depends on the
machine's speed. The chooser hands it a timer that steps real optimizers
(:class:`~optiplug._choice.timing.OptimizerTimer`).

How (:func:`run_rounds`, :func:`decide`):

* *paired rounds.* Each round times one step of every candidate back to
  back, the order rotating, so slow drift (frequency scaling, a neighbour's
  load rising) and a preemption window hit the candidates of a round alike.
  Candidates are compared by the ratio of their times **within a round**,
  never by times from different moments.
* *robust statistics.* Candidate ``a`` against ``b`` is the median, over the
  rounds, of ``log(t_a / t_b)``: one preempted sample in a round moves one
  ratio, not the estimate. A candidate's score is the mean of its estimates
  against all others; its reported time is the typical step time scaled by
  that score, so the fastest time is the winner's.
* *preemption seen.* Beside wall time the timer reports how often the
  scheduler took the timing thread off its core during the step
  (involuntary context switches, where the system counts them), else the
  CPU time the thread got; a sample switched out at least once, or else
  whose thread ran less than :data:`RAN_SHARE` of its wall time, counts as
  *preempted*. When at least :data:`MIN_PAIRS` rounds of a pair are clean
  on both sides, only those decide the pair.
* *re-measured while unsure.* :data:`MIN_PAIRS` rounds are always timed
  (the deadline counts after them: on a bounded sample they take
  milliseconds on a CPU); after :data:`MIN_ROUNDS` rounds, rounds go on
  (up to :data:`MAX_ROUNDS`, or the deadline) until the decision is
  trustworthy: for the winner against every other candidate, at least
  :data:`MIN_PAIRS` rounds clean on both sides, and over those either the
  winner was faster in more than three quarters of them, or the upper end
  of the median log-ratio's ~95% confidence interval (median + 1.57 IQR /
  sqrt(n), a box plot's notch) is at most :data:`TOLERANCE`: a near tie,
  where at worst the winner is a little slower, is decided well enough. When too few are clean, the
  preempted rounds give the best guess, trusted only by an overwhelming
  majority (:data:`PREEMPTED_MAJORITY` of at least :data:`PREEMPTED_ROUNDS`).
* *never kept when unsure.* A decision that is not trustworthy says so
  (:attr:`Verdict.trusted`, with the reason); the chooser neither keeps it
  nor writes it to the cache file.

Nothing here keeps state or imports torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

__all__ = [
    "MAX_ROUNDS",
    "MIN_PAIRS",
    "MIN_ROUNDS",
    "PREEMPTED_MAJORITY",
    "PREEMPTED_ROUNDS",
    "RAN_SHARE",
    "TOLERANCE",
    "Clock",
    "StepSample",
    "StepTimer",
    "Verdict",
    "decide",
    "run_rounds",
]

MIN_ROUNDS = 5
"""Rounds timed at least, unless the deadline passes after the first :data:`MIN_PAIRS`."""

MAX_ROUNDS = 31
"""Rounds at most, while the decision is not yet trustworthy."""

MIN_PAIRS = 4
"""Paired rounds a decision between two candidates needs to be trusted."""

RAN_SHARE = 0.8
"""A sample whose timing thread ran (CPU time) under this share of its wall time was preempted."""

PREEMPTED_ROUNDS = 10
"""Rounds a pair needs to be trusted from preempted rounds."""

PREEMPTED_MAJORITY = 0.9
"""Share of those rounds the winner must have been faster in."""

_NOTCH = 1.57
"""Half-width of a median's ~95% confidence interval, in interquartile ranges over the root of n."""

_TINY = 1e-12
"""Seconds a zero time is taken as, so that every ratio has a logarithm."""

TOLERANCE = math.log(1.15)
"""How much slower (log-ratio) the winner may at worst be than another for a near tie to be trusted."""


@attrs.frozen
class StepSample:
    """One timed step.

    Attributes:
        wall: seconds of wall time.
        cpu: seconds of CPU time the timing thread got meanwhile, or None
            where it says nothing (a CUDA step waits in a synchronize).
        switched_out: how many times the scheduler preempted the timing
            thread meanwhile (involuntary context switches), or None where
            that is not counted.
    """

    wall: float
    cpu: float | None = None
    switched_out: int | None = None

    @property
    def preempted(self) -> bool:
        """Whether the timing thread was switched out, else ran under :data:`RAN_SHARE` of the wall time."""
        if self.switched_out is not None:
            return self.switched_out > 0
        return self.cpu is not None and self.cpu < RAN_SHARE * self.wall


class StepTimer(Protocol):
    """Times one step of a candidate: the chooser's steps real optimizers, a test's makes them up."""

    def __call__(self, name: str) -> StepSample:
        """Take and time one step of candidate ``name`` (raising drops the candidate)."""
        ...


class Clock(Protocol):
    """Seconds on a monotonic clock (``time.perf_counter``)."""

    def __call__(self) -> float:
        """The current reading."""
        ...


@attrs.frozen
class Verdict:
    """What a set of rounds decided.

    Attributes:
        winner: the fastest candidate (None when none was timed).
        timings: seconds per step of each timed candidate, scaled by its
            paired score: the winner's is the smallest.
        trusted: whether the decision may be kept and written to the cache file.
        reason: why it is not trusted ("" when it is).
        rounds: how many rounds were timed.
        preempted: the share of samples taken while preempted.
    """

    winner: str | None
    timings: dict[str, float]
    trusted: bool
    reason: str = ""
    rounds: int = 0
    preempted: float = 0.0


Rounds = dict[str, list[StepSample]]
"""Per candidate still timed, its sample in each round (a candidate that raised is removed)."""


def run_rounds(
    names: Sequence[str],
    timer: StepTimer,
    clock: Clock,
    deadline: float,
    on_error: Callable[[str, Exception], None],
) -> Verdict:
    """Time ``names`` in paired rounds until the decision is trustworthy, or rounds or time run out.

    Args:
        names: the candidates, in priority order (it breaks ties).
        timer: takes and times one step of a candidate.
        clock: the clock ``deadline`` is read on.
        deadline: after it no round starts but the first :data:`MIN_PAIRS`.
        on_error: called with a candidate that raised while timed (it is dropped).

    Returns:
        The verdict of the rounds timed.
    """
    rounds: Rounds = {name: [] for name in names}
    verdict = decide(rounds, list(names))
    for index in range(MAX_ROUNDS):
        if index >= MIN_PAIRS and clock() > deadline:
            break
        if index >= MIN_ROUNDS and verdict.trusted:
            break
        _one_round(rounds, index, timer, on_error)
        verdict = decide(rounds, [name for name in names if name in rounds])
    return verdict


def _one_round(
    rounds: Rounds, index: int, timer: StepTimer, on_error: Callable[[str, Exception], None]
) -> None:
    """One step of each candidate, the order rotated by ``index``; a raiser is dropped."""
    names = list(rounds)
    shift = index % len(names) if names else 0
    for name in names[shift:] + names[:shift]:
        try:
            rounds[name].append(timer(name))
        except Exception as error:
            del rounds[name]
            on_error(name, error)


def decide(rounds: Rounds, names: Sequence[str]) -> Verdict:
    """The verdict of ``rounds`` over ``names`` (priority order).

    Args:
        rounds: per candidate, its sample in each round (all of one length).
        names: the candidates to decide between, in priority order.

    Returns:
        The winner, the scaled timings and whether they can be trusted.
    """
    count = max((len(rounds[name]) for name in names), default=0)
    samples = [s for name in names for s in rounds[name]]
    preempted = sum(s.preempted for s in samples) / len(samples) if samples else 0.0
    timed = [name for name in names if rounds[name]]
    if not timed:
        return Verdict(None, {}, False, "no candidate was timed", count, preempted)
    timings = _scaled_timings(rounds, timed)
    winner = min(timed, key=timings.__getitem__)
    doubt = next((d for c in timed if c != winner and (d := _doubt(rounds, winner, c))), "")
    return Verdict(winner, timings, not doubt, doubt, count, preempted)


def _pair_logs(rounds: Rounds, a: str, b: str) -> tuple[list[float], list[float]]:
    """``log(t_a / t_b)`` per round: of the rounds clean on both sides, and of all rounds."""
    clean, every = [], []
    for x, y in zip(rounds[a], rounds[b], strict=True):
        log = math.log(max(x.wall, _TINY) / max(y.wall, _TINY))
        every.append(log)
        if not (x.preempted or y.preempted):
            clean.append(log)
    return clean, every


def _scaled_timings(rounds: Rounds, names: Sequence[str]) -> dict[str, float]:
    """Each candidate's typical step time, placed by its mean paired log-ratio to the others."""
    typical = {name: statistics.median(_walls(rounds[name])) for name in names}
    level = statistics.fmean(math.log(max(t, _TINY)) for t in typical.values())
    timings = {}
    for a in names:
        estimates = [_estimate(rounds, a, b) for b in names if b != a]
        timings[a] = math.exp(level + (statistics.fmean(estimates) if estimates else 0.0))
    return timings


def _walls(samples: Sequence[StepSample]) -> list[float]:
    """Wall times of the clean samples, or of all where none is clean."""
    clean = [s.wall for s in samples if not s.preempted]
    return clean or [s.wall for s in samples]


def _estimate(rounds: Rounds, a: str, b: str) -> float:
    """``log(t_a / t_b)``: the median over the clean paired rounds when enough, else over all."""
    clean, every = _pair_logs(rounds, a, b)
    return statistics.median(clean if len(clean) >= MIN_PAIRS else every)


def _doubt(rounds: Rounds, winner: str, other: str) -> str:
    """Why ``winner`` over ``other`` is not trustworthy, or "" when it is.

    Rounds clean on both sides decide when there are :data:`MIN_PAIRS` of
    them. Otherwise a preempted step's time says partly how long the thread
    waited, so only an overwhelming majority trusts: the winner faster in
    :data:`PREEMPTED_MAJORITY` of at least :data:`PREEMPTED_ROUNDS` rounds
    (random preemption, the order rotating, cannot fake that unless it hits
    one candidate nearly every round, which the bench would see as well).
    """
    clean, every = _pair_logs(rounds, winner, other)
    if len(clean) < MIN_PAIRS:
        faster = sum(log < 0 for log in every)
        if len(every) >= PREEMPTED_ROUNDS and faster >= PREEMPTED_MAJORITY * len(every):
            return ""
        return (
            f"{winner} and {other} were both timed unpreempted in {len(clean)} of "
            f"{len(every)} rounds (< {MIN_PAIRS}), and {winner} was faster in {faster}"
        )
    low, middle, high = statistics.quantiles(clean, n=4, method="inclusive")
    worst = middle + _NOTCH * (high - low) / math.sqrt(len(clean))
    if high < 0 or worst <= TOLERANCE:  # faster in over 3/4 of the rounds, or at worst a bit slower
        return ""
    return (
        f"{winner} against {other}: median log-ratio {middle:+.3f}, at worst {worst:+.3f} "
        f"(> {TOLERANCE:.3f}) over {len(clean)} clean rounds"
    )

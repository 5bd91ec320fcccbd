"""The chooser's decision under contention, from made-up timings: no test here times the machine.

:mod:`optiplug._choice.rounds` takes its timings from an injectable timer and
clock. These tests feed it steps whose true costs they know, with slow drift
and preemption injected (seeded, through ``hypothesis``), and check that it
picks the truly fastest candidate whenever it says it is sure, and that a
chooser never keeps or caches a decision it is not sure of.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug._choice.chooser import ImplementationChooser
from optiplug._choice.rounds import MAX_ROUNDS, StepSample, Verdict, run_rounds

NAMES = ("foreach", "fused", "loop")


class FakeClock:
    """A clock that the fake timer advances by each made-up step's wall time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ContendedTimer:
    """Made-up steps: true cost x slow drift, plus preemption of one victim (``"*"``: all) at random.

    A preempted step waits 2 to 30 times the slowest candidate's cost more
    wall time while its thread is switched out once (and gets only its true
    cost as CPU time).
    """

    def __init__(
        self,
        costs: dict[str, float],
        victim: str,
        chance: float,
        seed: int,
        *,
        visible: bool = True,
        clock: FakeClock | None = None,
    ) -> None:
        self.costs, self.victim, self.chance = costs, victim, chance
        self.random = random.Random(seed)
        self.visible = visible
        self.clock = clock or FakeClock()
        self.steps = 0
        self.hits: list[bool] = []  # per victim step, whether it was preempted

    def __call__(self, name: str) -> StepSample:
        self.steps += 1
        drift = 1.0 + 0.05 * math.sin(self.steps / 7.0)  # slow: within 5%, common to a round
        cost = self.costs[name] * drift
        victim = self.victim in (name, "*")
        hit = victim and self.random.random() < self.chance
        if victim:
            self.hits.append(hit)
        wall = cost + self.random.uniform(2.0, 30.0) * max(self.costs.values()) if hit else cost
        self.clock.now += wall
        if not self.visible:
            return StepSample(wall)
        return StepSample(wall, cpu=cost, switched_out=1 if hit else 0)


costs_strategy = st.tuples(
    st.floats(1e-5, 1.0),  # the fastest one's seconds
    st.lists(st.floats(1.3, 4.0), min_size=2, max_size=2),  # the others, >= 1.3x slower
    st.permutations(NAMES),
).map(lambda t: dict(zip(t[2], [t[0], t[0] * t[1][0], t[0] * t[1][1]], strict=True)))


def _rounds(timer: ContendedTimer) -> Verdict:
    return run_rounds(NAMES, timer, timer.clock, math.inf, _no_error)


def _no_error(name: str, error: Exception) -> None:
    raise AssertionError(f"{name} raised {error!r}")


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    costs=costs_strategy,
    victim=st.sampled_from(NAMES),
    chance=st.floats(0.0, 0.6),
    seed=st.integers(0, 2**32 - 1),
)
def test_preemption_seen_never_makes_it_pick_a_slower_one(
    costs: dict[str, float], victim: str, chance: float, seed: int
) -> None:
    # Clean rounds (no preemption on either side) decide; drift within 5%
    # moves a clean log-ratio by at most 2 * log(1.05) = 0.098 < log(1.3) = 0.262,
    # the smallest true gap, so every clean round ranks the pair right.
    verdict = _rounds(ContendedTimer(costs, victim, chance, seed))
    fastest = min(costs, key=costs.__getitem__)
    assert verdict.winner == fastest, verdict
    # With at most 60% of the victim's steps preempted, 31 rounds leave enough clean ones.
    if chance <= 0.3:
        assert verdict.trusted, verdict


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    costs=costs_strategy,
    victim=st.sampled_from(NAMES),
    chance=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**32 - 1),
)
def test_unseen_preemption_fools_it_only_where_it_hit_most_rounds(
    costs: dict[str, float], victim: str, chance: float, seed: int
) -> None:
    # No CPU time or switch counts (a CUDA step): the median of paired
    # log-ratios ranks a pair right while fewer than half its rounds are hit.
    timer = ContendedTimer(costs, victim, chance, seed, visible=False)
    verdict = _rounds(timer)
    fastest = min(costs, key=costs.__getitem__)
    if sum(timer.hits) < len(timer.hits) / 2:
        assert verdict.winner == fastest, verdict
    if verdict.trusted:
        # Trust needs the winner faster in over 3/4 of the rounds, or a
        # median log-ratio whose confidence interval ends at most log(1.15)
        # above 0: with at most 1/4 of the rounds hit the median is a clean
        # round's, whose sign is right (drift 0.098 < gap 0.262).
        assert verdict.winner == fastest or sum(timer.hits) > len(timer.hits) / 4, verdict


def test_rounds_go_on_while_in_doubt_and_stop_once_sure() -> None:
    costs = {"foreach": 3.0, "fused": 1.0, "loop": 2.0}
    calm = ContendedTimer(costs, "fused", 0.0, 0)
    assert _rounds(calm).rounds == 5
    stormy = ContendedTimer(costs, "*", 1.0, 0)  # every step preempted, by random delays
    verdict = _rounds(stormy)
    assert verdict.rounds == MAX_ROUNDS and not verdict.trusted, verdict
    assert "unpreempted in 0 of" in verdict.reason


def test_the_deadline_ends_the_rounds_on_the_injected_clock() -> None:
    clock = FakeClock()
    timer = ContendedTimer({"foreach": 3.0, "fused": 1.0, "loop": 2.0}, "*", 1.0, 0, clock=clock)
    verdict = run_rounds(NAMES, timer, clock, 10.0, _no_error)
    # Four rounds are always timed; the deadline (10 s of fake time) ends them then.
    assert verdict.rounds == 4 and not verdict.trusted


# ------------------------------------------------------------------ the chooser keeps only trust
class _FakeTimers:
    """A timer factory for the chooser: the same made-up timer whatever optimizers it is given."""

    def __init__(self, timer: ContendedTimer) -> None:
        self.timer = timer

    def __call__(
        self, optimizers: Mapping[str, torch.optim.Optimizer], device: torch.device
    ) -> ContendedTimer:
        assert set(optimizers) == set(NAMES)
        return self.timer


def _entries(file: Path) -> dict[str, object]:
    if not file.exists():
        return {}
    found: dict[str, object] = json.loads(file.read_text())["entries"]
    return found


@pytest.mark.parametrize("stormy", [False, True])
def test_a_chooser_stores_a_sure_winner_and_keeps_a_doubtful_one_in_process_only(
    stormy: bool, _cache_in_tmp: Path
) -> None:
    # loop is made the fastest, which it is not on any real CPU at this size:
    # the winner can only have come from the injected timings.
    costs = {"foreach": 3e-3, "fused": 2e-3, "loop": 1e-3}
    timer = ContendedTimer(costs, "*", 1.0 if stormy else 0.0, 0)  # stormy: every step preempted
    chooser = ImplementationChooser(timer=_FakeTimers(timer), clock=timer.clock)
    registry = optiplug.Registry(chooser=chooser)
    params = [torch.nn.Parameter(torch.ones(64)) for _ in range(2)]
    optimizer = registry.create("lion", params, lr=1e-4)
    chooser.wait_for_measurements()
    optimizer.step()
    [record] = chooser.measurements().values()
    assert record.trusted is not stormy, record
    if stormy:
        assert record.doubt and _entries(_cache_in_tmp) == {}  # never written for later processes
        assert timer.steps == 2 * 3 * MAX_ROUNDS  # measured again once, still in doubt
        # the best guess is kept for this process: a second optimizer runs the same kernel
        assert {winner for winner, _ in chooser.decisions().values()} == {record.winner}
        again = registry.create(
            "lion", [torch.nn.Parameter(torch.ones(64)) for _ in range(2)], lr=1e-4
        )
        chooser.wait_for_measurements()
        assert again.impl == optimizer.impl == record.winner  # type: ignore[attr-defined]
        assert timer.steps == 2 * 3 * MAX_ROUNDS  # nothing measured for it
    else:
        assert optimizer.impl == record.winner == "loop"  # type: ignore[attr-defined]
        [entry] = _entries(_cache_in_tmp).values()
        assert entry["winner"] == "loop"  # type: ignore[index]
        assert [winner for winner, _ in chooser.decisions().values()] == ["loop"]

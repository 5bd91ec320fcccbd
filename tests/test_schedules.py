"""Learning-rate schedules: values, validation, torch integration, plugins.

Reference curves are written here from the published definitions (Hugging
Face ``transformers.optimization`` and torch's ``lr_scheduler`` docs), not
imported. Our warm-up uses ``(s + 1) / W`` where Hugging Face uses ``s / W``;
comparisons check the post-warm-up part exactly and the warm-up part against
the reference shifted by one step.
"""

from __future__ import annotations

import io
import math
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
import optiplug.cli
from optiplug.errors import HyperparameterError, UnknownScheduleError

ROOT = Path(__file__).resolve().parent.parent
BUILTINS = [
    "constant",
    "cosine",
    "exponential",
    "inverse_sqrt",
    "linear",
    "linear_warmup",
    "multistep",
    "onecycle",
    "polynomial",
    "sequence",
    "step",
    "wsd",
]
TOL = 1e-12


# ------------------------------------------------------------------ registry and API
def test_every_builtin_is_listed_and_provided_by_the_core_plugin() -> None:
    assert optiplug.schedules() == BUILTINS
    for spec in optiplug.default_registry().schedule_specs():
        assert spec.provider is not None
        assert (spec.provider.plugin, spec.provider.distribution) == ("schedules", "optiplug")
        assert spec.summary


def test_unknown_schedule_name_suggests_the_closest() -> None:
    with pytest.raises(UnknownScheduleError, match="Did you mean 'cosine'") as caught:
        optiplug.schedule("cosin", total_steps=10)
    assert caught.value.suggestion == "cosine"
    assert isinstance(caught.value, KeyError)


EXAMPLES: dict[str, dict[str, Any]] = {
    "constant": {},
    "linear_warmup": {"warmup_steps": 4, "start_factor": 0.2},
    "cosine": {"total_steps": 100, "warmup_steps": 10, "min_ratio": 0.1},
    "linear": {"total_steps": 100, "warmup_steps": 10},
    "step": {"step_size": 10, "gamma": 0.5},
    "multistep": {"milestones": [3, 7], "gamma": 0.1},
    "exponential": {"gamma": 0.9},
    "polynomial": {"total_steps": 100, "power": 2, "end_ratio": 0.1, "warmup_steps": 10},
    "inverse_sqrt": {"warmup_steps": 4},
    "wsd": {"warmup_steps": 10, "stable_steps": 20, "decay_steps": 10, "min_ratio": 0.1},
    "onecycle": {"total_steps": 100},
    "sequence": {
        "schedules": [{"name": "linear_warmup", "warmup_steps": 5}, {"name": "constant"}],
        "boundaries": [5],
    },
}


@pytest.mark.parametrize("name", BUILTINS)
def test_round_trip_equality_repr_and_pickle(name: str) -> None:
    schedule = optiplug.schedule(name, **EXAMPLES[name])
    assert isinstance(schedule, optiplug.Schedule)
    data = schedule.to_dict()
    assert data["name"] == name
    assert optiplug.schedule(**data) == schedule
    assert hash(optiplug.schedule(**data)) == hash(schedule)
    assert repr(schedule).startswith(f"optiplug.schedule({name!r}")
    assert eval(repr(schedule), {"optiplug": optiplug}) == schedule
    restored = pickle.loads(pickle.dumps(schedule))
    assert restored == schedule
    assert [restored(s) for s in range(50)] == [schedule(s) for s in range(50)]


def test_schedules_are_frozen() -> None:
    schedule = optiplug.schedule("cosine", total_steps=10)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        schedule.total_steps = 20  # type: ignore[misc]


# ------------------------------------------------------------------ hand-picked values
def _half(p: float) -> float:
    return 0.5 * (1 + math.cos(math.pi * p))


HAND_PICKED: list[tuple[str, dict[str, Any], dict[int, float]]] = [
    ("constant", {}, {0: 1, 1: 1, 10**9: 1}),
    ("linear_warmup", {"warmup_steps": 4}, {0: 0.25, 1: 0.5, 3: 1, 4: 1, 10**6: 1}),
    ("linear_warmup", {"warmup_steps": 4, "start_factor": 0.2}, {0: 0.4, 1: 0.6, 3: 1, 9: 1}),
    ("linear_warmup", {"warmup_steps": 0}, {0: 1, 5: 1}),
    (
        "cosine",
        {"total_steps": 100, "warmup_steps": 10, "min_ratio": 0.1},
        {
            0: 0.1,
            1: 0.2,
            9: 1,
            10: 1,
            55: 0.55,
            99: 0.1 + 0.9 * _half(89 / 90),
            100: 0.1,
            10**6: 0.1,
        },
    ),
    ("cosine", {"total_steps": 100}, {0: 1, 50: 0.5, 100: 0, 101: 0}),
    (
        "linear",
        {"total_steps": 100, "warmup_steps": 10},
        {0: 0.1, 1: 0.2, 9: 1, 10: 1, 55: 0.5, 100: 0, 500: 0},
    ),
    ("linear", {"total_steps": 100, "min_ratio": 0.2}, {0: 1, 50: 0.6, 100: 0.2, 200: 0.2}),
    ("step", {"step_size": 10, "gamma": 0.5}, {0: 1, 1: 1, 9: 1, 10: 0.5, 25: 0.25}),
    (
        "multistep",
        {"milestones": [3, 7], "gamma": 0.1},
        {0: 1, 2: 1, 3: 0.1, 6: 0.1, 7: 0.1**2, 100: 0.1**2},
    ),
    ("multistep", {"milestones": [0], "gamma": 0.5}, {0: 0.5, 10: 0.5}),
    ("exponential", {"gamma": 0.9}, {0: 1, 1: 0.9, 2: 0.9**2, 50: 0.9**50}),
    (
        "polynomial",
        {"total_steps": 100, "power": 2, "end_ratio": 0.1, "warmup_steps": 10},
        {0: 0.1, 1: 0.2, 9: 1, 10: 1, 55: 0.325, 100: 0.1, 200: 0.1},
    ),
    (
        "inverse_sqrt",
        {"warmup_steps": 4},
        {0: 0.25, 1: 0.5, 3: 1, 4: 1, 16: 0.5, 400: 0.1},
    ),
    (
        "wsd",
        {"warmup_steps": 10, "stable_steps": 20, "decay_steps": 10, "decay": "linear"},
        {0: 0.1, 9: 1, 10: 1, 29: 1, 30: 1, 35: 0.5, 39: 0.1, 40: 0, 1000: 0},
    ),
    (
        "wsd",
        {"warmup_steps": 10, "stable_steps": 20, "decay_steps": 10, "min_ratio": 0.1},
        {0: 0.1, 30: 1, 35: 0.55, 40: 0.1, 41: 0.1},
    ),
    (
        "wsd",
        {"warmup_steps": 0, "stable_steps": 5, "decay_steps": 4, "decay": "1-sqrt"},
        {0: 1, 4: 1, 5: 1, 6: 0.5, 9: 0, 10: 0},
    ),
    (
        "onecycle",
        {"total_steps": 100},
        {
            0: 1 / 25,
            29: 1,
            64: 4e-6 + (1 - 4e-6) * 0.5,
            99: 4e-6,
            100: 4e-6,
            10**5: 4e-6,
        },
    ),
    (
        "sequence",
        {
            "schedules": [
                {"name": "linear_warmup", "warmup_steps": 5},
                {"name": "cosine", "total_steps": 10},
                {"name": "constant"},
            ],
            "boundaries": [5, 20],
        },
        {0: 0.2, 4: 1, 5: 1, 10: 0.5, 15: 0, 19: 0, 20: 1, 10**4: 1},
    ),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    HAND_PICKED,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(HAND_PICKED)],
)
def test_hand_picked_values(name: str, kwargs: dict[str, Any], expected: dict[int, float]) -> None:
    schedule = optiplug.schedule(name, **kwargs)
    for step, value in expected.items():
        assert schedule(step) == pytest.approx(value, abs=TOL, rel=TOL), (name, step)
        assert isinstance(schedule(step), float)


@pytest.mark.parametrize("name", ["linear_warmup", "cosine", "linear", "polynomial", "wsd"])
def test_warmup_never_gives_zero_lr_on_the_first_update(name: str) -> None:
    kwargs = {
        "linear_warmup": {"warmup_steps": 1000},
        "cosine": {"total_steps": 2000, "warmup_steps": 1000},
        "linear": {"total_steps": 2000, "warmup_steps": 1000},
        "polynomial": {"total_steps": 2000, "warmup_steps": 1000},
        "wsd": {"warmup_steps": 1000, "stable_steps": 0, "decay_steps": 10},
    }[name]
    schedule = optiplug.schedule(name, **kwargs)
    assert schedule(0) == pytest.approx(1 / 1000)
    assert schedule(999) == 1.0


# ------------------------------------------------------------------ published references
def hf_cosine(s: int, warmup: int, total: int, min_rate: float = 0.0) -> float:
    """HF get_cosine_schedule_with_warmup (num_cycles=0.5), with optional min_lr_rate."""
    if s < warmup:
        return s / max(1, warmup)
    progress = (s - warmup) / max(1, total - warmup)
    factor = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
    return max(0.0, factor * (1 - min_rate) + min_rate)


def hf_linear(s: int, warmup: int, total: int) -> float:
    """HF get_linear_schedule_with_warmup."""
    if s < warmup:
        return s / max(1, warmup)
    return max(0.0, (total - s) / max(1, total - warmup))


def hf_polynomial(s: int, warmup: int, total: int, end: float, power: float) -> float:
    """HF get_polynomial_decay_schedule_with_warmup with lr_init=1, lr_end=end."""
    if s < warmup:
        return s / max(1, warmup)
    if s > total:
        return end
    remaining = 1 - (s - warmup) / (total - warmup)
    return (1 - end) * remaining**power + end


def hf_inverse_sqrt(s: int, warmup: int) -> float:
    """HF get_inverse_sqrt_schedule with timescale=warmup (so its shift is 0)."""
    timescale = warmup
    if s < warmup:
        return s / max(1, warmup)
    shift = timescale - warmup
    return 1.0 / math.sqrt((s + shift) / timescale)


def hf_wsd(s: int, warmup: int, stable: int, decay_steps: int, decay: str, mn: float) -> float:
    """HF get_wsd_schedule (linear warm-up, num_cycles=0.5)."""
    if s < warmup:
        return max(0.0, (s / max(1, warmup)) * (1 - mn) + mn)
    if s < warmup + stable:
        return 1.0
    if s < warmup + stable + decay_steps:
        p = (s - warmup - stable) / max(1, decay_steps)
        factor = {
            "linear": 1 - p,
            "cosine": 0.5 * (1 + math.cos(math.pi * 0.5 * 2 * p)),
            "1-sqrt": 1 - math.sqrt(p),
        }[decay]
        return max(0.0, factor * (1 - mn) + mn)
    return mn


def torch_onecycle(s: int, total: int, pct: float, div: float, final_div: float) -> float:
    """torch OneCycleLR (cos, two phases) with max_lr=1, from its documented phases."""
    start = 1 / div
    phases = [(pct * total - 1, start, 1.0), (total - 1, 1.0, start / final_div)]
    begin = 0.0
    for index, (end, lo, hi) in enumerate(phases):
        if s <= end or index == len(phases) - 1:
            pct_done = (s - begin) / (end - begin)
            return hi + (lo - hi) / 2 * (math.cos(math.pi * pct_done) + 1)
        begin = end
    raise AssertionError


def assert_matches_hf_shifted(
    ours: Callable[[int], float], reference: Callable[[int], float], warmup: int, total: int
) -> None:
    """Post-warm-up equal; warm-up equals the reference one step later ((s+1)/W vs s/W)."""
    for s in range(total + 1):
        expected = reference(s + 1) if s < warmup else reference(s)
        assert abs(ours(s) - expected) <= TOL, s


@pytest.mark.parametrize(("warmup", "min_ratio"), [(0, 0.0), (100, 0.0), (37, 0.1), (1000, 0.0)])
def test_cosine_matches_hf(warmup: int, min_ratio: float) -> None:
    total = 1000
    ours = optiplug.schedule("cosine", total_steps=total, warmup_steps=warmup, min_ratio=min_ratio)
    assert_matches_hf_shifted(ours, lambda s: hf_cosine(s, warmup, total, min_ratio), warmup, total)


@pytest.mark.parametrize("warmup", [0, 100, 999])
def test_linear_matches_hf(warmup: int) -> None:
    ours = optiplug.schedule("linear", total_steps=1000, warmup_steps=warmup)
    assert_matches_hf_shifted(ours, lambda s: hf_linear(s, warmup, 1000), warmup, 1000)


@pytest.mark.parametrize(
    ("power", "end", "warmup"), [(1.0, 0.0, 0), (2.0, 0.01, 100), (0.5, 0.2, 7)]
)
def test_polynomial_matches_hf(power: float, end: float, warmup: int) -> None:
    ours = optiplug.schedule(
        "polynomial", total_steps=1000, power=power, end_ratio=end, warmup_steps=warmup
    )
    assert_matches_hf_shifted(
        ours, lambda s: hf_polynomial(s, warmup, 1000, end, power), warmup, 1000
    )


@pytest.mark.parametrize("warmup", [1, 100])
def test_inverse_sqrt_matches_hf(warmup: int) -> None:
    ours = optiplug.schedule("inverse_sqrt", warmup_steps=warmup)
    assert_matches_hf_shifted(ours, lambda s: hf_inverse_sqrt(s, warmup), warmup, 1000)


@pytest.mark.parametrize("decay", ["cosine", "linear", "1-sqrt"])
@pytest.mark.parametrize("min_ratio", [0.0, 0.1])
def test_wsd_matches_hf(decay: str, min_ratio: float) -> None:
    warmup, stable, decay_steps = 100, 500, 300
    ours = optiplug.schedule(
        "wsd",
        warmup_steps=warmup,
        stable_steps=stable,
        decay_steps=decay_steps,
        decay=decay,
        min_ratio=min_ratio,
    )
    for s in range(warmup, 1000):  # HF warms up from min_ratio; we warm up from 0
        assert abs(ours(s) - hf_wsd(s, warmup, stable, decay_steps, decay, min_ratio)) <= TOL
    for s in range(warmup):  # our warm-up is HF's (min_ratio=0) one step later
        assert abs(ours(s) - hf_wsd(s + 1, warmup, stable, decay_steps, decay, 0.0)) <= TOL


@pytest.mark.parametrize(
    ("pct", "div", "final_div"), [(0.3, 25.0, 1e4), (0.25, 10.0, 100.0), (0.0, 1.0, 1.0)]
)
def test_onecycle_matches_torch_formula_and_torch(pct: float, div: float, final_div: float) -> None:
    total = 1000
    ours = optiplug.schedule(
        "onecycle", total_steps=total, pct_start=pct, div_factor=div, final_div_factor=final_div
    )
    expected = [torch_onecycle(s, total, pct, div, final_div) for s in range(total)]
    assert max(abs(ours(s) - e) for s, e in enumerate(expected)) <= TOL
    if pct > 0:  # torch's own class divides by zero at pct_start=0
        torch_lrs = _drive_torch(
            lambda opt: torch.optim.lr_scheduler.OneCycleLR(
                opt,
                max_lr=1.0,
                total_steps=total,
                pct_start=pct,
                div_factor=div,
                final_div_factor=final_div,
                cycle_momentum=False,
            ),
            total,
        )
        assert max(abs(ours(s) - lr) for s, lr in enumerate(torch_lrs)) <= TOL
    assert ours(total - 1) == ours(total) == ours(10 * total)


def _drive_torch(make: Callable[[torch.optim.Optimizer], Any], steps: int) -> list[float]:
    """The lr a real torch scheduler over SGD(lr=1) gives for steps 0..steps-1."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = make(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize(
    ("name", "kwargs", "make", "formula"),
    [
        (
            "step",
            {"step_size": 30, "gamma": 0.5},
            lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=30, gamma=0.5),
            lambda s: 0.5 ** (s // 30),
        ),
        (
            "multistep",
            {"milestones": [100, 250, 600], "gamma": 0.3},
            lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [100, 250, 600], gamma=0.3),
            lambda s: 0.3 ** sum(s >= m for m in (100, 250, 600)),
        ),
        (
            "exponential",
            {"gamma": 0.995},
            lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.995),
            lambda s: 0.995**s,
        ),
    ],
)
def test_step_multistep_exponential_match_torch(
    name: str, kwargs: dict[str, Any], make: Callable[..., Any], formula: Callable[[int], float]
) -> None:
    ours = optiplug.schedule(name, **kwargs)
    torch_lrs = _drive_torch(make, 1000)
    for s in range(1000):
        assert abs(ours(s) - formula(s)) <= TOL
        assert abs(ours(s) - torch_lrs[s]) <= TOL


# ------------------------------------------------------------------ validation
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("cosine", {"total_steps": 10, "warmup_steps": 11}, "warmup_steps"),
    ("cosine", {"total_steps": -5}, "total_steps"),
    ("cosine", {"total_steps": 0}, "total_steps"),
    ("cosine", {"total_steps": 10.5}, "total_steps"),
    ("cosine", {"total_steps": 10, "min_ratio": 1.5}, "min_ratio"),
    ("cosine", {"total_steps": 10, "min_ratio": float("nan")}, "min_ratio"),
    ("linear", {"total_steps": 10, "warmup_steps": -1}, "warmup_steps"),
    ("linear_warmup", {"warmup_steps": 5, "start_factor": -0.1}, "start_factor"),
    ("linear_warmup", {"warmup_steps": True}, "warmup_steps"),
    ("step", {"step_size": 0}, "step_size"),
    ("step", {"step_size": 10, "gamma": 0}, "gamma"),
    ("step", {"step_size": 10, "gamma": -0.5}, "gamma"),
    ("multistep", {"milestones": [5, 3]}, "milestones"),
    ("multistep", {"milestones": [3, 3]}, "milestones"),
    ("multistep", {"milestones": [-1, 3]}, "milestones"),
    ("multistep", {"milestones": 5}, "milestones"),
    ("exponential", {"gamma": 0.0}, "gamma"),
    ("exponential", {"gamma": 1.5}, "gamma"),
    ("polynomial", {"total_steps": 10, "power": 0}, "power"),
    ("polynomial", {"total_steps": 10, "end_ratio": 2}, "end_ratio"),
    ("polynomial", {"total_steps": 10, "warmup_steps": 20}, "warmup_steps"),
    ("inverse_sqrt", {"warmup_steps": 0}, "warmup_steps"),
    ("wsd", {"warmup_steps": 1, "stable_steps": -1, "decay_steps": 1}, "stable_steps"),
    ("wsd", {"warmup_steps": 1, "stable_steps": 1, "decay_steps": 1, "decay": "exp"}, "decay"),
    ("onecycle", {"total_steps": 10, "pct_start": 1.0}, "pct_start"),
    ("onecycle", {"total_steps": 10, "div_factor": 0.5}, "div_factor"),
    ("onecycle", {"total_steps": 10, "final_div_factor": 0}, "final_div_factor"),
    ("sequence", {"schedules": [], "boundaries": []}, "schedules"),
    ("sequence", {"schedules": [{"name": "constant"}] * 2, "boundaries": []}, "boundaries"),
    ("sequence", {"schedules": [{"name": "constant"}] * 3, "boundaries": [5, 5]}, "boundaries"),
    ("sequence", {"schedules": [{"name": "constant"}] * 2, "boundaries": [0]}, "boundaries"),
    ("sequence", {"schedules": [lambda s: 1.0], "boundaries": []}, "schedules[0]"),
]


@pytest.mark.parametrize(("name", "kwargs", "field"), BAD, ids=[f"{n}-{f}" for n, _, f in BAD])
def test_invalid_parameters_name_schedule_field_and_value(
    name: str, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(HyperparameterError) as caught:
        optiplug.schedule(name, **kwargs)
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.algorithm, error.field) == (name, field)
    message = str(error)
    assert message.startswith(f"{name}: invalid {field}=")
    assert repr(error.value) in message


def test_unknown_keyword_has_a_did_you_mean_and_missing_one_is_named() -> None:
    with pytest.raises(
        HyperparameterError,
        match=r"^unknown parameter 'warmup_step' for schedule cosine; did you mean 'warmup_steps'\? "
        r"\(accepted: min_ratio, total_steps, warmup_steps\)$",
    ) as caught:
        optiplug.schedule("cosine", total_steps=10, warmup_step=3)
    assert (caught.value.algorithm, caught.value.field) == ("cosine", "warmup_step")
    with pytest.raises(
        HyperparameterError, match=r"^schedule cosine: missing required parameter 'total_steps'$"
    ) as caught:
        optiplug.schedule("cosine", warmup_steps=3)
    assert caught.value.field == "total_steps"


def test_errors_inside_a_sequence_name_the_inner_schedule() -> None:
    with pytest.raises(HyperparameterError) as caught:
        optiplug.schedule(
            "sequence",
            schedules=[{"name": "constant"}, {"name": "cosine", "total_steps": 0}],
            boundaries=[3],
        )
    assert (caught.value.algorithm, caught.value.field) == ("cosine", "total_steps")


@pytest.mark.parametrize("step", [-1, 1.0, True, "3", None])
def test_step_must_be_a_non_negative_int(step: Any) -> None:
    schedule = optiplug.schedule("cosine", total_steps=10)
    with pytest.raises(HyperparameterError, match="step") as caught:
        schedule(step)
    assert caught.value.field == "step"


def test_numpy_like_integers_are_normalised() -> None:
    import numpy as np

    schedule = optiplug.schedule("cosine", total_steps=np.int64(100), warmup_steps=np.int32(10))
    assert schedule == optiplug.schedule("cosine", total_steps=100, warmup_steps=10)
    assert type(schedule.total_steps) is int
    assert schedule(np.int64(55)) == schedule(55)


# ------------------------------------------------------------------ properties (hypothesis)
STEP = st.integers(min_value=0, max_value=2**62)
SMALL_STEP = st.integers(min_value=0, max_value=10**6)
RATIO = st.floats(min_value=0.0, max_value=1.0)
GAMMA = st.floats(min_value=0.0, max_value=1.0, exclude_min=True)
POSITIVE = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)
AT_LEAST_ONE = st.floats(min_value=1.0, allow_infinity=False)


@st.composite
def total_and_warmup(draw: st.DrawFn) -> dict[str, int]:
    total = draw(st.integers(min_value=1, max_value=10**6))
    return {"total_steps": total, "warmup_steps": draw(st.integers(0, total))}


def increasing(minimum: int, size: int | None = None) -> st.SearchStrategy[list[int]]:
    low, high = (0, 6) if size is None else (size, size)
    elements = st.integers(minimum, 10**6)
    return st.lists(elements, unique=True, min_size=low, max_size=high).map(sorted)


PARAMS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "constant": st.just({}),
    "linear_warmup": st.fixed_dictionaries(
        {"warmup_steps": SMALL_STEP}, optional={"start_factor": RATIO}
    ),
    "cosine": st.builds(lambda tw, m: {**tw, "min_ratio": m}, total_and_warmup(), RATIO),
    "linear": st.builds(lambda tw, m: {**tw, "min_ratio": m}, total_and_warmup(), RATIO),
    "step": st.fixed_dictionaries({"step_size": st.integers(1, 10**6)}, optional={"gamma": GAMMA}),
    "multistep": st.fixed_dictionaries({"milestones": increasing(0)}, optional={"gamma": GAMMA}),
    "exponential": st.fixed_dictionaries({"gamma": GAMMA}),
    "polynomial": st.builds(
        lambda tw, p, e: {**tw, "power": p, "end_ratio": e}, total_and_warmup(), POSITIVE, RATIO
    ),
    "inverse_sqrt": st.fixed_dictionaries({"warmup_steps": st.integers(1, 10**6)}),
    "wsd": st.fixed_dictionaries(
        {
            "warmup_steps": SMALL_STEP,
            "stable_steps": SMALL_STEP,
            "decay_steps": SMALL_STEP,
            "decay": st.sampled_from(["cosine", "linear", "1-sqrt"]),
            "min_ratio": RATIO,
        }
    ),
    "onecycle": st.fixed_dictionaries(
        {"total_steps": st.integers(1, 10**6)},
        optional={
            "pct_start": st.floats(0.0, 1.0, exclude_max=True),
            "div_factor": AT_LEAST_ONE,
            "final_div_factor": AT_LEAST_ONE,
        },
    ),
}


CHILDREN = sorted(PARAMS)


@st.composite
def sequence_params(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(CHILDREN), min_size=1, max_size=3))
    children = [{"name": name, **draw(PARAMS[name])} for name in names]
    return {"schedules": children, "boundaries": draw(increasing(1, len(children) - 1))}


PARAMS["sequence"] = sequence_params()


def test_property_strategies_cover_every_builtin() -> None:
    assert sorted(PARAMS) == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_finite_non_negative_deterministic_and_picklable(name: str, data: st.DataObject) -> None:
    kwargs = data.draw(PARAMS[name], label="params")
    schedule = optiplug.schedule(name, **kwargs)
    steps = data.draw(st.lists(STEP | SMALL_STEP, min_size=1, max_size=8), label="steps")
    values = [schedule(step) for step in steps]
    for value in values:
        assert math.isfinite(value)
        assert value >= 0.0
    assert [schedule(step) for step in steps] == values
    assert [optiplug.schedule(name, **kwargs)(step) for step in steps] == values
    restored = pickle.loads(pickle.dumps(schedule))
    assert restored == schedule
    assert [restored(step) for step in steps] == values
    assert optiplug.schedule(**schedule.to_dict()) == schedule


# ------------------------------------------------------------------ torch scheduler
def _model_and_sgd(lrs: tuple[float, ...] = (0.1, 0.02)) -> tuple[list[torch.Tensor], Any]:
    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, generator=generator)) for _ in lrs]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, lrs, strict=True)]
    return params, torch.optim.SGD(groups, momentum=0.9)


def _train(params: list[torch.Tensor], optimizer: Any, scheduler: Any, steps: int) -> list[list]:
    seen = []
    for _ in range(steps):
        seen.append([group["lr"] for group in optimizer.param_groups])
        loss = sum((p**2).sum() for p in params)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return seen


SCHEDULE = optiplug.schedule("cosine", total_steps=80, warmup_steps=10, min_ratio=0.05)


def test_as_torch_is_an_lr_scheduler_giving_the_schedule_lrs(recwarn: Any) -> None:
    params, optimizer = _model_and_sgd()
    scheduler = SCHEDULE.as_torch(optimizer)
    assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
    seen = _train(params, optimizer, scheduler, 100)
    for step, lrs in enumerate(seen):
        assert lrs == [0.1 * SCHEDULE(step), 0.02 * SCHEDULE(step)]
    assert scheduler.get_last_lr() == [0.1 * SCHEDULE(100), 0.02 * SCHEDULE(100)]
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]


def test_as_torch_uses_initial_lr_when_present() -> None:
    _, optimizer = _model_and_sgd()
    optimizer.param_groups[0]["initial_lr"] = 0.5
    scheduler = SCHEDULE.as_torch(optimizer)
    assert scheduler.base_lrs == [0.5, 0.02]
    assert optimizer.param_groups[0]["lr"] == 0.5 * SCHEDULE(0)


def _saved(obj: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("scheduler_first", [True, False])
def test_as_torch_state_dict_resume_continues_identically(scheduler_first: bool) -> None:
    params, optimizer = _model_and_sgd()
    reference = _train(params, optimizer, SCHEDULE.as_torch(optimizer), 100)
    final = [p.detach().clone() for p in params]

    params, optimizer = _model_and_sgd()
    scheduler = SCHEDULE.as_torch(optimizer)
    first = _train(params, optimizer, scheduler, 40)
    state = _saved(
        {
            "params": [p.detach() for p in params],
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        }
    )

    params, optimizer = _model_and_sgd()
    with torch.no_grad():
        for param, saved in zip(params, state["params"], strict=True):
            param.copy_(saved)
    if scheduler_first:  # torch's documented order
        scheduler = SCHEDULE.as_torch(optimizer)
        optimizer.load_state_dict(state["optimizer"])
    else:  # the other order works too: load_state_dict re-applies the lrs
        optimizer.load_state_dict(state["optimizer"])
        scheduler = SCHEDULE.as_torch(optimizer)
    scheduler.load_state_dict(state["scheduler"])
    rest = _train(params, optimizer, scheduler, 60)
    assert first + rest == reference
    for param, expected in zip(params, final, strict=True):
        assert torch.equal(param.detach(), expected)


def test_as_torch_scheduler_pickles_and_continues() -> None:
    params, optimizer = _model_and_sgd()
    scheduler = SCHEDULE.as_torch(optimizer)
    _train(params, optimizer, scheduler, 30)
    clone = pickle.loads(pickle.dumps(scheduler))
    assert clone.schedule == SCHEDULE
    assert clone.last_epoch == scheduler.last_epoch == 30
    for _ in range(5):
        clone.optimizer.step()
        clone.step()
        scheduler.step()
    assert (
        clone.get_last_lr() == scheduler.get_last_lr() == [0.1 * SCHEDULE(35), 0.02 * SCHEDULE(35)]
    )
    assert "schedule" not in scheduler.state_dict()


def test_as_torch_resumes_with_last_epoch_without_initial_lr() -> None:
    _, optimizer = _model_and_sgd()
    scheduler = SCHEDULE.as_torch(optimizer, last_epoch=9)  # no KeyError on 'initial_lr'
    assert scheduler.last_epoch == 10
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * SCHEDULE(10))


def test_as_torch_with_tensor_lr_updates_in_place() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    lr = torch.tensor(0.1)
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = SCHEDULE.as_torch(optimizer)
    for step in range(1, 20):
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] is lr
        assert lr.item() == pytest.approx(0.1 * SCHEDULE(step), rel=1e-6)


# ------------------------------------------------------------------ apply
def test_apply_sets_base_times_schedule_times_scale() -> None:
    _, optimizer = _model_and_sgd()
    applied = SCHEDULE.apply(optimizer, 5, scale=4.0)
    assert applied == [0.1 * SCHEDULE(5) * 4.0, 0.02 * SCHEDULE(5) * 4.0]
    assert [g["lr"] for g in optimizer.param_groups] == applied
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.1, 0.02]
    # the base is remembered: applying again does not compound
    assert SCHEDULE.apply(optimizer, 5, scale=4.0) == applied
    assert SCHEDULE.apply(optimizer, 50, base_lrs=[1.0, 2.0]) == [SCHEDULE(50), 2 * SCHEDULE(50)]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"step": -1}, "step"),
        ({"step": 1, "scale": -1.0}, "scale"),
        ({"step": 1, "scale": float("inf")}, "scale"),
        ({"step": 1, "base_lrs": [0.1]}, "base_lrs"),
    ],
)
def test_apply_rejects_bad_input_without_touching_the_optimizer(
    kwargs: dict[str, Any], field: str
) -> None:
    _, optimizer = _model_and_sgd()
    with pytest.raises(HyperparameterError) as caught:
        SCHEDULE.apply(optimizer, **kwargs)
    assert caught.value.field == field
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.02]


def test_apply_to_tensor_lr_is_in_place_and_does_not_recompile() -> None:
    import torch._dynamo

    param = torch.nn.Parameter(torch.ones(3))
    lr = torch.tensor(0.1)
    optimizer = torch.optim.SGD([param], lr=lr)
    compiles = 0

    def counting_backend(graph: Any, example_inputs: Any) -> Any:
        nonlocal compiles
        compiles += 1
        return graph.forward

    @torch.compile(backend=counting_backend)
    def scaled_update(x: torch.Tensor, group_lr: torch.Tensor) -> torch.Tensor:
        return x - group_lr * x

    torch._dynamo.reset()
    x = torch.ones(3)
    for step in range(12):
        SCHEDULE.apply(optimizer, step)
        assert optimizer.param_groups[0]["lr"] is lr
        expected = 1 - 0.1 * SCHEDULE(step)
        out = scaled_update(x, optimizer.param_groups[0]["lr"])
        assert torch.allclose(out, torch.full((3,), expected))
    assert compiles == 1
    torch._dynamo.reset()


# ------------------------------------------------------------------ third-party plugins
@attrs.frozen(kw_only=True)
class HalvingSchedule(optiplug.Schedule):
    """Halve the multiplier every `every` steps (a third-party schedule)."""

    name: ClassVar[str] = "halving"
    formula: ClassVar[str] = "0.5 ** floor(s / every)"

    every: int = 10

    def value_at(self, step: int) -> float:
        return 0.5 ** (step // self.every)


class AcmePlugin:
    """A third-party plugin providing one schedule."""

    @optiplug.hookimpl
    def optiplug_schedules(self) -> list[optiplug.ScheduleSpec]:
        return [optiplug.ScheduleSpec(name="halving", factory=HalvingSchedule)]


@pytest.fixture
def acme_registry(monkeypatch: pytest.MonkeyPatch) -> optiplug.Registry:
    registry = optiplug.Registry(autoload=False)
    registry.register(AcmePlugin(), "acme", distribution="optiplug-acme", version="1.2.3")
    monkeypatch.setattr(optiplug._api, "_default", registry)
    return registry


def test_third_party_schedule_registers_like_the_builtins(
    acme_registry: optiplug.Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert optiplug.schedules() == sorted([*BUILTINS, "halving"])
    halving = optiplug.schedule("halving", every=3)
    assert [halving(s) for s in (0, 2, 3, 7)] == [1.0, 1.0, 0.5, 0.25]
    assert optiplug.schedule(**halving.to_dict()) == halving
    with pytest.raises(HyperparameterError, match="did you mean 'every'"):
        optiplug.schedule("halving", evry=3)
    nested = optiplug.schedule(
        "sequence", schedules=[{"name": "constant"}, halving.to_dict()], boundaries=[5]
    )
    assert nested(5 + 3) == 0.5
    assert optiplug.cli.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"schedule\s+halving\s+-\s+acme\s+optiplug-acme\s+1\.2\.3\s+active", listed)
    assert re.search(r"schedule\s+cosine\s+-\s+schedules\s+optiplug\s", listed)
    assert optiplug.cli.main(["show", "halving"]) == 0
    assert "0.5 ** floor(s / every)" in capsys.readouterr().out


# ------------------------------------------------------------------ docs
def test_docs_page_lists_every_schedule_with_formula_and_plot() -> None:
    page = (ROOT / "docs" / "schedules.md").read_text(encoding="utf-8")
    for name in BUILTINS:
        assert re.search(rf"^### `{name}`", page, re.MULTILINE), name
        image = ROOT / "docs" / "img" / "schedules" / f"{name}.png"
        assert f"img/schedules/{name}.png" in page, name
        assert image.is_file() and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name

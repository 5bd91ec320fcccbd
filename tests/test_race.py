"""``optiplug train --compare A,B --seeds N --target-loss X``: the race and its statistics.

The statistics are checked against published t-table values and against
formulas written out here (closed forms of the t distribution for 1 and 2
degrees of freedom, the beta function's, a Simpson integral of the t density,
Welch-Satterthwaite in exact fractions), never against this code's own output.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import optiplug
from optiplug.cli import main
from optiplug_train.compare import parse_compare
from optiplug_train.config import OptionError
from optiplug_train.race import seconds_to_target, steps_to_target, summarize
from optiplug_train.report import race_table
from optiplug_train.results import TrainResult
from optiplug_train.stats import (
    StatisticsError,
    mean_interval,
    regularized_beta,
    t_cdf,
    t_quantile,
    two_sided_p,
    welch,
)
from optiplug_train.variants import split_variant

TINY = [
    "--layers", "1", "--d-model", "32", "--heads", "2", "--block-size", "32",
    "--batch-size", "8", "--max-chars", "100000", "--sample-chars", "0",
    "--eval-windows", "16", "--impl", "loop", "--threads", "1", "--quiet",
    "--steps", "20", "--eval-every", "5",
]  # fmt: skip

# Published two-sided 95% and 99% critical values of Student's t, to three
# decimals (any t table, e.g. NIST/SEMATECH e-Handbook of Statistical Methods,
# section 1.3.6.7.2): rounding to three decimals leaves at most 5e-4 of error.
T_TABLE = [
    (0.975, 1, 12.706),
    (0.975, 2, 4.303),
    (0.975, 4, 2.776),
    (0.975, 10, 2.228),
    (0.975, 30, 2.042),
    (0.995, 1, 63.657),
    (0.995, 5, 4.032),
]
TABLE_ROUNDING = 5e-4


def student_density(u: float, df: float) -> float:
    """Student's t density, from its published formula."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(u * u / df))


def reference_two_sided_p(t: float, df: float, intervals: int = 20_000) -> float:
    """``1 - 2 * integral_0^|t| density``, by composite Simpson in float64.

    Simpson's error is ``|t| h^4 max|f''''| / 180`` with ``h = |t| / 20000``:
    for ``|t| <= 10`` and the density's fourth derivative below 10, that is
    under 1e-15; the float64 sum of 20,001 terms adds about 2e-12 at most.
    """
    width = abs(t) / intervals
    total = student_density(0.0, df) + student_density(abs(t), df)
    total += sum((4 if k % 2 else 2) * student_density(k * width, df) for k in range(1, intervals))
    return 1.0 - 2.0 * total * width / 3.0


# ------------------------------------------------------------------ t distribution
@pytest.mark.parametrize(("probability", "df", "published"), T_TABLE)
def test_t_quantile_matches_the_published_table(
    probability: float, df: int, published: float
) -> None:
    assert t_quantile(probability, df) == pytest.approx(published, abs=TABLE_ROUNDING)
    assert t_quantile(1 - probability, df) == pytest.approx(-published, abs=TABLE_ROUNDING)


# The continued fraction stops once its last factor is within 1e-15 of 1, and
# lgamma, exp and log each carry a few ulps: the CDF is good to about 1e-14
# absolute, so 1e-12 leaves a margin on any CPU.
CDF_TOLERANCE = 1e-12


@given(st.floats(min_value=-1e4, max_value=1e4, allow_nan=False))
def test_t_cdf_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(t: float) -> None:
    cauchy = 0.5 + math.atan(t) / math.pi  # df = 1 is the Cauchy distribution
    assert t_cdf(t, 1) == pytest.approx(cauchy, abs=CDF_TOLERANCE)
    two = 0.5 + t / (2 * math.sqrt(2 + t * t))  # df = 2
    assert t_cdf(t, 2) == pytest.approx(two, abs=CDF_TOLERANCE)


@given(
    st.integers(min_value=0, max_value=2**20).map(lambda k: k / 2**20),  # 1 - x is exact
    st.floats(min_value=0.05, max_value=50.0),
    st.floats(min_value=0.05, max_value=50.0),
)
def test_regularized_beta_matches_its_closed_forms_and_symmetry(
    x: float, a: float, b: float
) -> None:
    assert regularized_beta(x, a, 1.0) == pytest.approx(x**a, abs=CDF_TOLERANCE)
    assert regularized_beta(x, 1.0, b) == pytest.approx(1 - (1 - x) ** b, abs=CDF_TOLERANCE)
    mirrored = 1.0 - regularized_beta(1.0 - x, b, a)
    assert regularized_beta(x, a, b) == pytest.approx(mirrored, abs=CDF_TOLERANCE)


@pytest.mark.parametrize(("t", "df"), [(0.5, 1.5), (1.1338934, 3.2347), (4.9, 1.47), (2.5, 17.3)])
def test_two_sided_p_matches_the_integrated_density(t: float, df: float) -> None:
    assert two_sided_p(t, df) == pytest.approx(reference_two_sided_p(t, df), abs=1e-10)


def test_mean_interval_is_the_t_interval() -> None:
    mean, half = mean_interval([1.0, 2.0, 3.0])  # s = 1, n = 3, df = 2
    assert mean == 2.0
    assert half == pytest.approx(4.303 / math.sqrt(3), abs=TABLE_ROUNDING / math.sqrt(3))
    single, none = mean_interval([5.0])
    assert single == 5.0 and math.isnan(none)


def test_welch_matches_a_hand_computation() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    # by hand, in exact fractions: s_a^2 = 5/3, s_b^2 = 4; v = s^2 / n
    v_a, v_b = Fraction(5, 3) / 4, Fraction(4) / 3
    df = (v_a + v_b) ** 2 / (v_a**2 / 3 + v_b**2 / 2)
    assert df == Fraction(1323, 409)  # 3.2347...
    t = (Fraction(5, 2) - 4) / math.sqrt(v_a + v_b)
    found = welch(a, b)
    assert found.df == pytest.approx(float(df), rel=1e-14)
    assert found.t == pytest.approx(float(t), rel=1e-14)
    assert found.p == pytest.approx(reference_two_sided_p(float(t), float(df)), abs=1e-10)
    assert welch(b, a).p == found.p and welch(b, a).t == -found.t


def test_welch_of_constant_samples_and_bad_input() -> None:
    assert welch([2.0, 2.0], [2.0, 2.0]).p == 1.0
    assert welch([2.0, 2.0], [3.0, 3.0]).p == 0.0
    with pytest.raises(StatisticsError, match="at least two values, got 1 and 2"):
        welch([1.0], [1.0, 2.0])
    with pytest.raises(StatisticsError, match="probability must be in"):
        t_quantile(1.0, 3)
    with pytest.raises(StatisticsError, match="degrees of freedom must be > 0"):
        t_cdf(1.0, 0)


# ------------------------------------------------------------------ the race's figures
def run(curve: list[tuple[int, float]], val_loss: float, seconds: float = 10.0) -> TrainResult:
    """A 100-step run with validation points ``curve`` that took ``seconds``."""
    return TrainResult(
        optimizer="x", hyperparameters={"lr": 1e-3}, schedule="", parameters=1, start_step=0,
        steps=100, initial_val_loss=curve[0][1], train_loss=val_loss, val_loss=val_loss,
        baseline=3.0, seconds=seconds, curve=(), val_curve=tuple(curve), sample="", prompt="",
    )  # fmt: skip


def reaching(step: int, val_loss: float) -> TrainResult:
    """A run whose validation points (every 20 steps) first reach 2.0 at ``step``."""
    curve = [(s, 2.5 if s < step else 1.9) for s in range(0, 101, 20)]
    return run(curve, val_loss)


def test_steps_and_seconds_to_target() -> None:
    result = reaching(60, 1.8)
    assert steps_to_target(result, 2.0) == 60
    assert steps_to_target(result, 1.9) == 60  # at or below
    assert steps_to_target(result, 1.0) is None
    assert seconds_to_target(result, 60) == pytest.approx(
        6.0
    )  # no times recorded: 10 s / 100 steps
    timed = attrs.evolve(result, val_seconds=(0.0, 1.0, 2.5, 7.0, 8.0, 9.0))
    assert seconds_to_target(timed, 60) == 7.0  # measured at the point


def test_a_run_records_its_training_time_at_each_validation_point(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from optiplug_train.config import TrainConfig
    from optiplug_train.loop import train

    config = TrainConfig(
        n_layer=1, d_model=32, n_head=2, block_size=32, batch_size=8, max_chars=100_000,
        sample_chars=0, eval_windows=16, impl="loop", threads=1, steps=10, eval_every=5,
    )  # fmt: skip
    result = train(config, optiplug.default_registry(), log=None, quiet=True)
    assert result is not None and len(result.val_seconds) == len(result.val_curve) == 3
    assert result.val_seconds[0] < result.val_seconds[1] < result.val_seconds[2] <= result.seconds


def test_summary_has_intervals_p_values_and_says_what_was_not_reached() -> None:
    runs = {
        "a": [reaching(40, 1.80), reaching(60, 1.84)],
        "b": [reaching(20, 1.70), reaching(40, 1.72)],
        "c": [reaching(20, 1.60), run([(0, 2.5), (100, 2.4)], 2.4)],
    }
    race = summarize(runs, seeds=[0, 1], target=2.0, eval_every=20)
    a, b, c = race.rows
    assert a.steps is not None and a.steps.mean == 50.0
    # half-width: t_{0.975, 1} * s / sqrt(2), s = 10 * sqrt(2)
    assert a.steps.half_width == pytest.approx(12.706 * 10, abs=TABLE_ROUNDING * 10)
    assert a.p_val_loss is None and a.p_steps is None  # the reference
    # steps 40, 60 against 20, 40: t = 20 / sqrt(100 + 100), df = 2 exactly,
    # where the two-sided p is 1 - t / sqrt(2 + t^2) in closed form
    t = 20 / math.sqrt(200)
    assert b.p_steps == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=CDF_TOLERANCE)
    t_loss = (1.82 - 1.71) / math.sqrt(0.0008 / 2 + 0.0002 / 2)
    df_loss = (0.0005**2) / ((0.0004**2) + (0.0001**2))
    assert b.p_val_loss == pytest.approx(reference_two_sided_p(t_loss, df_loss), abs=1e-9)
    assert c.steps is None and c.seconds is None and c.missed == 1 and c.p_steps is None
    assert c.p_val_loss is not None
    table = race_table(race)
    assert re.search(
        r"^a\s+0\.001\s+50\.0 ± 127\.1\s+5 ± 12\.7\s+1\.8200 ± 0\.2541\s+-", table, re.M
    )
    assert re.search(r"^c\s+0\.001\s+not reached \(1 of 2 seeds\)\s+not reached", table, re.M)
    stored = json.loads(json.dumps(race.as_json(), allow_nan=False))  # NaN would not be JSON
    assert stored["rows"][2]["steps_to_target"] == [20, None]
    assert stored["rows"][1]["p_steps"] == pytest.approx(b.p_steps)


# ------------------------------------------------------------------ through the CLI
def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["train", *TINY, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def validation_points(out: str, label: str) -> list[str]:
    """The ``step N/M ... val(16w) L`` figures of the log lines that start with ``label``."""
    pattern = rf"^{re.escape(label)}step +(\d+)/\d+ .*val\(16w\) ([\d.]+)"
    return [f"{step}:{loss}" for step, loss in re.findall(pattern, out, re.MULTILINE)]


def test_a_small_race_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "race.png"
    race = ["--compare", "adamw=0.01,sgd", "--seeds", "2", "--target-loss", "3.3"]
    code, out, _ = run_cli(capsys, *race, "--plot", str(plot))
    assert code == 0 and plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    table = out.split("\noptimizer ", 1)[1]
    # adamw at lr 0.01 crosses 3.3 within 20 steps; sgd at lr 0.001 barely moves
    assert re.search(
        r"^adamw\s+0\.01\s+[\d.]+ ± [\d.]+\s+[\d.]+ ± [\d.]+\s+[\d.]+ ± [\d.]+", table, re.M
    )
    sgd = re.search(r"^sgd\s+0\.001\s+(.*)$", table, re.M).group(1)
    assert sgd.startswith("not reached (2 of 2 seeds)  not reached (2 of 2 seeds)")
    p_value = float(re.search(r"[\d.]+ ± [\d.]+\s+([\d.e-]+)\s", sgd).group(1))
    assert 0 <= p_value < 0.01 and "higher val loss than adamw (p < 0.01)" in sgd
    assert (
        "2 seeds: 0, 1; each figure is the mean ± the half-width" in out
        and "Welch's t-test, two-sided, against adamw" in out
    )
    # seed 1 of the race is the plain run with --seed 1, point for point
    seed1 = validation_points(out, "adamw seed 1: ")
    assert len(seed1) == 5 and seed1 != validation_points(out, "adamw seed 0: ")
    code, alone, _ = run_cli(capsys, "--optimizer", "adamw", "--lr", "0.01", "--seed", "1")
    assert code == 0 and validation_points(alone, "") == seed1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "adamw", "--seeds", "0"], "--seeds 0 must be an integer >= 1"),
        (["--compare", "adamw", "--seeds", "-2"], "--seeds -2 must be an integer >= 1"),
        (["--compare", "adamw", "--target-loss", "nan"], "--target-loss nan must be a finite"),
        (["--compare", "adamw", "--target-loss", "inf"], "--target-loss inf must be a finite"),
        (["--compare", "adamw", "--target-loss", "-1"], "--target-loss -1 must be a finite"),
        (["--seeds", "3"], "--seeds 3 goes with --compare"),
        (["--target-loss", "2.5"], "--target-loss 2.5 goes with --compare"),
        (["--compare", "adamw,lion[betas=(2, 0.5)]"], "betas"),  # a variant's values, checked first
    ],
)
def test_bad_race_options_stop_before_anything_runs(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""  # not even the header: nothing was read or trained
    assert message in err


@pytest.mark.slow
def test_tune_lr_tunes_once_then_races_every_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    race = ["--compare", "adamw,sgd=0.5", "--seeds", "2", "--target-loss", "3.3"]
    tune = ["--tune-lr", "--tune-budget", "40", "--plot", str(tmp_path / "race.svg")]
    code, out, _ = run_cli(capsys, *race, *tune)
    assert code == 0
    assert out.count("tuning the lr of") == 1 and "tuning the lr of adamw (40 steps each)" in out
    tuned = float(re.search(r"^  adamw: lr ([\d.e-]+) ", out, re.MULTILINE).group(1))
    used = re.findall(r"^adamw seed (\d): optimizer: adamw \(lr=([\d.e-]+),", out, re.MULTILINE)
    assert [seed for seed, _ in used] == ["0", "1"]
    for _, lr in used:
        assert float(lr) == pytest.approx(tuned, rel=1e-2)  # printed to 3 digits


# ------------------------------------------------------------------ variants
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("muon[ns_coefficients=polar_express]", [("muon[ns_coefficients=polar_express]", None)]),
        (
            "adamw,normuon[weight_decay_mode=cautious;betas=(0.9, 0.95)]=0.02",
            [("adamw", None), ("normuon[weight_decay_mode=cautious;betas=(0.9, 0.95)]", 0.02)],
        ),
    ],
)
def test_compare_takes_variants(text: str, expected: list[tuple[str, float | None]]) -> None:
    assert parse_compare(text) == expected
    assert split_variant("normuon[weight_decay_mode=cautious;betas=(0.9, 0.95)]") == (
        "normuon",
        (("weight_decay_mode", "cautious"), ("betas", (0.9, 0.95))),
    )
    assert split_variant("muon") == ("muon", ())


@pytest.mark.parametrize("bad", ["muon[x]", "muon[ns=1", "muon[a=1]x", "muon[]", "[a=1]"])
def test_a_malformed_variant_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(OptionError, match=re.escape(repr(bad))):
        parse_compare(bad)


def test_a_variant_trains_with_its_own_hyperparameters(capsys: pytest.CaptureFixture[str]) -> None:
    variant = "lion[betas=(0.5, 0.5)]"
    code, out, _ = run_cli(capsys, "--compare", f"lion,{variant}", "--steps", "5")
    table = out.split("\noptimizer ", 1)[1]
    # both rows, the variant under its label; different betas train differently
    plain = re.search(r"^lion\s+\S+\s+([\d.]+)", table, re.M)
    other = re.search(rf"^{re.escape(variant)}\s+\S+\s+([\d.]+)", table, re.M)
    assert code == 0 and plain and other and plain.group(1) != other.group(1)

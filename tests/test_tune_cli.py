"""``optiplug tune``, ``optiplug train --tune`` and ``--compare --tune-lr`` on a tiny job."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optiplug._auto import tune as tune_module
from optiplug.cli import main
from optiplug_train import command
from optiplug_train.config import TrainConfig
from optiplug_train.options import DEFAULT_TUNE_BUDGET
from optiplug_train.tune import run_length_budget

JOB = [
    "--layers", "1", "--d-model", "32", "--heads", "2", "--block-size", "32",
    "--batch-size", "8", "--max-chars", "100000", "--threads", "1",
]  # fmt: skip
RUN = [*JOB, "--sample-chars", "0", "--eval-windows", "16", "--quiet", "--steps", "12"]


def test_tune_prints_every_trial_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", *JOB, "--candidates", "adamw,lion", "--tune-budget", "60", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert sorted(t["algorithm"] for t in report["trials"]) == ["adamw", "lion"]
    assert report["chosen"] == report["trials"][0]["algorithm"]
    held = [t["held_out_loss"] for t in report["trials"]]
    assert held == sorted(held) and all(0 < h < 10 for h in held)
    assert report["hparams"]["lr"] == report["trials"][0]["lr"]
    assert all(t["steps"] <= 30 for t in report["trials"])


def test_tune_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    image = tmp_path / "tune.png"
    code = main(
        ["tune", *JOB, "--candidates", "adamw", "--tune-budget", "30", "--plot", str(image)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"^adamw\s+[\d.e-]+\s+", out, re.MULTILINE)
    assert "held-out loss" in out and image.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tune", "--candidates", "adamw,adamw"], "distinct"),
        (["tune", "--candidates", "nosuch"], "nosuch"),
        (["tune", "--candidates", "adamw,lion", "--tune-budget", "30"], "budget_steps=30"),
        (["train", "--tune", "--lr", "0.1"], "--tune chooses the lr"),
        (["train", "--tune", "--compare", "adamw,lion"], "--tune-lr"),
        (["train", "--tune-lr"], "--tune-lr goes with --compare"),
        (["train", "--tune", "--tune-budget", "0"], "--tune-budget 0"),
    ],
)
def test_bad_tune_options_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main([*args, *JOB]) == 2
    assert message in capsys.readouterr().err


def test_tune_checks_the_plot_path_before_tuning(capsys: pytest.CaptureFixture[str]) -> None:
    plot = "/nonexistent/dir/x.png"
    argv = ["tune", *JOB, "--candidates", "adamw", "--tune-budget", "30", "--plot", plot]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was tuned
    assert captured.err == (
        f"optiplug: error: --plot {plot!r}: the directory '/nonexistent/dir' does not exist; "
        "create it first\n"
    )


@given(st.integers(min_value=1, max_value=10**6))
def test_a_tuned_lr_gets_short_runs_as_long_as_the_run(steps: int) -> None:
    budget = run_length_budget(steps)
    plan = tune_module.plan_tune(list(range(8)), 2, 1, budget, 0)
    if budget > DEFAULT_TUNE_BUDGET:
        assert plan.run_steps == steps  # exactly the run's length, no more
    else:
        assert budget == DEFAULT_TUNE_BUDGET and plan.run_steps >= steps
    assert plan.range_steps + 3 * plan.run_steps <= budget


@pytest.mark.parametrize(
    ("budget_option", "optimizer", "steps", "expected"),
    [
        (None, "lion", 500, 2500),
        (None, "auto", 500, 1500),
        (None, "adamw", 100, 1500),
        (40, "auto", 500, 40),
    ],
)
def test_tune_budget_defaults_to_the_run_length_for_one_lr(
    budget_option: int | None, optimizer: str, steps: int, expected: int
) -> None:
    args = argparse.Namespace(tune_budget=budget_option)
    config = TrainConfig(optimizer=optimizer, steps=steps)
    assert command._tune_budget(args, config, auto=optimizer == "auto") == expected


def test_train_tune_runs_the_measured_choice(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", *RUN, "--optimizer", "lion", "--tune", "--tune-budget", "40"])
    out = capsys.readouterr().out
    assert code == 0
    tuned = float(re.search(r"^chosen: lion \(lr=([\d.e-]+),", out, re.MULTILINE).group(1))
    used = float(re.search(r"^optimizer: lion \(lr=([\d.e-]+),", out, re.MULTILINE).group(1))
    assert used == pytest.approx(tuned, rel=1e-5)  # the header prints 6 significant digits
    assert used != 1e-4  # not lion's default
    assert "validation" in out


def test_compare_tune_lr_uses_each_tuned_lr(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", *RUN, "--compare", "adamw,lion=3e-4", "--tune-lr", "--tune-budget", "40"])
    out = capsys.readouterr().out
    assert code == 0
    tuned = float(re.search(r"adamw: lr ([\d.e-]+)", out).group(1))
    rows = dict(re.findall(r"^(adamw|lion)\s+([\d.e-]+)\s", out, re.MULTILINE))
    assert float(rows["adamw"]) == pytest.approx(tuned, rel=1e-2)
    assert float(rows["lion"]) == 3e-4  # given as NAME=LR: kept, not tuned
    assert "lion: lr" not in out


def test_a_tuned_run_saves_its_hyperparameters_and_resumes_with_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "run"
    first = [*RUN, "--optimizer", "adamw", "--tune", "--tune-budget", "40", "--stop-at", "6"]
    assert main(["train", *first, "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    header = re.search(r"^optimizer: adamw \((.*)\)$", out, re.MULTILINE).group(1)
    assert "betas=(0.9, 0.95)" in header and "weight_decay=0.1" in header  # the recipe's
    options = json.loads((saved / "train.json").read_text())["options"]
    assert dict(options["optimizer_params"])["weight_decay"] == 0.1
    assert main(["train", "--resume", str(saved), "--quiet", "--sample-chars", "0"]) == 0
    resumed = capsys.readouterr().out
    assert re.search(r"^optimizer: adamw \((.*)\)$", resumed, re.MULTILINE).group(1) == header

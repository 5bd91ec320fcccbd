"""optiplug leaderboard: resumable runs, the board's statistics, explain()'s citations, the page."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

import optiplug
import optiplug_train
from optiplug._auto.evidence import MOST_USED, load_evidence
from optiplug_train.board.board import published_records
from optiplug_train.board.results import ResultsFile, key_of, read_records
from optiplug_train.board.summary import rows_of
from optiplug_train.board.targets import load_tuned_lrs
from optiplug_train.board.workloads import WORKLOADS
from optiplug_train.stats import mean_interval, welch

pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("seconds", "seconds_to_target", "curve_seconds")


def _runs(path: Path) -> list[dict[str, object]]:
    """The run records of ``path``, timing fields dropped, in key order."""
    runs = [
        {k: v for k, v in r.items() if k not in TIMING}
        for r in read_records(path)
        if r["kind"] == "run"
    ]
    return sorted(runs, key=lambda r: json.dumps(r, sort_keys=True))


def test_smoke_two_optimizers_one_workload(tmp_path: Path) -> None:
    results = tmp_path / "board.jsonl"
    board = optiplug_train.leaderboard(
        only=["adamw", "sgd"], workloads=["logistic"], steps=5, lrs=2, results=results, stream=None
    )
    records = read_records(results)
    header, runs = records[0], [r for r in records if r["kind"] == "run"]
    assert header["kind"] == "header" and header["seeds"] == [0] and header["versions"]["torch"]
    tuned = load_tuned_lrs()["logistic"]  # the baseline also runs at its tuned lr
    assert sorted((r["optimizer"], r["lr"]) for r in runs) == [
        ("adamw", 1e-4), ("adamw", 1e-3), ("adamw", tuned), ("sgd", 1e-4), ("sgd", 1e-3),
    ]  # fmt: skip
    starts = [r for r in records if r["kind"] == "start"]
    assert [key_of(r) for r in starts] == [key_of(r) for r in runs]  # a marker before each run
    assert all(r["budget"] == 5 and [s for s, _ in r["curve"]] == [0, 5] for r in runs)
    assert {row.optimizer for row in board.workload("logistic")} == {"adamw", "sgd"}
    again = optiplug_train.leaderboard(
        only=["adamw", "sgd"], workloads=["logistic"], steps=5, lrs=2, results=results, stream=None
    )
    assert len([r for r in again.records if r["kind"] == "run"]) == 5  # all skipped: resumed


def test_bad_input_is_typed_and_named(tmp_path: Path) -> None:
    with pytest.raises(optiplug.errors.HyperparameterError, match="tier"):
        optiplug_train.leaderboard(tier="fast", results=tmp_path / "x.jsonl", stream=None)
    with pytest.raises(optiplug.errors.HyperparameterError, match="workload"):
        optiplug_train.leaderboard(only=["sgd"], workloads=["mnist"], results=tmp_path / "x.jsonl")
    with pytest.raises(optiplug.errors.UnknownOptimizerError):
        optiplug_train.leaderboard(
            only=["no-such"], workloads=["logistic"], results=tmp_path / "x.jsonl"
        )
    assert not (tmp_path / "x.jsonl").exists() or not read_records(tmp_path / "x.jsonl")


def test_torn_last_line_is_ignored_and_redone(tmp_path: Path) -> None:
    results = tmp_path / "board.jsonl"
    kwargs = {"only": ["sgd"], "workloads": ["logistic"], "steps": 5, "lrs": 2, "stream": None}
    optiplug_train.leaderboard(results=results, **kwargs)
    whole = _runs(results)
    data = results.read_bytes()
    results.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1] + data[-40:-1])  # torn
    assert len(_runs(results)) == 1
    optiplug_train.leaderboard(results=results, **kwargs)
    assert _runs(results) == whole
    assert results.read_bytes().endswith(b"\n")


def _died_twice(results: Path, key: dict[str, object]) -> None:
    """A results file where ``key``'s run started twice and its process died both times."""
    out = ResultsFile(results)
    out.extend([{"kind": "start", **key}, {"kind": "start", **key}])
    out.close()


def test_a_run_that_killed_its_process_twice_is_recorded_failed(tmp_path: Path) -> None:
    results = tmp_path / "board.jsonl"
    key = {"optimizer": "sgd", "workload": "logistic", "lr": 1e-4, "seed": 0}
    _died_twice(results, key)
    kwargs = {"only": ["sgd"], "workloads": ["logistic"], "steps": 5, "lrs": 2, "stream": None}
    optiplug_train.leaderboard(results=results, **kwargs)
    runs = {r["lr"]: r for r in read_records(results) if r["kind"] == "run"}
    assert (
        runs[1e-4]["status"] == "failed"
        and "ended during this run 2 times" in (runs[1e-4]["reason"])
    )
    assert runs[1e-4]["curve"] == [] and runs[1e-3]["status"] != "failed"  # the other one ran


def test_one_death_or_an_interrupt_is_retried(tmp_path: Path) -> None:
    results = tmp_path / "board.jsonl"
    key = {"optimizer": "sgd", "workload": "logistic", "lr": 1e-4, "seed": 0}
    out = ResultsFile(results)
    marks = ["start", "start", "interrupted"]  # died once, then stopped by Ctrl-C
    out.extend({"kind": kind, **key} for kind in marks)
    out.close()
    kwargs = {"only": ["sgd"], "workloads": ["logistic"], "steps": 5, "lrs": 1, "stream": None}
    optiplug_train.leaderboard(results=results, **kwargs)
    (run,) = [r for r in read_records(results) if r["kind"] == "run"]
    assert run["status"] != "failed" and run["curve"], run["reason"]


@pytest.mark.slow
def test_parallel_jobs_give_the_serial_records(tmp_path: Path) -> None:
    serial, parallel = tmp_path / "serial.jsonl", tmp_path / "parallel.jsonl"
    kwargs = {"only": ["adamw", "sgd"], "workloads": ["logistic"], "steps": 20, "lrs": 2}
    optiplug_train.leaderboard(results=serial, stream=None, **kwargs)
    optiplug_train.leaderboard(results=parallel, stream=None, jobs=2, **kwargs)
    assert _runs(parallel) == _runs(serial)  # spawned workers: the same deterministic runs
    header = next(r for r in read_records(parallel) if r["kind"] == "header")
    assert header["jobs"] == 2


def _command(results: Path) -> list[str]:
    return [
        sys.executable, "-m", "optiplug", "leaderboard", "--only", "adamw,sgd",
        "--workloads", "logistic,digits", "--lrs", "3", "--quiet", "--results", str(results),
    ]  # fmt: skip


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_file(tmp_path: Path) -> None:
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    subprocess.run(_command(whole), check=True, capture_output=True, timeout=600)
    process = subprocess.Popen(_command(resumed), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(_runs(resumed)) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    cut = _runs(resumed)
    assert 2 <= len(cut) < len(_runs(whole)), "the kill came after the last record"
    subprocess.run(_command(resumed), check=True, capture_output=True, timeout=600)
    assert _runs(resumed) == _runs(whole)  # bit for bit: deterministic one-thread CPU runs


def _record(optimizer: str, seed: int, steps: int | None, final: float) -> dict[str, object]:
    return {
        "kind": "run", "optimizer": optimizer, "workload": "char-lm", "lr": 1e-3, "seed": seed,
        "status": "reached" if steps is not None else "not reached", "reason": "",
        "final_metric": final, "steps_to_target": steps, "seconds_to_target": steps,
        "target": 2.0, "budget": 150, "curve": [], "curve_seconds": [], "seconds": 1.0,
    }  # fmt: skip


def _small_results(path: Path) -> Path:
    results = ResultsFile(path)
    results.extend(_record("adamw", s, n, 1.9) for s, n in enumerate((100, 110, 120)))
    results.extend(_record("lion", s, n, 1.8) for s, n in enumerate((80, 90, 100)))
    results.close()
    return path


def test_rows_use_the_race_statistics(tmp_path: Path) -> None:
    rows = {row.optimizer: row for row in rows_of(read_records(_small_results(tmp_path / "r")))}
    lion = rows["lion"]
    assert lion.steps is not None and (lion.steps.mean, lion.steps.half_width) == mean_interval(
        [80.0, 90.0, 100.0]
    )
    # Welch by hand: t = (90 - 110) / sqrt(100/3 + 100/3) = -2.449, df = 4 (equal variances
    # and sizes), two-sided p = 0.0705 from Student's t table (df 4: t 2.132 is 0.10, 2.776 is 0.05)
    assert lion.p == welch([80, 90, 100], [100, 110, 120]).p
    assert 0.05 < lion.p < 0.10 and math.isclose(lion.p, 0.0705, abs_tol=5e-4)
    assert lion.steps_ratio == 90 / 110 and lion.p_on == "steps"


def test_explain_cites_a_measurement_and_keeps_sources(tmp_path: Path) -> None:
    evidence = optiplug_train.board_evidence(_small_results(tmp_path / "r.jsonl"))
    text = optiplug.AutoOptimizer.explain(
        "text-generation", num_parameters=10**6, stage="pretraining", evidence=evidence
    )
    assert "nearest workload char-lm" in text
    assert "lion: 0.82x adamw's steps to target on char-lm, p = 0.07 (steps), 3 seeds" in text
    assert "adamw: the board's baseline on char-lm: reached, 3 seeds" in text
    assert "muon: not measured on char-lm; the rule's source: causal-LM pretraining" in text
    comparison = text.split("for comparison, the most-used algorithms on char-lm:\n")[1]
    assert comparison.splitlines()[0] == "adam: not measured on char-lm"  # not a candidate
    assert "adamw:" not in comparison and "lion:" not in comparison  # already cited above


@pytest.mark.parametrize(
    ("task", "workload"),
    [
        ("text-generation", "char-lm"),
        ("image-classification", "digits"),
        ("tabular-regression", "diabetes"),
        ("tabular-classification", "logistic"),
    ],
)
def test_explain_cites_the_published_board_for_the_most_used(task: str, workload: str) -> None:
    published = {(m.optimizer, m.workload): m for m in load_evidence()}
    text = optiplug.AutoOptimizer.explain(task, num_parameters=10**6)
    assert f"nearest workload {workload}" in text
    for name in MOST_USED:
        measured = published[(name, workload)]  # every one of them is on the committed board
        assert measured.citation() in text


def test_every_installed_entry_has_a_row_on_every_workload_of_the_published_board() -> None:
    rows = rows_of(published_records())
    placed = {(row.optimizer, row.workload) for row in rows}
    registry = optiplug.default_registry()
    missing = [
        (name, workload)
        for name in registry.optimizers()
        for workload in WORKLOADS
        if (name, workload) not in placed
    ]
    assert not missing, f"{len(missing)} rows missing from the published board: {missing[:8]}"
    failed = [row for row in rows if row.status == "failed"]
    assert all(row.reason for row in failed), [row.optimizer for row in failed if not row.reason]
    installed = set(registry.optimizers())
    stale = sorted({row.optimizer for row in rows} - installed)
    assert not stale, f"published rows under names the catalogue no longer has: {stale}"


def test_the_ranked_tier_covers_twenty_entries_with_five_seeds() -> None:
    rows = rows_of(published_records())
    seeded = {row.optimizer for row in rows if len(row.seeds) >= 5}
    assert len(seeded) >= 20, sorted(seeded)  # the top 20 (the baseline among them)
    assert set(MOST_USED) <= seeded, sorted(set(MOST_USED) - seeded)
    for row in rows:
        if row.optimizer in seeded and row.steps is not None and row.steps.n >= 2:
            assert math.isfinite(row.steps.half_width)  # an interval, not a single run


def test_the_page_matches_the_results_file() -> None:
    page = (ROOT / "docs" / "leaderboard.md").read_text(encoding="utf-8")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import leaderboard_page
    finally:
        sys.path.pop(0)
    records = read_records(leaderboard_page.RESULTS)
    for row in rows_of(records):
        assert leaderboard_page.row_line(row) in page, row
    assert f"{sum(r['kind'] == 'run' for r in records):,} runs" in page


def _sleepy_registry(sleeps: dict[int, float]) -> optiplug.Registry:
    """A registry whose only optimizer, ``sleepy``, is SGD sleeping ``sleeps[n]`` at step n."""
    import types

    import torch

    class Sleepy(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:
            self.count = getattr(self, "count", 0) + 1
            time.sleep(sleeps.get(self.count, 0.0))
            return super().step(closure)

    module = types.ModuleType("sleepy_plugin")
    spec = optiplug.OptimizerSpec("sleepy", Sleepy, defaults={"lr": 0.1})
    module.optiplug_optimizers = optiplug.hookimpl(lambda: [spec])  # type: ignore[attr-defined]
    registry = optiplug.Registry(autoload=False, strict=False)
    registry.register(module, "sleepy", distribution="optiplug-sleepy", version="1.0")
    return registry


@pytest.mark.parametrize(
    ("sleeps", "stopped_at"),
    [
        ({1: 0.3, 2: 0.3}, None),  # a slow warm-up (a compilation) is not held against the run
        ({3: 0.3}, 3),  # a slow step after it is
    ],
)
def test_the_time_cap_leaves_the_warm_up_steps_out(
    monkeypatch: pytest.MonkeyPatch, sleeps: dict[int, float], stopped_at: int | None
) -> None:
    from optiplug_train.board import runner
    from optiplug_train.board.workloads import workload

    monkeypatch.setattr(runner, "MAX_SECONDS", 0.2)
    spec = attrs.evolve(workload("logistic"), steps=6, eval_every=3)
    key = runner.RunKey("sleepy", "logistic", 0.1, 0)
    record = runner.run_one(key, spec, None, _sleepy_registry(sleeps))
    if stopped_at is None:
        assert record["reason"] == "" and record["curve"][-1][0] == 6
        assert record["curve_seconds"][-1] > 0.6  # the time still counts the warm-up
    else:
        assert record["reason"].startswith(f"stopped at step {stopped_at}: over 0.2 s")

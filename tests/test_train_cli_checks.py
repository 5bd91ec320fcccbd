"""``optiplug train`` refuses bad options before it reads the corpus, and says what it trains.

Every check here runs with the corpus loader replaced by one that fails the
test: an option refused only after the corpus was read (or, worse, after
training) shows up as that failure instead of a one-line error.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

import optiplug
from optiplug.cli import main
from optiplug_train import command, cpus
from optiplug_train.config import TrainConfig, run_file_payload
from optiplug_train.cpus import CpuBudget, cgroup_cpu_quota, choose_threads, cpu_budget
from optiplug_train.report import Progress

TINY = [
    "--layers", "1", "--d-model", "32", "--heads", "2", "--block-size", "32",
    "--batch-size", "8", "--max-chars", "100000", "--sample-chars", "40",
    "--eval-windows", "16", "--impl", "loop", "--quiet",
]  # fmt: skip


@pytest.fixture
def no_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command reads the corpus."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the corpus was read before the options were checked")

    monkeypatch.setattr(command, "load_corpus", refuse)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``optiplug train ARGS``; assert exit 2 with one error line and no output; the line."""
    code = main(["train", *TINY, *args])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert captured.out == ""
    assert len(lines) == 1 and lines[0].startswith("optiplug: error: "), captured.err
    return lines[0]


# ------------------------------------------------------------------ output paths
@pytest.mark.usefixtures("no_corpus")
def test_save_under_a_file_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gpt2.json").write_text("{}")
    target = tmp_path / "gpt2.json" / "run"
    line = refused(capsys, "--save", str(target))
    assert f"--save '{target}'" in line and "is a file, not a directory" in line
    line = refused(capsys, "--save", str(tmp_path / "gpt2.json"))
    assert "is a file, not a directory" in line
    assert not target.exists()


@pytest.mark.usefixtures("no_corpus")
def test_save_where_nothing_can_be_written_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode)
    )  # what a read-only directory looks like, even to root
    line = refused(capsys, "--save", str(locked / "deep" / "run"))
    assert f"'{locked}', where it would be created" in line and "is not writable" in line
    assert not (locked / "deep").exists()


@pytest.mark.usefixtures("no_corpus")
@pytest.mark.parametrize(
    ("plot", "message"),
    [
        ("missing/dir/cmp.png", "the directory '{tmp}/missing/dir' does not exist"),
        ("cmp.foo", "unsupported image format '.foo'; name the file with one of: "),
        ("cmp", "no file extension"),
        (".", "is a directory"),
        ("file.txt/cmp.png", "'{tmp}/file.txt' is a file, not a directory"),
    ],
)
def test_compare_plot_path_is_checked_before_training(
    plot: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "file.txt").write_text("x")
    line = refused(capsys, "--compare", "adamw,sgd", "--plot", str(tmp_path / plot))
    assert message.format(tmp=tmp_path) in line
    if "unsupported" in message:
        assert ".png" in line and ".pdf" in line and ".svg" in line


# ------------------------------------------------------------------ values
@pytest.mark.usefixtures("no_corpus")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "--temperature -1 must be a finite number >= 0"),
        (["--temperature", "nan"], "--temperature nan must be a finite number >= 0"),
        (["--impl", "bogus"], "--impl bogus is not an implementation of adamw; available here: "),
        (
            ["--compare", "adamw,muon"],
            "--impl loop is not an implementation of muon, which has only one: drop --impl",
        ),
        (["--compare", "adamw,sgd=-1"], "--compare sgd=-1: lr must be positive, got -1.0"),
        (["--compare", "adamw,sgd", "--schedule", "step"], "missing required parameter"),
        (["--save-every", "2"], "--save-every needs --save DIR"),
        (["--data", "no/such/corpus"], "--data 'no/such/corpus': no such file or directory"),
    ],
)
def test_values_that_would_fail_late_are_refused_first(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused(capsys, *args)


@pytest.mark.usefixtures("no_corpus")
def test_compare_checks_every_name_before_training(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "--compare", "adamw,lino")
    assert "--compare adamw,lino: unknown optimizer 'lino' (did you mean 'lion'?); " in line
    assert "installed: " in line and "lion" in line
    line = refused(capsys, "--compare", "lino,adamw,zzz")
    assert "unknown optimizers 'lino' (did you mean 'lion'?), 'zzz'; installed: " in line


@pytest.mark.usefixtures("no_corpus")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heads", "3"], "--heads 3 must divide --d-model 32"),
        (["--nproc", "3"], "--batch-size 8 must be divisible by --nproc 3"),
        (["--layers", "0"], "--layers 0 must be an integer >= 1"),
        (["--warmup", "-1"], "--warmup -1 must be an integer >= 0"),
        (["--max-chars", "0"], "--max-chars 0 must be an integer >= 1"),
        (["--lr", "-0.5"], "--lr -0.5 must be a number > 0"),
        (["--compare", "adamw=-1,lion"], "--compare adamw=-1: lr must be positive, got -1.0"),
        (["--compare", "adamw,lion=inf"], "--compare lion=inf: lr must be finite, got inf"),
    ],
)
def test_messages_name_the_options_as_typed(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(capsys, *args)
    assert message in line
    assert not any(name in line for name in ("n_head", "n_layer", "d_model", "invalid lr="))


RESUME_CONFLICTS = [
    (
        ["--lr", "0.01"],
        "--lr 0.01 cannot change on resume: the run was saved with the optimizer's default lr",
    ),
    (["--layers", "2"], "--layers 2 cannot change on resume: the run was saved with --layers 1"),
    (["--clip", "1"], "--clip 1 cannot change on resume: the run was saved without --clip"),
    (
        ["--schedule-param", "min_ratio=0.1"],
        "--schedule-param min_ratio=0.1 cannot change on resume: the run was saved without "
        "--schedule-param",
    ),
    (["--data", "my corpus"], "--data 'my corpus' cannot change on resume: the run was saved "
                              "without --data"),
]  # fmt: skip


@pytest.mark.usefixtures("no_corpus")
@pytest.mark.parametrize(("args", "message"), RESUME_CONFLICTS)
def test_resume_conflicts_name_the_options_as_typed(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = TrainConfig(
        n_layer=1, d_model=32, n_head=2, block_size=32, batch_size=8, max_chars=100_000, impl="loop"
    )
    (tmp_path / "train.json").write_text(json.dumps(run_file_payload(saved, "abc", 4)))
    line = refused(capsys, "--resume", str(tmp_path), *args)
    assert line == f"optiplug: error: {message}"


@pytest.mark.usefixtures("no_corpus")
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_save_where_a_directory_cannot_be_created_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/proc says it is writable (to root), yet nothing can be created in it."""
    line = refused(capsys, "--save", "/proc/optiplug-run")
    assert "--save '/proc/optiplug-run': cannot create a directory in '/proc'" in line


@pytest.fixture
def triton_unavailable(monkeypatch: pytest.MonkeyPatch) -> str:
    """Why the ``triton`` implementation cannot run here (skips where it can)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    impl = next(
        i for i in optiplug.default_registry().implementations("adamw") if i.name == "triton"
    )
    reason = impl.unavailable_reason()
    if reason is None:
        pytest.skip("triton can run on this machine")
    return reason


@pytest.mark.usefixtures("no_corpus")
def test_impl_suggestions_are_implementations_available_here(
    capsys: pytest.CaptureFixture[str], triton_unavailable: str
) -> None:
    line = refused(capsys, "--impl", "fuzed")
    assert "--impl fuzed is not an implementation of adamw; did you mean 'fused'? " in line
    assert (
        f"Available here: foreach, fused, loop; unavailable here: triton ({triton_unavailable})"
        in line
    )
    line = refused(capsys, "--impl", "tritn")
    assert "did you mean" not in line and f"triton ({triton_unavailable})" in line
    line = refused(capsys, "--impl", "triton")
    assert (
        line
        == f"optiplug: error: --impl triton is unavailable here for adamw: {triton_unavailable}"
    )


# ------------------------------------------------------------------ threads
def test_cgroup_quota_v2_and_v1(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(v2) is None
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(v2) == 2  # 1.5 CPUs: rounded up
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_cpu_quota(v1) == 3
    assert cgroup_cpu_quota(tmp_path / "none") is None


def test_default_threads_never_exceed_the_cpus_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3}, raising=False)
    (tmp_path / "cpu.max").write_text("200000 100000")
    budget = cpu_budget(tmp_path)
    assert (budget.affinity, budget.quota, budget.count) == (4, 2, 2)
    choice = choose_threads(None, budget=budget)
    assert choice.threads == 2
    assert choice.why == "CPUs available to this process: 4; cgroup quota: 2 CPU(s)"
    assert choose_threads(None, 2, budget=budget).threads == 1
    assert choose_threads(None, 8, budget=budget).threads == 1
    assert choose_threads(3, budget=budget).describe() == "3 (--threads)"
    no_quota = choose_threads(None, budget=CpuBudget(affinity=2))
    assert no_quota.describe() == "2 (CPUs available to this process: 2; cgroup quota: none)"


# ------------------------------------------------------------------ the header, and check RUN_DIR
def test_header_says_what_is_trained_before_the_first_step_and_check_finds_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run"
    code = main(["train", *TINY, "--steps", "2", "--save", str(saved), "--sample-chars", "0"])
    out = capsys.readouterr().out
    assert code == 0
    before = out.split("step 0/2", 1)[0]  # all of this is printed before training starts
    expected = choose_threads(None).describe()
    assert f"device: cpu; threads: {expected}\n" in before
    assert "(CPUs available to this process: " in before and "; cgroup quota: " in before
    assert re.search(
        r"^optimizer: adamw \(lr=0\.001, betas=\(0\.9, 0\.999\), eps=1e-08, .*weight_decay=0\.01, weight_decay_mode='decoupled'\); "
        r"implementation loop \(--impl\)$",
        before,
        re.MULTILINE,
    )
    assert "schedule:  optiplug.schedule('cosine', total_steps=2" in before
    assert "training:  19,967 parameters, steps 0 to 2" in before
    # the progress lines and the table say which validation loss is which
    assert re.search(r"^step 2/2 .* val\(16w\) [\d.]+", out, re.MULTILINE)
    assert re.search(r"^validation\s+[\d.]+\s+all [\d,]+ windows; step 0: [\d.]+ \(16 windows\)$",
                     out, re.MULTILINE)  # fmt: skip

    assert main(["check", str(saved)]) == 0
    checked = capsys.readouterr().out
    assert checked.startswith(
        f"{saved}: a run directory (`optiplug train --save`); checking {saved / 'checkpoint'}\n"
        f"{saved / 'checkpoint'}: OK\n"
    )


def test_check_a_run_directory_without_its_checkpoint_names_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.json").write_text(json.dumps({"format": 1}))
    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"checking {tmp_path / 'checkpoint'}" in out
    assert out.splitlines()[1].startswith(f"{tmp_path / 'checkpoint'}: INVALID checkpoint: ")


# ------------------------------------------------------------------ the progress line
class Terminal(io.StringIO):
    """A stream that says it is a terminal (and has no real size)."""

    def isatty(self) -> bool:
        return True


def emulate(written: str) -> list[str]:
    """The lines a terminal shows for ``written`` (``\\r`` returns, ``\\n`` ends a line)."""
    lines: list[str] = []
    current: list[str] = []
    column = 0
    for char in written:
        if char == "\r":
            column = 0
        elif char == "\n":
            lines.append("".join(current))
            current, column = [], 0
        else:
            current[column : column + 1] = [char]
            column += 1
    return [*lines, "".join(current)] if current else lines


def test_progress_redraws_leave_no_stale_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(second) for second in range(1000))
    monkeypatch.setattr("optiplug_train.report.time.perf_counter", lambda: next(clock))
    terminal = Terminal()
    bar = Progress(100, stream=terminal, log=None, val_label="val(256w)")
    bar.update(1, 12.345678, 1e-3, grad_norm=123456.0)  # long: gnorm and eta 3m18s
    bar.update(50, 2.5, 1e-3)  # shorter: no gnorm
    bar.evaluated(50, 2.4)
    bar.update(99, 2.1, 1e-5)  # eta 0s
    bar.close()
    written = terminal.getvalue()
    segments = written.split("\r")[1:]
    visible = 0
    for segment in segments:
        text = segment.rstrip("\n")
        assert len(text) >= visible, (text, visible)  # covers everything left on screen
        visible = len(text.rstrip())
    assert written.endswith("\n") and written.count("\n") == 1
    final = segments[-1].rstrip("\n").rstrip()
    assert "eta" not in final and re.search(r"  in \d+(m\d\ds|s)$", final)
    shown = emulate(written)
    assert len(shown) == 1
    assert shown[0].rstrip() == final  # nothing of a longer, earlier line is left
    assert "val(256w) 2.400" in final and "gnorm" not in final

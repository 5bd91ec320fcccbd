"""``optiplug train``: a small character LM trained through optiplug.Graph, end to end.

Every run here is tiny (one layer, width 32, 100,000 characters) so the file
stays quick on a busy two-core machine; the default run's figures are in
docs/train.md.
"""

from __future__ import annotations

import io
import json
import math
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import optiplug
from optiplug import Graph
from optiplug.cli import main
from optiplug_train.config import TrainConfig
from optiplug_train.data import load_corpus
from optiplug_train.loop import build_graph
from optiplug_train.report import Progress

TINY = [
    "--layers", "1", "--d-model", "32", "--heads", "2", "--block-size", "32",
    "--batch-size", "8", "--max-chars", "100000", "--sample-chars", "40",
    "--eval-windows", "16", "--impl", "loop", "--threads", "1", "--quiet",
]  # fmt: skip


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["train", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def losses(out: str) -> dict[str, float]:
    """The loss table's figures: train, validation, its value at the start, baseline."""
    found = {
        name: float(re.search(rf"^{name}\s+([\d.]+)", out, re.MULTILINE).group(1))
        for name in ("train", "validation", "unigram baseline")
    }
    found["initial"] = float(re.search(r"step \d+: ([\d.]+)", out).group(1))
    return found


def restored(directory: Path) -> Graph:
    """A Graph of the TINY run, loaded from ``directory``'s checkpoint."""
    config = TrainConfig(n_layer=1, d_model=32, n_head=2, block_size=32, batch_size=8, impl="loop")
    graph, _ = build_graph(config, load_corpus(None, 100_000), optiplug.default_registry())
    graph.load(directory / "checkpoint")
    return graph


def tensors(graph: Graph) -> list[torch.Tensor]:
    """The model's tensors and every tensor of the optimizer's state, in order."""
    state = graph.optimizer.state_dict()["state"]
    slots = [v for i in sorted(state) for _, v in sorted(state[i].items()) if torch.is_tensor(v)]
    return [*graph.module.state_dict().values(), *slots]


def entropy(text: str) -> float:
    counts = Counter(text)
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


def test_short_run_reports_losses_baseline_and_sample(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, *TINY, "--steps", "30")
    assert code == 0
    assert "standard library" in out and "vocabulary" in out
    figures = losses(out)
    assert figures["validation"] < figures["initial"] - 0.3  # it learned
    assert 2.5 < figures["unigram baseline"] < 4.0  # Python source: ~3.2 nats/char
    assert re.search(r"^step 30/30 .*loss [\d.]+  val\(16w\) [\d.]+  lr", out, re.MULTILINE)
    sample = out.split("seed 0):\n", 1)[1]
    assert sample.startswith("def ") and len(sample.rstrip("\n")) >= 40


def test_data_file_baseline_is_the_training_split_entropy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [f"line {i}: the value of x{i % 7} is {i * i % 97}\n" for i in range(900)]
    text = "".join(lines)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    code, out, _ = run_cli(capsys, *TINY, "--steps", "20", "--data", str(corpus), "--prompt", "li")
    assert code == 0
    assert f"corpus: {corpus}: 1 files, {len(text):,} characters" in out
    split = int(len(text) * 0.9)
    assert f"train {split:,} / validation {len(text) - split:,}" in out
    assert losses(out)["unigram baseline"] == pytest.approx(entropy(text[:split]), abs=1e-4)
    assert "\nli" in out  # the sample starts from the prompt


def test_compare_trains_each_installed_optimizer_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "curves.png"
    args = ["--compare", "adamw,sgd=0.5", "--plot", str(plot), "--steps", "12"]
    code, out, _ = run_cli(capsys, *TINY, *args)
    assert code == 0
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert f"wrote {plot}" in out
    table = out.split("optimizer  lr", 1)[1]
    assert re.search(r"^adamw\s+0\.001\s+[\d.]+\s+[\d.]+\s+[\d.]+$", table, re.MULTILINE)
    assert re.search(r"^sgd\s+0\.5\s+[\d.]+\s+[\d.]+\s+[\d.]+$", table, re.MULTILINE)
    assert "unigram baseline: " in out


def test_compare_without_matplotlib_still_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what a missing package looks like
    plot = tmp_path / "curves.png"
    code, out, err = run_cli(
        capsys, *TINY, "--compare", "adamw", "--plot", str(plot), "--steps", "3"
    )
    assert code == 0 and not plot.exists()
    assert re.search(r"^adamw\s+0\.001\s+[\d.]+\s+[\d.]+", out, re.MULTILINE)
    assert "matplotlib is not installed, so no plot was written" in err
    assert "pip install 'optiplug[plot]'" in err


def test_compare_with_nothing_installed_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *TINY, "--compare", "nosuchthing,zzzzqqq")
    assert code == 2 and out == ""
    assert (
        "--compare nosuchthing,zzzzqqq: unknown optimizers 'nosuchthing', 'zzzzqqq'; installed: "
        in err
    )


def test_unknown_optimizer_exits_2_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--optimizer", "adamx")
    assert code == 2 and out == ""
    assert "optiplug: error: unknown optimizer 'adamx'. Did you mean 'adam" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heads", "3"], "--heads 3 must divide --d-model 32"),
        (["--steps", "0"], "--steps 0 must be an integer >= 1"),
        (["--nproc", "3"], "--batch-size 8 must be divisible by --nproc 3"),
        (["--schedule", "cosin"], "unknown schedule 'cosin'. Did you mean 'cosine'?"),
        (["--max-chars", "200"], "the corpus is too small"),
        (["--prompt", "\u20ac"], "invalid prompt='\u20ac': characters not in the corpus"),
        (["--device", "warp-drive"], "--device 'warp-drive' cannot be used here"),
        (["--compare", "adamw", "--save", "x"], "--compare runs in one process"),
        (["--temperature", "-0.5"], "--temperature -0.5 must be a finite number >= 0"),
        (["--impl", "nosuch"], "--impl nosuch is not an implementation of adamw"),
    ],
)
def test_bad_options_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, *TINY, *args)
    assert code == 2
    assert message in err


def test_resume_continues_to_the_requested_step_bit_identically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run"
    code, out, _ = run_cli(capsys, *TINY, "--steps", "24", "--stop-at", "16", "--save", str(saved))
    assert code == 0 and "to step 16 in" in out and f"saved to {saved}" in out
    assert {p.name for p in saved.iterdir()} == {"checkpoint", "train.json"}
    resume = ["--resume", str(saved), "--quiet", "--sample-chars", "40"]
    code, resumed, _ = run_cli(capsys, *resume)  # --threads 1 came from train.json too
    assert f"saved to {saved}" in resumed  # and it saves where it resumed from
    assert code == 0
    assert "to step 24 (resumed at step 16)" in resumed
    assert "1-layer character transformer, d_model 32" in resumed  # options came from train.json
    straight_dir = tmp_path / "straight"
    code, straight, _ = run_cli(capsys, *TINY, "--steps", "24", "--save", str(straight_dir))
    assert code == 0
    final = {k: v for k, v in losses(straight).items() if k != "initial"}
    assert {k: v for k, v in losses(resumed).items() if k != "initial"} == final
    assert resumed.split("seed 0):\n")[1] == straight.split("seed 0):\n")[1]
    graphs = [restored(directory) for directory in (saved, straight_dir)]
    assert all(graph.training_step == 24 for graph in graphs)
    for one, other in zip(*(tensors(graph) for graph in graphs), strict=True):
        assert torch.equal(one, other)  # bit-identical weights and optimizer state


def test_resume_refuses_to_change_what_defines_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run"
    assert run_cli(capsys, *TINY, "--steps", "4", "--save", str(saved))[0] == 0
    code, _, err = run_cli(capsys, "--resume", str(saved), "--d-model", "64")
    assert code == 2
    assert "--d-model 64 cannot change on resume: the run was saved with --d-model 32" in err
    code, _, err = run_cli(capsys, "--resume", str(tmp_path / "missing"))
    assert code == 2 and "not a directory saved by `optiplug train --save`" in err


def test_two_processes_match_one_process(capfd: pytest.CaptureFixture[str]) -> None:
    # The global batch is split over the processes and gradients are averaged,
    # so the run is the one-process run up to float rounding.
    assert main(["train", *TINY, "--steps", "8"]) == 0
    single = losses(capfd.readouterr().out)
    assert main(["train", *TINY, "--steps", "8", "--nproc", "2"]) == 0
    out = capfd.readouterr().out
    assert "8 windows x 32 characters per step, 2 processes" in out
    assert out.count("step 8/8") == 1  # rank 0 alone logs
    for name, value in losses(out).items():
        assert value == pytest.approx(single[name], abs=2e-3)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_and_log_lines_elsewhere() -> None:
    terminal, logged = Terminal(), []
    bar = Progress(100, stream=terminal, log=logged.append)
    bar.update(50, 2.5, 1e-3)
    bar.evaluated(50, 2.4)
    bar.close()
    drawn = terminal.getvalue()
    assert drawn.startswith("\rstep  50/100  [##########..........]  50%") and drawn.endswith("\n")
    assert "steps/s  loss 2.500  lr 1.00e-03  eta" in drawn  # while it runs: the time left
    assert "steps/s  loss 2.500  val 2.400  lr 1.00e-03  in 0s" in drawn  # at the end: taken
    assert logged == []
    pipe, logged = io.StringIO(), []
    quiet = Progress(100, stream=pipe, log=logged.append)
    quiet.update(50, 2.5, 1e-3)
    quiet.evaluated(50, 2.4)
    quiet.close()
    assert pipe.getvalue() == "" and len(logged) == 1
    assert re.fullmatch(
        r"step  50/100 +[\d.]+ steps/s  loss 2.500  val 2.400  lr 1.00e-03", logged[0]
    )


def test_clip_is_saved_shown_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run"
    code, out, _ = run_cli(capsys, *TINY, "--steps", "4", "--clip", "0.5", "--save", str(saved))
    assert code == 0
    assert "clip:   global gradient norm (L2) clipped to 0.5 before every step" in out
    norm = float(
        re.search(
            r"^gradient norm at the last step: ([\d.e+-]+), clipped to 0.5$", out, re.MULTILINE
        ).group(1)
    )
    assert norm > 0
    run_file = json.loads((saved / "train.json").read_text())
    assert run_file["options"]["clip"] == 0.5
    code, _, err = run_cli(capsys, "--resume", str(saved), "--clip", "1.0")
    assert (
        code == 2 and "--clip 1 cannot change on resume: the run was saved with --clip 0.5" in err
    )
    # a run file from before --clip existed resumes as an unclipped run
    del run_file["options"]["clip"]
    (saved / "train.json").write_text(json.dumps(run_file))
    code, _, err = run_cli(capsys, "--resume", str(saved), "--clip", "1.0")
    assert code == 2 and "--clip 1 cannot change on resume: the run was saved without --clip" in err
    code, _, err = run_cli(capsys, *TINY, "--clip", "0")
    assert code == 2 and "clip" in err


def test_progress_shows_the_gradient_norm_when_measured() -> None:
    pipe, logged = io.StringIO(), []
    progress = Progress(100, stream=pipe, log=logged.append)
    progress.update(50, 2.5, 1e-3, 0.8123)
    progress.evaluated(50, 2.4)
    assert logged[0].endswith("lr 1.00e-03  gnorm 0.812")


# ------------------------------------------------------------------ Ctrl-C
# Each interrupted run is its own interpreter, with Python's own SIGINT handler installed
# as at a terminal: a test run started in the background of a shell without job control
# inherits SIGINT ignored (POSIX), and Ctrl-C could not reach the run there at all.
_INTERRUPT = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from optiplug_train import checkpoints
from optiplug_train.report import Progress
from optiplug.cli import main

where, step, args = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
if where == "step":
    update = Progress.update

    def interrupting(self, at, *rest, **kwargs):
        update(self, at, *rest, **kwargs)
        if at == step:
            signal.raise_signal(signal.SIGINT)

    Progress.update = interrupting
else:  # during a save, between the checkpoint and train.json
    write = checkpoints._write_run_file

    def interrupted_write(*rest):
        signal.raise_signal(signal.SIGINT)
        write(*rest)

    checkpoints._write_run_file = interrupted_write
try:
    code = main(["train", *args])
except KeyboardInterrupt:
    code = "escaped"
print(json.dumps(code))
"""


def run_interrupted(where: str, step: int, *args: str) -> tuple[int, list[str]]:
    """Run ``optiplug train TINY ARGS`` in a fresh process, Ctrl-C at ``step`` (or in a save).

    Returns:
        The exit code ``main`` returned, and the last two lines it wrote to stderr.
    """
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPT, where, str(step), json.dumps([*TINY, *args])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    code = json.loads(done.stdout.strip().splitlines()[-1])
    assert code != "escaped", (
        "KeyboardInterrupt escaped `optiplug train`: the user sees a traceback"
    )
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    return code, done.stderr.strip().splitlines()[-2:]


needs_sigint = pytest.mark.skipif(sys.platform == "win32", reason="raises SIGINT in-process")


@needs_sigint
def test_ctrl_c_names_the_step_the_intact_checkpoint_and_the_resume_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run dir"
    code, lines = run_interrupted(
        "step", 6, "--steps", "12", "--save-every", "4", "--save", str(saved)
    )
    assert code == 130
    assert lines == [
        "optiplug: interrupted at step 6 of 12",
        f"optiplug: the last checkpoint, step 4, is intact in {saved}; continue with: "
        f"optiplug train --resume {shlex.quote(str(saved))}",
    ]
    assert restored(saved).training_step == 4
    assert json.loads((saved / "train.json").read_text())["step"] == 4
    code, out, _ = run_cli(capsys, "--resume", str(saved), "--quiet", "--sample-chars", "0")
    assert code == 0 and "to step 12 (resumed at step 4)" in out


@needs_sigint
@pytest.mark.parametrize("save", [True, False], ids=["save", "no-save"])
def test_ctrl_c_before_the_first_checkpoint_says_nothing_was_saved(
    save: bool, tmp_path: Path
) -> None:
    saved = tmp_path / "run"
    code, lines = run_interrupted(
        "step", 3, "--steps", "12", *(["--save", str(saved)] if save else [])
    )
    assert code == 130
    assert lines[0] == "optiplug: interrupted at step 3 of 12"
    if save:
        assert lines[1] == (
            f"optiplug: no checkpoint was saved yet (the first was due at step 12), "
            f"so there is nothing to resume in {saved}"
        )
    else:
        assert lines[1] == "optiplug: nothing was saved (no --save)"
    assert not saved.exists()


@needs_sigint
def test_ctrl_c_during_a_save_takes_effect_once_the_checkpoint_is_whole(tmp_path: Path) -> None:
    """Ctrl-C between the checkpoint and train.json: both are written, then the run stops."""
    saved = tmp_path / "run"
    code, lines = run_interrupted(
        "save", 0, "--steps", "12", "--save-every", "4", "--save", str(saved)
    )
    assert code == 130
    assert lines[0] == "optiplug: interrupted at step 4 of 12"
    assert lines[1].startswith(f"optiplug: the last checkpoint, step 4, is intact in {saved};")
    assert json.loads((saved / "train.json").read_text())["step"] == 4
    assert restored(saved).training_step == 4

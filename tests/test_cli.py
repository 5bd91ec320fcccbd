"""The ``optiplug`` command line: list, show, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import optiplug
from optiplug import cli


def test_list_table_shows_first_party_plugins(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "kind",
        "name",
        "implementations",
        "plugin",
        "distribution",
        "version",
        "status",
    ]
    rows = {tuple(line.split()[:2]): line.split() for line in lines[2:] if line.strip()}
    for name in ("sgd", "adam", "adamw"):
        row = rows[("optimizer", name)]
        # then other plugins' implementations, e.g. "triton(unavailable)" without CUDA
        assert row[2].split(",")[:3] == ["foreach", "fused", "loop"]
        assert row[4] == f"optiplug-{name}" and row[5] == "0.1.0" and row[6] == "active"
    start = lines[0].index("name")
    for line in lines[2:]:
        if line.strip() and not line.startswith(
            ("failed", "unavailable", "incompatible", "disabled", "limited", "clash")
        ):
            assert line[start - 1] == " " and line[start] != " ", line  # columns are aligned


def test_list_json_is_machine_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    plugins = {p["name"]: p for p in listing["plugins"]}
    for name in ("sgd", "adam", "adamw"):
        assert plugins[name]["distribution"] == f"optiplug-{name}"
        assert plugins[name]["status"] == "active"
        assert f"optimizer:{name}" in plugins[name]["provides"]
    assert {o["name"] for o in listing["optimizers"]} >= {"sgd", "adam", "adamw"}


def test_show_describes_hyperparameters_and_state(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", "adam"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("adam - Adam with optional AMSGrad")
    assert "provider: adam (optiplug-adam 0.1.0)" in out
    assert "betas            (0.9, 0.999)  each in [0, 1)" in out
    assert "max_exp_avg_sq" in out and "amsgrad" in out


def test_show_unknown_name_is_friendly(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", "adamm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "optiplug: error: unknown optimizer 'adamm' (not a schedule either). "
        "Did you mean the optimizer 'adam'?"
    )
    assert "Traceback" not in err


def test_show_suggests_schedules_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", "cosin"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "optiplug: error: unknown optimizer 'cosin' (not a schedule either). "
        "Did you mean the schedule 'cosine'?"
    )
    assert (
        "Optimizers: a2grad, " in err
        and " adamw, " in err
        and "Schedules: " in err
        and "cosine" in err
    )
    assert len(err.strip().splitlines()) == 1
    assert cli.main(["show", "cosine"]) == 0  # and the suggestion is a name show takes


def test_auto_explain_shows_the_effective_hyperparameters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["auto", "--task", "text-classification"]) == 0
    out = capsys.readouterr().out
    assert "chosen: adam (lr=2e-05, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0" in out
    assert "\n        because: " in out
    pytest.importorskip("optiplug_muon")
    assert (
        cli.main(["auto", "--task", "causal-lm", "--params", "125M", "--stage", "pretraining"]) == 0
    )
    out = capsys.readouterr().out
    assert "chosen: muon (lr=0.02, momentum=0.95, nesterov=True" in out
    assert "adjust_lr='original'" in out
    assert "{}" not in out


def test_unknown_hyperparameter_message_reads_naturally() -> None:
    with pytest.raises(optiplug.errors.HyperparameterError) as caught:
        optiplug.factory("adamw", weight_decya=0.1)
    assert str(caught.value) == (
        "unknown hyperparameter 'weight_decya' for optimizer adamw; did you mean "
        "'weight_decay'? (accepted: amsgrad, betas, eps, lr, maximize, state_precision, "
        "weight_decay, weight_decay_mode)"
    )
    assert (caught.value.field, caught.value.value) == ("weight_decya", "<unknown keyword>")


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "optiplug", "show", "nope"], capture_output=True, text=True
    )
    assert (
        out.returncode == 2 and "Traceback" not in out.stderr and "unknown optimizer" in out.stderr
    )
    ok = subprocess.run([sys.executable, "-m", "optiplug", "list"], capture_output=True, text=True)
    assert ok.returncode == 0 and "optiplug-adamw" in ok.stdout


@pytest.mark.parametrize("command", ["list", "list --json"])
def test_list_imports_no_torch(command: str) -> None:
    """``optiplug list`` stays fast: no plugin hook or availability check imports torch."""
    code = (
        "import contextlib, io, sys\n"
        "from optiplug import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    status = cli.main({command.split()!r})\n"
        "print(status, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]

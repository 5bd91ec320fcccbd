"""``optiplug schedule`` and ``optiplug show`` for schedules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

import optiplug
from optiplug.cli import main
from optiplug.cli import schedule as _cli_schedule


def _rows(output: str) -> dict[int, list[str]]:
    """Table rows keyed by step (the first line is the schedule's repr)."""
    rows = {}
    for line in output.splitlines()[3:]:
        cells = line.split()
        rows[int(cells[0])] = cells[1:]
    return rows


def test_schedule_prints_a_compact_table_with_warmup_edge_and_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["schedule", "cosine", "--steps", "1000", "--param", "warmup_steps=100"])
    assert code == 0
    out = capsys.readouterr().out
    first, header = out.splitlines()[:2]
    assert first == "optiplug.schedule('cosine', total_steps=1000, warmup_steps=100, min_ratio=0.0)"
    assert header.split() == ["step", "multiplier", "note"]
    rows = _rows(out)
    schedule = optiplug.schedule("cosine", total_steps=1000, warmup_steps=100)
    assert {0, 50, 99, 100, 500, 999, 1000} <= set(rows)
    assert 21 <= len(rows) <= 26
    for step, cells in rows.items():
        assert float(cells[0]) == pytest.approx(schedule(step), rel=1e-5, abs=1e-9)
    assert rows[100][-1] == "done" and rows[1000][-1] == "end"
    assert rows[0][0] == "0.01"


def test_schedule_parses_literal_and_string_params(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["schedule", "multistep", "--steps", "10", "--param", "milestones=[2, 5]"]
    assert main([*argv, "--param", "gamma=0.5", "--points", "10"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [float(rows[s][0]) for s in (0, 1, 2, 4, 5, 10)] == [1, 1, 0.5, 0.5, 0.25, 0.25]
    argv = ["schedule", "wsd", "--steps", "40", "--param", "decay=1-sqrt"]
    argv += ["--param", "warmup_steps=0", "--param", "stable_steps=10", "--param", "decay_steps=4"]
    assert main(argv) == 0
    assert "decay='1-sqrt'" in capsys.readouterr().out


def test_parse_param() -> None:
    assert _cli_schedule.parse_param("total_steps=10") == ("total_steps", 10)
    assert _cli_schedule.parse_param(" decay = linear ") == ("decay", "linear")
    assert _cli_schedule.parse_param("milestones=[1, 2]") == ("milestones", [1, 2])
    with pytest.raises(argparse.ArgumentTypeError, match="key=value"):
        _cli_schedule.parse_param("oops")


def test_table_steps_are_even_plus_key_steps() -> None:
    schedule = optiplug.schedule("wsd", warmup_steps=7, stable_steps=30, decay_steps=20)
    steps = _cli_schedule.table_steps(schedule, 100, points=4)
    assert steps == [0, 6, 7, 25, 36, 37, 50, 56, 57, 75, 100]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schedule", "cosin", "--steps", "5"], "Did you mean 'cosine'"),
        (["schedule", "cosine", "--steps", "5", "--param", "min_ratio=2"], "invalid min_ratio=2"),
        (
            ["schedule", "cosine", "--steps", "5", "--param", "warmup=2"],
            "unknown parameter 'warmup' for schedule cosine; did you mean 'warmup_steps'?",
        ),
        (
            ["schedule", "exponential", "--steps", "5"],
            "schedule exponential: missing required parameter 'gamma'",
        ),
        (["schedule", "constant", "--steps", "-1"], "--steps -1 must be an integer >= 1"),
        (
            ["schedule", "step", "--steps", "5"],
            "optiplug: error: schedule step: missing required parameter 'step_size'",
        ),
    ],
)
def test_schedule_errors_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("name", ["cosine", "constant"])
def test_zero_steps_is_refused_not_shown_as_one(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schedule", name, "--steps", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "optiplug: error: --steps 0 must be an integer >= 1 (the table shows steps 0 to N)\n"
    )


def test_bad_param_syntax_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["schedule", "cosine", "--steps", "5", "--param", "nothing"])
    assert caught.value.code == 2
    assert "key=value" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "onecycle.png"
    assert main(["schedule", "onecycle", "--steps", "200", "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {target}" in capsys.readouterr().out


def test_plot_without_matplotlib_explains_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    target = tmp_path / "x.png"
    assert main(["schedule", "constant", "--steps", "10", "--plot", str(target)]) == 2
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "pip install 'optiplug[plot]'" in err
    assert not target.exists()


def test_show_documents_formula_and_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "cosine"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cosine - Linear warm-up, then cosine decay")
    assert "provider: schedules (optiplug" in out
    assert "min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2" in out
    for line in ("total_steps   required", "warmup_steps  0", "min_ratio     0.0"):
        assert line in out
    assert "stays at its final value" in out


@pytest.mark.parametrize("name", optiplug.schedules())
def test_show_works_for_every_builtin(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name} - ")
    assert "formula" in out and "parameters:" in out


@pytest.mark.parametrize(
    ("plot", "message"),
    [
        ("missing/dir/curve.png", "the directory '{tmp}/missing/dir' does not exist"),
        ("curve.foo", "unsupported image format '.foo'; name the file with one of: "),
        ("curve", "no file extension"),
        (".", "is a directory"),
    ],
)
def test_plot_path_is_checked_before_anything_is_printed(
    plot: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    assert main(["schedule", "cosine", "--steps", "10", "--plot", str(tmp_path / plot)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("optiplug: error: --plot ")
    assert message.format(tmp=tmp_path) in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_plot_formats_come_from_matplotlib() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = _cli_schedule.plot_formats()
    assert set(formats) == set(FigureCanvasBase.get_supported_filetypes())
    assert {"png", "pdf", "svg"} <= set(formats)
    _cli_schedule.check_plot_path("curve.PDF")  # the extension's case does not matter

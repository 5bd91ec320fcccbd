"""Edge values of ``auto`` and ``train`` options: one typed error line each, never a traceback.

Each case runs the real command line in-process and stops before anything is
selected or trained: a budget or count that is not finite, a negative
budget typed after a space, badly grouped thousands, an empty ``--compare``
name, and more seeds than a race takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from optiplug import cli
from optiplug_train.options import MAX_SEEDS


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``optiplug ARGS``: the exit status, stdout and stderr."""
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error_line(err: str, *fragments: str) -> None:
    """``err`` is one ``optiplug: error:`` line holding every fragment, and no traceback."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("optiplug: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, err)


# ------------------------------------------------------------------ auto
AUTO = ["auto", "--task", "causal-lm"]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["--params", "7B", "--memory-budget", "1e400GB"],
            ["memory_budget='1e400GB'", "not finite", "finite positive size"],
        ),
        (
            ["--params", "7B", "--memory-budget", "1e300GB"],  # finite digits, infinite bytes
            ["memory_budget='1e300GB'", "not finite"],
        ),
        (
            ["--params", "7B", "--memory-budget", "-1GB"],  # a value, not an unknown option
            ["memory_budget='-1GB'", "negative", "finite positive size"],
        ),
        (
            ["--params", "7B", "--memory-budget=-1GB"],
            ["memory_budget='-1GB'", "negative"],
        ),
        (
            ["--params", "7B", "--memory-budget", "-0.5GiB"],
            ["memory_budget='-0.5GiB'", "negative"],
        ),
    ],
)
def test_a_budget_that_is_not_a_finite_positive_size_is_one_error_line(
    args: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, *AUTO, *args)
    assert code == 2 and out == ""
    assert_one_error_line(err, *fragments)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1e400", "is not finite"),
        ("1e308", "is too large"),  # finite, but the bytes it needs are not
        ("1e999999999", "is not finite"),  # refused before any arithmetic on the exponent
        ("7,00,0", "has misplaced thousands separators"),
        ("7,000,", "has misplaced thousands separators"),
        ("7,0000", "has misplaced thousands separators"),
        ("1.000,5", "has misplaced thousands separators"),
        ("12,345.678,9", "has misplaced thousands separators"),
        ("-4M", "must be positive"),  # a value, not an unknown option
    ],
)
def test_a_count_that_is_not_a_finite_whole_number_is_one_error_line(
    value: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, *AUTO, "--params", value)
    assert code == 2 and out == ""
    assert_one_error_line(err, f"--params {value!r} {reason}")


@pytest.mark.parametrize(
    "args",
    [
        ["show", "adamw", "--params", "1e400"],
        ["show", "adamw", "--params", "1e308"],
        ["show", "adamw", "--params", "7,00,0"],
        ["bench", "adamw", "--params", "1e400"],
        ["bench", "adamw", "--params", "7,00,0"],
    ],
)
def test_show_and_bench_share_the_count_parser(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Their ``--params`` is an argparse type: argparse's usage lines, then the same reason."""
    with pytest.raises(SystemExit) as caught:  # argparse exits 2 itself
        cli.main(args)
    out, err = capsys.readouterr()
    assert caught.value.code == 2 and out == "" and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith(f"optiplug {args[0]}: error: argument --params: --params {args[-1]!r}")


# ------------------------------------------------------------------ train
@pytest.fixture()
def nothing_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in an empty directory where reading the corpus or training fails the test."""
    import optiplug_train.command as command
    import optiplug_train.compare as compare

    def started(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the command started reading the corpus or training")

    for module, name in [
        (command, "load_corpus"),
        (command, "train"),
        (command, "launch"),
        (compare, "load_corpus"),
        (compare, "train"),
    ]:
        monkeypatch.setattr(module, name, started)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == []  # no plot, no checkpoint, no results


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--compare", "adamw,,sgd"], ["--compare adamw,,sgd: an empty name"]),
        (["--compare", "adamw,sgd,"], ["--compare adamw,sgd,: an empty name"]),
        (["--compare", "=0.1,sgd"], ["--compare =0.1,sgd: an empty name"]),
        (["--compare", ""], ["--compare '': names no optimizer"]),
        (["--compare", " "], ["--compare ' ': names no optimizer"]),
        (
            ["--compare", "adamw,sgd", "--seeds", "1000000"],
            ["--seeds 1000000 is more than", f"{MAX_SEEDS}"],
        ),
        (
            ["--compare", "adamw", "--seeds", str(MAX_SEEDS + 1)],
            [f"--seeds {MAX_SEEDS + 1} is more than {MAX_SEEDS}"],
        ),
    ],
)
def test_an_empty_compare_name_or_too_many_seeds_is_refused_before_training(
    args: list[str],
    fragments: list[str],
    nothing_trains: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(capsys, "train", *args)
    assert code == 2 and out == ""  # not even the header
    assert_one_error_line(err, *fragments)

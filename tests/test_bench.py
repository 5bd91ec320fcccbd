"""``optiplug bench``: step times of every implementation at a size, the floor, the pick."""

from __future__ import annotations

import json
import re
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import optiplug
from optiplug import cli
from optiplug._core import autotune as _autotune
from optiplug.cli.bench import bytes_per_parameter

SMALL = ["--params", "64K", "--tensors", "4", "--steps", "3"]


@pytest.fixture(autouse=True)
def _fresh_autotune(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OPTIPLUG_AUTOTUNE", raising=False)
    _autotune.clear_cache()
    yield
    _autotune.clear_cache()


def table_rows(out: str) -> dict[str, list[str]]:
    """The rows under the ``implementation`` header: name -> the other columns."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("implementation")) + 2
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        name, *rest = re.split(r"\s{2,}", line.strip())
        rows[name] = rest
    return rows


def test_bench_times_every_implementation_and_marks_the_pick(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "adamw", *SMALL]) == 0
    out = capsys.readouterr().out
    threads = torch.get_num_threads()
    assert out.startswith(
        f"adamw: 64,000 fp32 parameters in 4 tensors of 250x64 on cpu ({threads} intra-op thread"
    )
    floor = re.search(r"floor: in-place copy of 28 B/param: ([0-9.]+) ms", out)
    assert floor is not None and float(floor.group(1)) > 0
    rows = table_rows(out)
    names = {impl.name for impl in optiplug.Registry().implementations("adamw")}
    assert {name.removesuffix(" *") for name in rows} == names
    picked = [name for name in rows if name.endswith(" *")]
    assert len(picked) == 1 and rows[picked[0]][-1] == "ok (impl=None picks it)"
    for name in ("loop", "foreach", "fused"):
        ms, ratio, status = rows.get(name) or rows[f"{name} *"]
        assert status.startswith("ok") and float(ms) > 0 and float(ratio) > 0


def test_bench_json_and_momentum_traffic(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "sgd", *SMALL, "--dtype", "bf16", "--param", "momentum=0.9", "--json"]
    threads = torch.get_num_threads()
    try:
        assert cli.main([*argv, "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    [result] = json.loads(capsys.readouterr().out)
    assert result["threads"] == 1
    assert (result["algorithm"], result["dtype"], result["parameters"]) == ("sgd", "bf16", 64000)
    assert result["bytes_per_param"] == 10  # bf16: read p, g, buf; write p, buf
    assert result["floor_ms"] > 0
    timed = {row["name"]: row for row in result["implementations"] if row["status"] == "ok"}
    assert {"loop", "foreach"} <= set(timed)
    for row in timed.values():
        assert row["ms_per_step"] > 0
        assert row["times_floor"] == pytest.approx(row["ms_per_step"] / result["floor_ms"])
    assert result["pick"] in timed and timed[result["pick"]]["picked"]
    assert sum(row["picked"] for row in result["implementations"]) == 1


def test_bytes_per_parameter_follow_the_state_slots() -> None:
    registry = optiplug.Registry()
    adam, sgd, lion = (registry.spec(name) for name in ("adam", "sgd", "lion"))
    assert bytes_per_parameter(adam, {}, 4) == 28  # read p, g, m, v; write p, m, v
    assert bytes_per_parameter(adam, {"amsgrad": True}, 4) == 36
    assert bytes_per_parameter(sgd, {"momentum": 0.9}, 4) == 20
    assert bytes_per_parameter(sgd, {"momentum": 0}, 4) == 12
    assert bytes_per_parameter(lion, {}, 4) == 20
    assert bytes_per_parameter(registry.spec("muon"), {}, 4) is None


def test_bench_shows_unavailable_and_unsupported_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def sgd(params: Any, **hparams: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, foreach=False, **hparams)

    impls = [
        optiplug.ImplementationSpec("toy", "plain", sgd),
        optiplug.ImplementationSpec(
            "toy", "gpu", sgd, priority=9, availability=lambda: "needs a CUDA device"
        ),
        optiplug.ImplementationSpec(
            "toy", "f64", sgd, supports=lambda ps: all(p.dtype == torch.float64 for p in ps)
        ),
    ]
    spec = optiplug.OptimizerSpec(
        "toy", torch.optim.SGD, defaults={"lr": 0.1}, implementations=impls
    )
    module = types.ModuleType("toy_plugin")
    module.optiplug_optimizers = optiplug.hookimpl(lambda: [spec])  # type: ignore[attr-defined]
    registry = optiplug.Registry(autoload=False, strict=False)
    registry.register(module, "toy", distribution="optiplug-toy", version="1.0")
    assert cli.main(["bench", "toy", *SMALL], registry=registry) == 0
    out = capsys.readouterr().out
    assert "floor: n/a" in out  # an algorithm of unknown traffic
    rows = table_rows(out)
    assert rows["gpu"] == ["-", "-", "unavailable: needs a CUDA device"]
    assert rows["f64"] == ["-", "-", "unsupported: does not support cpu/torch.float32 parameters"]
    assert rows["plain *"][-1] == "ok (impl=None picks it)" and float(rows["plain *"][0]) > 0


def test_bench_muon_has_no_floor(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "muon", "--params", "16K", "--tensors", "2", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "floor: n/a" in out
    [(name, (ms, ratio, status))] = table_rows(out).items()
    assert name == "default" and float(ms) > 0 and ratio == "n/a" and status.startswith("ok")


def test_unknown_algorithm_exits_2_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "lino", *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("optiplug: error: unknown optimizer 'lino'") and "'lion'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["--params", "12Q"], "argument --params:"),
        (["--params", "-5"], "argument --params:"),
        (["--dtype", "fp64"], "argument --dtype: unknown dtype 'fp64'"),
        (["--steps", "0"], "argument --steps: expected a whole number >= 1"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["bench", "adamw", *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_more_tensors_than_parameters_or_a_missing_device_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "adamw", "--params", "4", "--tensors", "8"]) == 2
    assert "--tensors: 8 tensors cannot hold --params 4 parameters" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["bench", "adamw", "--device", "cuda", *SMALL]) == 2
        assert "no CUDA device is available" in capsys.readouterr().err

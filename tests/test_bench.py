"""``optiplug bench``: step times of every implementation at a size, the floor, the pick."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import optiplug
from optiplug import cli
from optiplug._choice.chooser import chooser_of
from optiplug_devtools.bench import available_memory, bytes_per_parameter, memory_needed

SMALL = ["--params", "64K", "--tensors", "4", "--steps", "3"]


@pytest.fixture(autouse=True)
def _fresh_autotune(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OPTIPLUG_AUTOTUNE", raising=False)
    chooser_of().clear()
    yield
    chooser_of().clear()


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
        (["--params", "-4M"], "argument --params: --params '-4M' must be positive"),
        (["--params", "-1.5e9"], "argument --params: --params '-1.5e9' must be positive"),
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


@pytest.mark.cuda
def test_more_tensors_than_parameters_or_a_missing_device_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "adamw", "--params", "4", "--tensors", "8"]) == 2
    assert "--tensors: 8 tensors cannot hold --params 4 parameters" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["bench", "adamw", "--device", "cuda", *SMALL]) == 2
        assert "no CUDA device is available" in capsys.readouterr().err


@pytest.mark.parametrize(("size", "count"), [("1e15", 10**15), ("1e30", 10**30)])
def test_a_size_beyond_the_memory_available_exits_2_with_the_numbers(
    size: str, count: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "adamw", "--params", size]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"optiplug: error: --params {count:,}: adamw needs about ")
    assert re.search(r"needs about [\d,.]+ GB \([\d,.]+ GiB\).* [\d,.]+ GB .*available", err)
    assert "Traceback" not in err


def test_a_size_that_fits_is_not_refused() -> None:
    needed = memory_needed(optiplug.Registry().spec("adamw"), {}, 64_000, 4, implementations=3)
    assert needed == 64_000 * (4 * 2 * 4 + 3 * 2 * 4 + 28)  # 4 copies of p and g, 3 states, floor
    assert needed < available_memory()[0]


MEMORY_LIMITED_BENCH = """
import resource, sys
import torch  # mapped before the limit: it is what the limit leaves room beside
from optiplug.cli import main

with open("/proc/self/status") as status:
    size_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
limit = (size_kb << 10) + (int(sys.argv[1]) << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
sys.exit(main(["bench", "adamw", "--params", sys.argv[2]]))
"""


@pytest.mark.parametrize(("headroom_mib", "size"), [(8192, "7B"), (256, "16M")])
def test_a_size_beyond_an_address_space_limit_exits_2_naming_it(
    headroom_mib: int, size: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_LIMITED_BENCH, str(headroom_mib), size],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("optiplug: error: --params "), done.stderr
    assert "Traceback" not in done.stderr
    if headroom_mib < 1024:  # only the limit can be this small, not free memory
        assert "RLIMIT_AS" in done.stderr, done.stderr

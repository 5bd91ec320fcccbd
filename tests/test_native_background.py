"""A training step never waits for a native build: the torch path runs until the C library is loaded.

The compiler is held back by a real executable standing in for it (a shell
script that waits for a file to appear, then runs the system compiler), so
a step is known to fall inside the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
from optiplug.base import QuantizedState
from optiplug_adam import native as native_adam

pytestmark = pytest.mark.skipif(
    all(shutil.which(name) is None for name in ("cc", "gcc", "clang")),
    reason="no C compiler on this machine",
)


@pytest.fixture
def gated_compiler(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``(compiler, gate)``: the compiler answers ``--version`` at once and compiles once ``gate`` exists."""
    real = next(path for path in map(shutil.which, ("cc", "gcc", "clang")) if path)
    gate = tmp_path / "gate"
    script = tmp_path / "gated-cc"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then exec {real} --version; fi\n'
        f'while [ ! -e "{gate}" ]; do sleep 0.05; done\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    # opened after a minute at the latest: a step that waited for the build would hang
    # until then and fail, rather than hang for ever
    timer = threading.Timer(60.0, gate.touch)
    timer.start()
    yield script, gate
    timer.cancel()
    gate.touch()  # a compile still waiting ends


def _layout(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint or a kernel sees of ``state``: each slot's kind, dtypes and shapes."""
    found: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, QuantizedState):
            found[key] = (
                "quantized", value.precision, value.signed, value.linear, tuple(value.shape),
                value.dtype, value.codes.dtype, tuple(value.codes.shape), value.scales.dtype,
                tuple(value.scales.shape), value.factors is None,
            )  # fmt: skip
        elif isinstance(value, torch.Tensor):
            found[key] = ("tensor", value.dtype, tuple(value.shape))
        else:
            found[key] = type(value)
    return found


def _counted_c_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    step = native_adam.NativeAdam.step

    def counting(self: Any, param: torch.Tensor, *args: Any) -> None:
        calls.append(param.numel())
        step(self, param, *args)

    monkeypatch.setattr(native_adam.NativeAdam, "step", counting)
    return calls


@pytest.mark.slow
def test_a_step_during_the_build_runs_the_torch_path_and_a_later_one_the_c_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gated_compiler: tuple[Path, Path]
) -> None:
    compiler, gate = gated_compiler
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("OPTIPLUG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OPTIPLUG_NATIVE", raising=False)
    calls = _counted_c_steps(monkeypatch)
    start = torch.randn(96, 80, generator=torch.Generator().manual_seed(0))  # a partial block
    param, twin = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    hparams = {"lr": 1e-3, "state_precision": "int8", "impl": "fused"}
    mine = optiplug.create("adamw", [param], **hparams)
    torch_path = optiplug.create("adamw", [twin], **hparams)

    def step_both(seed: int) -> None:
        param.grad = torch.randn(96, 80, generator=torch.Generator().manual_seed(seed))
        twin.grad = param.grad.clone()
        mine.step()
        with monkeypatch.context() as native_off:
            native_off.setenv("OPTIPLUG_NATIVE", "0")  # the torch ops, always
            torch_path.step()

    for seed in (1, 2):  # the first creates the state, the second steps its int8 codes
        step_both(seed)
        # the compiler is held back: both ran the torch ops, so they agree bit for bit
        assert torch.equal(param, twin)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(mine.state[param][key].codes, torch_path.state[twin][key].codes)
    assert calls == [] and native_adam.native_adam(wait=False) is None  # still building
    layout = _layout(mine.state[param])
    assert layout == _layout(torch_path.state[twin])
    assert layout["exp_avg"][0] == "quantized" and layout["exp_avg"][1] == "int8"

    gate.touch()
    assert native_adam.native_adam(wait=True) is not None
    before = param.detach().clone()
    step_both(3)
    assert calls == [param.numel()]  # this step was the C step's
    assert _layout(mine.state[param]) == layout  # the switch kept the state's layout
    # docs/state.md's bound of the C step against the torch path, from equal states: the
    # C step rounds as ATen's loops except for sqrt (IEEE's where ATen's vectorised one may
    # be an ulp off), which reaches the parameter through one division and one addition:
    # 8 ulps of the parameter and of the update's terms (|update| <= lr (1 + wd |p|));
    # the moments do not depend on sqrt: within one code, their block scales within 8 ulps
    bound = 8 * 2.0**-23 * (before.abs() + 1e-3 * (1 + before.abs()))
    assert bool(((param.detach() - twin.detach()).abs() <= bound).all())
    for key in ("exp_avg", "exp_avg_sq"):
        ours, theirs = mine.state[param][key], torch_path.state[twin][key]
        assert int((ours.codes.int() - theirs.codes.int()).abs().max()) <= 1
        assert bool(((ours.scales - theirs.scales).abs() <= 8 * 2.0**-23 * theirs.scales).all())


EXITING_CHILD = """
import sys, time
from optiplug._native import _RUNNING, library_when_ready
source = "int answer(void) { return 42; }"
assert library_when_ready(source, name="never-built") is None
deadline = time.monotonic() + 60
while not _RUNNING and time.monotonic() < deadline:
    time.sleep(0.01)
assert library_when_ready(source, name="never-built") is None  # still building, not waited for
print(next(iter(_RUNNING.values())))
"""


@pytest.mark.slow
def test_an_exit_during_a_build_stops_the_compiler_and_leaves_no_partial_file(
    tmp_path: Path, gated_compiler: tuple[Path, Path]
) -> None:
    compiler, _ = gated_compiler  # the gate stays shut: the compile would never end
    cache = tmp_path / "cache"
    environment = {**os.environ, "CC": str(compiler), "OPTIPLUG_CACHE_DIR": str(cache)}
    child = subprocess.run(
        [sys.executable, "-c", EXITING_CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    partial = Path(child.stdout.strip().splitlines()[-1])
    assert partial.parent == cache / "kernels"
    assert not partial.exists()
    assert list((cache / "kernels").iterdir()) == []

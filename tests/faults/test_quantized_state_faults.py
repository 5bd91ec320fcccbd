"""Quantized optimizer state under fault: crafted slots, failed loads, precision switches.

Every test asserts the state after the fault, not only that an error was
raised: a refused load leaves the optimizer's state and groups exactly as
they were, and a refused step leaves parameters and state untouched.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import optiplug
from optiplug import checkpoint


def _stepped(name: str, shape: tuple[int, ...], **hparams: object) -> torch.optim.Optimizer:
    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(shape, generator=generator))
    optimizer = optiplug.create(name, [param], **hparams)
    for _ in range(2):
        param.grad = torch.randn(shape, generator=generator)
        optimizer.step()
    return optimizer


# ------------------------------------------------------------------ optiplug check in a fresh process
CHECKED = {
    "int8-adamw": ("adamw", {"lr": 1e-3, "state_precision": "int8"}),
    "int8-muon-factors": ("muon", {"lr": 0.02, "state_precision": "int8"}),
    "torchao-adamw8bit": ("adamw8bit", {"lr": 1e-3}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CHECKED))
def test_check_in_a_fresh_process_accepts_a_quantized_checkpoint_load_accepts(
    tmp_path: Path, case: str
) -> None:
    name, hparams = CHECKED[case]
    optimizer = _stepped(name, (256, 64), **hparams)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    checkpoint.load(tmp_path / "ckpt", _stepped(name, (256, 64), **hparams))  # load's verdict
    checked = subprocess.run(
        [sys.executable, "-m", "optiplug", "check", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{tmp_path / 'ckpt'}: OK" in checked.stdout

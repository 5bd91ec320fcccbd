"""benchmarks/bench_muon_state_error.py: its shadows store as a low-precision Muon does.

After the first step from zero every shadow holds exactly fp32's momentum
(``(1 - beta) * g``, the same float32 arithmetic), so every error is 0. After
the second, a shadow differs from fp32 by ``beta`` times the error of storing
the first momentum, which the codec gives independently.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import optiplug
from optiplug.base import QuantizedState

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_muon_state_error.py"
BETA = 0.95


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_muon_state_error_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_shadow_momenta_carry_exactly_the_storage_error() -> None:
    bench = load_bench()
    generator = torch.Generator().manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(96, 384, generator=generator))
    optimizer = optiplug.create("muon", [("proj.weight", weight)], momentum=BETA)
    shadows = bench.Shadows(optimizer)
    first, second = (torch.randn(96, 384, generator=generator) for _ in range(2))
    for grad in (first, second):
        weight.grad = grad.clone()
        optimizer.step()
    for name in bench.STORAGES:
        assert shadows.rows[0][name] == 0.0 and shadows.rows[0][name + " momentum"] == 0.0
    assert shadows.rows[1]["step to step"] > 0
    momentum = torch.zeros_like(first).lerp(first, 1 - BETA)
    exact = momentum.lerp(second, 1 - BETA)
    for name, (precision, linear) in bench.STORAGES.items():
        stored = QuantizedState.encode(momentum, precision, signed=True, linear=linear, writes=1)
        expected = (BETA * (stored.dequantize() - momentum)).norm() / exact.norm()
        # lerp rounds each element once (2**-24 of it) against errors of
        # at least 2**-9 of the momentum (bf16): a relative 1e-4 covers it
        got = shadows.rows[1][name + " momentum"]
        assert got == pytest.approx(float(expected), rel=1e-4)
        assert 0 < got < 0.25
    assert (
        shadows.rows[1]["int8 linear (shipped) momentum"] < shadows.rows[1]["int4 linear momentum"]
    )


def test_orthogonalized_takes_singular_values_into_the_quintic_band() -> None:
    """Jordan's quintic leaves singular values between about 0.68 and 1.13, not at 1."""
    bench = load_bench()
    generator = torch.Generator().manual_seed(1)
    matrix = torch.randn(64, 160, generator=generator, dtype=torch.float64)
    values = torch.linalg.svdvals(bench.orthogonalized(matrix))
    assert float(values.min()) > 0.6 and float(values.max()) < 1.2
    assert torch.equal(bench.orthogonalized(matrix.T), bench.orthogonalized(matrix).T)

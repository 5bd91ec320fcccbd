"""benchmarks/bench_muon_state_error.py: its shadows store as a low-precision Muon does.

After the first step from zero every shadow holds exactly fp32's momentum
(``(1 - beta) * g``, the same float32 arithmetic), so every error is 0. After
the second, a shadow differs from fp32 by ``beta`` times the error of storing
the first momentum, which the codec gives independently.
"""

from __future__ import annotations

import pytest
import torch
from benchmark_modules import load_benchmark

import optiplug
from optiplug.base import QuantizedState

BETA = 0.95


def test_shadow_momenta_carry_exactly_the_storage_error() -> None:
    bench = load_benchmark("bench_muon_state_error.py")
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
    for name, (precision, linear, rank) in bench.STORAGES.items():
        # as the bench does: a zero momentum, stored once
        stored = QuantizedState.encode(
            torch.zeros_like(momentum), precision, signed=True, linear=linear, rank=rank
        )
        stored.store(momentum)
        expected = (BETA * (stored.dequantize() - momentum)).norm() / exact.norm()
        # lerp rounds each element once (2**-24 of it) against errors of
        # at least 2**-9 of the momentum (bf16): a relative 1e-4 covers it
        got = shadows.rows[1][name + " momentum"]
        assert got == pytest.approx(float(expected), rel=1e-4)
        assert 0 < got < 0.25
    assert shadows.rows[1]["int8 linear momentum"] < shadows.rows[1]["int4 linear momentum"]


@pytest.mark.parametrize("shape", [(64, 160), (160, 64)])
def test_orthogonalized_is_the_quintic_on_each_singular_value(shape: tuple[int, int]) -> None:
    """Newton-Schulz maps each singular value ``s / ||M||`` through Jordan's quintic
    ``a x + b x**3 + c x**5`` five times and keeps the singular vectors.

    In float64 each iteration's products add about ``160 * 2**-53`` (4e-14) of
    error to values of order 1, and the quintic's slope (at most ``a = 3.4445``)
    multiplies it by at most 3.4445**5 = 484 over the five steps: 2e-11 in all,
    so 1e-9 leaves room for the SVDs' own error.
    """
    bench = load_benchmark("bench_muon_state_error.py")
    generator = torch.Generator().manual_seed(1)
    matrix = torch.randn(*shape, generator=generator, dtype=torch.float64)
    x = torch.linalg.svdvals(matrix) / torch.linalg.matrix_norm(matrix)
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    got = torch.linalg.svdvals(bench.orthogonalized(matrix))
    torch.testing.assert_close(got.sort().values, x.sort().values, rtol=0, atol=1e-9)
    assert float(got.min()) > 0.6 and float(got.max()) < 1.2

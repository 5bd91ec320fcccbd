"""Low-rank slots: float32 factors beside the int8/int4 codes of a matrix's residual.

The bounds come from the arithmetic: float32 rounds each operation to a
relative ``2**-24``; Householder QR keeps ``P``'s columns orthonormal to a
few roundings per row; the codes round the residual to half a step of its
block's maximum; and subspace iteration shrinks the angle to the leading
singular directions by ``sigma_5 / sigma_4`` per power of the matrix.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug import checkpoint
from optiplug._state.precision import BLOCK_SIZES
from optiplug.base import LOW_RANK, QuantizedState

EPS = 2.0**-24
TOP = {"int8": 127, "int4": 7}


def _steep(rows: int, cols: int, seed: int, singular: list[float]) -> torch.Tensor:
    """A float32 matrix with the given leading singular values over unit noise."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(rows, len(singular), generator=generator, dtype=torch.float64))
    v = torch.linalg.qr(torch.randn(cols, len(singular), generator=generator, dtype=torch.float64))
    leading = (u.Q * torch.tensor(singular, dtype=torch.float64)) @ v.Q.T
    noise = torch.randn(rows, cols, generator=generator, dtype=torch.float64) / (rows * cols) ** 0.5
    return (leading + noise).float()


def _factors(stored: QuantizedState) -> tuple[torch.Tensor, torch.Tensor]:
    assert stored.factors is not None
    rows = stored.shape[0]
    return stored.factors[:rows], stored.factors[rows:]


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(LOW_RANK + 1, 200),
    cols=st.integers(LOW_RANK + 1, 200),
    precision=st.sampled_from(["int8", "int4"]),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-20, 1e-3, 1.0, 1e15]),
)
def test_the_value_is_the_factors_part_plus_the_codes_within_half_a_step(
    rows: int, cols: int, precision: str, seed: int, scale: float
) -> None:
    """``P`` is orthonormal, ``Q = M.T @ P``, and the decoded value is within half a step of
    the residual's block maximum (plus the float32 roundings of the subtraction and sum)."""
    value = _steep(rows, cols, seed, [100.0, 30.0, 3.0]) * scale
    stored = QuantizedState.encode(value, precision, signed=True, linear=True, rank=LOW_RANK)
    p, q = _factors(stored)
    assert p.shape == (rows, LOW_RANK) and q.shape == (cols, LOW_RANK)
    identity = torch.eye(LOW_RANK, dtype=torch.float64)
    assert (p.double().T @ p.double() - identity).abs().max() <= 8 * rows * EPS
    exact_q = value.double().T @ p.double()
    assert (
        (q.double() - exact_q).abs() <= 2 * rows * EPS * (value.double().abs().T @ p.double().abs())
    ).all()
    low = (p.double() @ q.double().T).float()
    residual = (value - low).reshape(-1)
    block = BLOCK_SIZES[precision]
    padded = torch.nn.functional.pad(residual, (0, (-residual.numel()) % block)).view(-1, block)
    maxima = padded.abs().amax(dim=1, keepdim=True).expand_as(padded).reshape(-1)[: value.numel()]
    bound = maxima / (2 * TOP[precision]) * (1 + 8 * EPS) + 4 * EPS * (
        value.abs() + low.abs()
    ).reshape(-1)
    error = (stored.dequantize().double() - value.double()).reshape(-1).abs()
    assert (error <= bound.double() + 1e-45).all()


def test_subspace_iteration_finds_the_leading_singular_directions() -> None:
    """Encoding iterates twice from hashed vectors (``M`` applied three times to them); each
    store once more from the factors held (``M M.T`` twice): with ``sigma_5 / sigma_4 = 1/30``
    the angle to the leading four directions falls by 30**3 on encoding, 900 per store."""
    value = _steep(300, 200, 1, [1000.0, 300.0, 100.0, 30.0])
    u = torch.linalg.svd(value.double(), full_matrices=False).U[:, :LOW_RANK]
    stored = QuantizedState.encode(value, "int8", signed=True, linear=True, rank=LOW_RANK)
    angles = []
    for _ in range(3):
        p, _ = _factors(stored)
        outside = p.double() - u @ (u.T @ p.double())  # P's part outside U's span
        angles.append(torch.linalg.matrix_norm(outside, ord=2).item())
        stored.store(value)
    assert angles[0] <= 1e-2
    assert angles[2] <= max(angles[0] / 900**2, 64 * 300 * EPS)


def test_a_write_starts_from_the_factors_held() -> None:
    """A momentum with the same leading directions but a small gap (sigma_5 / sigma_4 = 6.5 / 7)
    is written after a steep one: from the held factors one iteration keeps the angle at
    about the steep one's (times 0.93**2) plus float32's floor ``rows * eps * sigma_1 / gap``
    (the perturbation bound of the subspace); from fresh vectors it would shrink only 0.93**3."""
    generator = torch.Generator().manual_seed(5)
    u = torch.linalg.qr(torch.randn(300, 200, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(200, 200, generator=generator, dtype=torch.float64)).Q

    def with_singular_values(values: list[float]) -> torch.Tensor:
        return ((u * torch.tensor(values, dtype=torch.float64)) @ v.T).float()

    steep = with_singular_values([1000.0, 300.0, 100.0, 30.0] + [1.0] * 196)
    close = with_singular_values([10.0, 9.0, 8.0, 7.0] + [6.5] * 196)
    stored = QuantizedState.encode(steep, "int8", signed=True, linear=True, rank=LOW_RANK)

    def angle() -> float:
        p, _ = _factors(stored)
        outside = p.double() - u[:, :4] @ (u[:, :4].T @ p.double())
        return float(torch.linalg.matrix_norm(outside, ord=2))

    before = angle()
    stored.store(close)
    assert angle() <= before + 300 * EPS * 10.0 / 0.5 * 8


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_a_steep_matrix_keeps_its_small_directions(precision: str) -> None:
    """Rounding a matrix whose top singular value is 1000 times the rest: without factors
    the error is half a step of the top's elements, with them of the noise's."""
    value = _steep(256, 256, 2, [1000.0])
    plain = QuantizedState.encode(value, precision, signed=True, linear=True)
    factored = QuantizedState.encode(value, precision, signed=True, linear=True, rank=LOW_RANK)
    leading = torch.linalg.svd(value.double()).U[:, :1]
    tail = value.double() - leading @ (leading.T @ value.double())

    def error(stored: QuantizedState) -> float:
        return float(torch.linalg.matrix_norm(stored.dequantize().double() - value.double()))

    # rounding error is at most half a step (a block's maximum / top / 2) per element, and
    # a block of 256 Gaussian values peaks near 4 of its RMS (3.05 on average): in Frobenius
    # norm about 2.3 ||tail|| / top at worst, under the 3 asserted
    assert error(factored) <= error(plain) / 50
    assert error(factored) <= 3 * float(torch.linalg.matrix_norm(tail)) / TOP[precision]


def test_zero_and_non_finite_values_keep_finite_factors() -> None:
    """A zero momentum decodes to zero; a NaN is the codes' business (its block reads NaN, as
    without factors), the factors are taken with it read as 0."""
    zero = QuantizedState.encode(torch.zeros(64, 64), "int8", signed=True, rank=LOW_RANK)
    assert zero.factors is not None and torch.equal(zero.dequantize(), torch.zeros(64, 64))
    zero.store(torch.zeros(64, 64))
    assert torch.equal(zero.dequantize(), torch.zeros(64, 64))
    steep = _steep(64, 64, 6, [1000.0])  # all-zero factors held: the write restarts them
    zero.store(steep)
    plain = QuantizedState.encode(steep, "int8", signed=True)
    assert (
        float((zero.dequantize() - steep).norm()) <= float((plain.dequantize() - steep).norm()) / 50
    )
    value = _steep(64, 64, 4, [10.0])
    value[3, 5] = float("nan")
    stored = QuantizedState.encode(value, "int8", signed=True, rank=LOW_RANK)
    assert stored.factors is not None and bool(torch.isfinite(stored.factors).all())
    plain = QuantizedState.encode(value, "int8", signed=True)
    assert torch.equal(stored.dequantize().isnan(), plain.dequantize().isnan())


def test_factors_need_a_matrix_with_both_sides_above_the_rank() -> None:
    for shape, factored in (((4096,), False), ((4, 2048), False), ((5, 1024), True)):
        value = torch.randn(shape)
        stored = QuantizedState.encode(value, "int8", signed=True, linear=True, rank=LOW_RANK)
        assert (stored.factors is not None) == factored, shape
    conv = QuantizedState.encode(torch.randn(32, 8, 3, 3), "int4", signed=True, rank=LOW_RANK)
    assert conv.factors is not None and conv.factors.shape == (32 + 72, LOW_RANK)
    bf16 = QuantizedState.encode(torch.randn(64, 64), "bf16", signed=True, rank=LOW_RANK)
    assert bf16.factors is None and bf16.rank == 0


def test_factors_survive_copies_pickles_moves_and_the_flatten_protocol() -> None:
    stored = QuantizedState.encode(_steep(64, 128, 3, [50.0]), "int8", signed=True, rank=4)
    copies = (
        stored.clone(),
        stored.detach(),
        stored.to("cpu"),
        _saved_and_loaded(stored),
    )
    for copied in copies:
        assert isinstance(copied, QuantizedState) and copied.rank == LOW_RANK
        assert torch.equal(copied.dequantize(), stored.dequantize())
    names, context = stored.__tensor_flatten__()
    assert names == ["codes", "scales", "factors"]
    inner = {name: getattr(stored, name) for name in names}
    rebuilt = QuantizedState.__tensor_unflatten__(inner, context, stored.shape, stored.stride())
    assert torch.equal(rebuilt.dequantize(), stored.dequantize())
    target = QuantizedState.encode(torch.zeros(64, 128), "int8", signed=True, rank=LOW_RANK)
    target.copy_(stored)
    assert torch.equal(target.dequantize(), stored.dequantize())


def _saved_and_loaded(value: torch.Tensor) -> torch.Tensor:
    """``value`` through ``torch.save`` and ``torch.load(weights_only=True)`` (as DCP reads)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    loaded: torch.Tensor = torch.load(buffer, weights_only=True)
    return loaded


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_memory_counts_the_factors(precision: str) -> None:
    """``optiplug.memory`` adds ``4 * rank * (rows + cols)`` bytes for a Muon matrix."""
    weight = torch.nn.Parameter(torch.randn(96, 160))
    optimizer = optiplug.create("muon", [("blocks.0.weight", weight)], state_precision=precision)
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    report = optiplug.memory(optimizer)
    codes = weight.numel() * (8 if precision == "int8" else 4) // 8
    scales = 4 * -(-weight.numel() // BLOCK_SIZES[precision])
    factors = 4 * LOW_RANK * (96 + 160)
    assert report.by_slot["momentum_buffer"] == codes + scales + factors


def test_an_int8_muon_resumes_bit_equal_with_its_factors(tmp_path: Path) -> None:
    """The factors are state: a resumed run warm-starts from the same ones."""
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(96, 128)) for _ in range(2)]
    named = [(f"blocks.{i}.weight", w) for i, w in enumerate(weights)]
    grads = [[torch.randn(96, 128) for _ in weights] for _ in range(6)]

    def run(optimizer: torch.optim.Optimizer, steps: range) -> None:
        for step in steps:
            for weight, grad in zip(weights, grads[step], strict=True):
                weight.grad = grad.clone()
            optimizer.step()

    start = [w.detach().clone() for w in weights]
    whole = optiplug.create("muon", named, state_precision="int8")
    run(whole, range(6))
    ended = [w.detach().clone() for w in weights]
    with torch.no_grad():
        for weight, value in zip(weights, start, strict=True):
            weight.copy_(value)
    first = optiplug.create("muon", named, state_precision="int8")
    run(first, range(3))
    checkpoint.save(tmp_path / "ckpt", first)
    resumed = optiplug.create("muon", named, state_precision="int8")
    checkpoint.load(tmp_path / "ckpt", resumed)
    momentum = resumed.state[weights[0]]["momentum_buffer"]
    assert isinstance(momentum, QuantizedState) and momentum.rank == LOW_RANK
    run(resumed, range(3, 6))
    for weight, expected in zip(weights, ended, strict=True):
        assert torch.equal(weight.detach(), expected)

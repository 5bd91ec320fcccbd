"""Low-precision optimizer state: ``state_precision="bf16" | "int8" | "int4"``.

The codec is checked against a brute-force nearest-value search over its own
table and against the published table construction; each algorithm's update
is checked against torch's (or the algorithm's reference) run on the decoded
state; memory against the bytes of the codes and scales; resume through
:mod:`optiplug.checkpoint` bit for bit; and loading across precisions.
"""

from __future__ import annotations

import copy
import itertools
import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug import checkpoint, testing
from optiplug._state.codec import _codes, dynamic_table, linear_table
from optiplug._state.precision import BLOCK_SIZES, state_bytes_per_element
from optiplug.base import LOW_RANK, QuantizedState
from optiplug.errors import HyperparameterError

ALGORITHMS: dict[str, dict[str, Any]] = {
    "adamw": {},
    "adam": {},
    "sgd": {"momentum": 0.9},
    "lion": {},
    "muon": {},
}
LOW = ("bf16", "int8", "int4")


def _create(name: str, params: Any, **hparams: Any) -> torch.optim.Optimizer:
    """``optiplug.create`` with the loop kernel forced where there is a choice.

    Measuring in the background may switch an optimizer to another kernel
    between two steps, which rounds differently: the bit-for-bit comparisons
    here hold one kernel fixed.
    """
    impl = None if name == "muon" else "loop"
    return optiplug.create(name, params, impl=impl, **{**ALGORITHMS[name], **hparams})


# ------------------------------------------------ the tables and codes
def test_the_tables_follow_the_dynamic_exponent_construction() -> None:
    signed4 = sorted(set(dynamic_table(4, True)))
    expected = {0.0, *(s * v for s in (1, -1) for v in (0.01, 0.055, 0.1, 0.325, 0.55, 0.775, 1.0))}
    assert signed4 == pytest.approx(sorted(expected), rel=1e-12)
    unsigned4 = dynamic_table(4, False, zero=False)  # a second moment's: no zero, 1e-4 instead
    assert min(unsigned4) == pytest.approx(1e-4) and max(unsigned4) == 1.0 and 0.0 not in unsigned4
    for bits, signed in ((8, True), (8, False), (4, True), (4, False)):
        table = dynamic_table(bits, signed)
        assert len(table) == 2**bits and 1.0 in table


@pytest.mark.parametrize(("bits", "signed"), [(8, True), (8, False), (4, True), (4, False)])
def test_each_value_gets_the_nearest_code(bits: int, signed: bool) -> None:
    """The code is the brute-force nearest table value's (up to float32 rounding)."""
    generator = torch.Generator().manual_seed(bits + signed)
    count = 50_000
    values = torch.rand(count, generator=generator) * torch.pow(
        10.0, -8 * torch.rand(count, generator=generator)
    )
    if signed:
        values = values * torch.where(torch.rand(count, generator=generator) < 0.5, -1.0, 1.0)
    table = torch.tensor(dynamic_table(bits, signed, zero=signed))
    got = (table[_codes(values, bits, signed).long()] - values).abs()
    best = (table[None, :] - values[:, None]).abs().min(dim=1).values
    # the decade comes from log10 in float32: a value within a few ulps of a
    # decade boundary may take the code on the boundary's other side
    assert torch.all(got - best <= 4 * torch.finfo(torch.float32).eps * values.abs() + 1e-12)


def _given_blocks(max_numel: int, smallest: float, largest: float) -> Any:
    """Hypothesis over ``(numel, precision, scale)``: a value's length, int8 or int4, and
    the magnitude its normal draws are scaled to."""
    return given(
        st.integers(min_value=1, max_value=max_numel),
        st.sampled_from(["int8", "int4"]),
        st.floats(min_value=smallest, max_value=largest),
    )


@settings(max_examples=30, deadline=None)
@_given_blocks(3000, 1e-6, 1e6)
def test_decoding_is_within_half_a_table_step_of_the_value(
    numel: int, precision: str, scale: float
) -> None:
    generator = torch.Generator().manual_seed(numel)
    value = torch.randn(numel, generator=generator) * scale
    decoded = QuantizedState.encode(value, precision, signed=True).dequantize()
    bits = 8 if precision == "int8" else 4
    table = sorted(set(dynamic_table(bits, True)))
    widest = max(b - a for a, b in itertools.pairwise(table))
    assert _within_half_a_step(decoded, value, precision, widest / 2)


def _within_half_a_step(
    decoded: torch.Tensor, value: torch.Tensor, precision: str, half_step: float
) -> bool:
    """Whether each decoded value is within ``half_step`` of its block's maximum of the value.

    Plus the roundings, in units of the maximum: the code may part from the
    nearest within 16 * 2**-24 of a midpoint (the bound the decade-rule tests
    derive), and decoding rounds the table value and its product with the
    scale (2**-24 each).
    """
    block = BLOCK_SIZES[precision]
    padded = torch.nn.functional.pad(value.double(), (0, (-value.numel()) % block))
    maxima = padded.view(-1, block).abs().amax(dim=1, keepdim=True)
    bound = (maxima * (half_step + 18 * 2**-24)).expand(-1, block).reshape(-1)
    return bool(((decoded.double() - value.double()).abs() <= bound[: value.numel()]).all())


def test_bf16_stochastic_rounding_is_unbiased_and_reproducible() -> None:
    value = torch.full((100_000,), 1.0 + 2**-10)  # between two bfloat16 values (ulp 2**-7)
    first = QuantizedState.encode(value, "bf16", signed=True, writes=3).dequantize()
    again = QuantizedState.encode(value, "bf16", signed=True, writes=3).dequantize()
    assert torch.equal(first, again)
    assert set(first.unique().tolist()) == {1.0, 1.0 + 2**-7}
    # each draw rounds up with probability 1/8: the mean's standard error is
    # ulp * sqrt(p(1-p)/n) = 8e-6; allow five of them
    assert abs(float(first.double().mean()) - (1.0 + 2**-10)) < 5 * 2**-7 * math.sqrt(
        (1 / 8) * (7 / 8) / value.numel()
    )


# ------------------------------------------------ the linear table (Muon's momentum)
@pytest.mark.parametrize("bits", [8, 4])
def test_the_linear_tables_are_the_published_maps(bits: int) -> None:
    """Signed: Gupta et al.'s ``k / top`` (0 twice, as in the dynamic table); unsigned:
    Li et al.'s ``k / 2**bits`` without zero."""
    top = 2 ** (bits - 1) - 1
    signed = linear_table(bits, True)
    assert len(signed) == 2**bits and list(signed) == sorted(signed)
    assert signed[: top + 1] == tuple(-k / top for k in range(top, -1, -1))
    assert signed[top + 1 :] == tuple(k / top for k in range(top + 1))
    unsigned = linear_table(bits, False)
    assert unsigned == tuple(k / 2**bits for k in range(1, 2**bits + 1))


@settings(max_examples=40, deadline=None)
@_given_blocks(1500, 1e-30, 1e30)
def test_linear_codes_follow_the_formula_within_the_blocks_maximum(
    numel: int, precision: str, scale: float
) -> None:
    """Decoded = max * round(top * x / max) / top (Gupta et al.'s Q) per block.

    The codec multiplies by the float32 reciprocal of the maximum, so ``top *
    x / max`` is off by a few ulps of ``top`` (at most 3 roundings of 2**-24
    relative): the code may differ from the formula's only where that value
    lies that close to a half-integer, and then by one. Either way the
    decoded value is within half a step (``max / top / 2``) of the value,
    plus those roundings.
    """
    bits = 8 if precision == "int8" else 4
    top = 2 ** (bits - 1) - 1
    generator = torch.Generator().manual_seed(numel)
    value = torch.randn(numel, generator=generator, dtype=torch.float64) * scale
    value = value.float()
    stored = QuantizedState.encode(value, precision, signed=True, linear=True)
    assert stored.linear and stored.codes.numel() * 8 // bits % BLOCK_SIZES[precision] == 0
    block = BLOCK_SIZES[precision]
    padded = torch.nn.functional.pad(value.double(), (0, (-numel) % block)).view(-1, block)
    maxima = padded.abs().amax(dim=1, keepdim=True)
    exact = (padded / torch.where(maxima > 0, maxima, 1.0) * top).reshape(-1)[:numel]
    codes = stored.codes.long()
    if bits == 4:
        codes = torch.stack((codes & 0xF, codes >> 4), dim=1).reshape(-1)
    codes = codes[:numel]
    half = top + 1  # code half + k stands for k / top, code half - 1 - k for -k / top
    codes = torch.where(codes >= half, codes - half, -(half - 1 - codes))
    near_half = (exact - exact.floor() - 0.5).abs() < 8 * 2**-24 * top
    assert not bool(((codes != torch.round(exact)) & ~near_half).any())
    assert bool(((codes - exact).abs() <= 0.5 + 8 * 2**-24 * top).all())
    assert _within_half_a_step(stored.dequantize(), value, precision, 0.5 / top)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_linear_codes_survive_a_decode_and_encode(precision: str) -> None:
    """Re-encoding the decoded value gives the same values and scales (a sharded load does it).

    Only zero has two codes (a small negative value's and 0's), as in the dynamic table.
    """
    value = torch.randn(10_000, generator=torch.Generator().manual_seed(7)) ** 3
    stored = QuantizedState.encode(value, precision, signed=True, linear=True)
    again = QuantizedState.encode(stored.dequantize(), precision, signed=True, linear=True)
    assert torch.equal(again.dequantize(), stored.dequantize())
    assert torch.equal(again.scales, stored.scales)


def test_a_linear_state_keeps_its_table_through_copies_and_pickles() -> None:
    value = torch.randn(64, 128)
    stored = QuantizedState.encode(value, "int8", signed=True, linear=True)
    for copied in (copy.deepcopy(stored), pickle.loads(pickle.dumps(stored)), stored.clone()):
        assert isinstance(copied, QuantizedState) and copied.linear
        assert torch.equal(copied.dequantize(), stored.dequantize())
    names, context = stored.__tensor_flatten__()
    inner = {name: getattr(stored, name) for name in names}
    rebuilt = QuantizedState.__tensor_unflatten__(inner, context, stored.shape, stored.stride())
    assert rebuilt.linear and torch.equal(rebuilt.dequantize(), stored.dequantize())
    older = QuantizedState.__tensor_unflatten__(inner, context[:4], stored.shape, stored.stride())
    assert not older.linear  # a record saved before the linear table decodes as dynamic
    dynamic = QuantizedState.encode(value, "int8", signed=True)
    dynamic.copy_(stored)  # another table: decoded and re-encoded, not its codes copied
    assert not dynamic.linear
    assert torch.equal(dynamic.dequantize(), QuantizedState.encode(
        stored.dequantize(), "int8", signed=True).dequantize())  # fmt: skip


# ------------------------------------------------ the tensor
def test_a_quantized_state_behaves_as_its_value() -> None:
    value = torch.randn(64, 128)
    stored = QuantizedState.encode(value, "int8", signed=True)
    decoded = stored.dequantize()
    assert stored.shape == value.shape and stored.dtype == torch.float32
    assert torch.equal(stored * 2, decoded * 2) and bool(torch.isfinite(stored).all())
    for copied in (copy.deepcopy(stored), pickle.loads(pickle.dumps(stored))):
        assert isinstance(copied, QuantizedState) and torch.equal(copied.dequantize(), decoded)
        assert copied.codes.data_ptr() != stored.codes.data_ptr()
    with pytest.raises(TypeError, match="in place"):
        stored.add_(1.0)
    stored.copy_(torch.zeros_like(value))
    assert torch.equal(stored.dequantize(), torch.zeros_like(value))


# ------------------------------------------------ the optimizers
def _params(seed: int = 0, shape: tuple[int, ...] = (64, 128)) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(*shape, generator=generator)),
        torch.nn.Parameter(torch.randn(shape[0], generator=generator)),  # stays full precision
    ]


def _grads(params: list[torch.nn.Parameter], seed: int) -> None:
    generator = torch.Generator().manual_seed(1000 + seed)
    for param in params:
        param.grad = torch.randn(param.shape, generator=generator)


def _run(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], start: int, stop: int
) -> None:
    for index in range(start, stop):
        _grads(params, index)
        optimizer.step()


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("precision", LOW)
def test_large_slots_are_stored_low_and_small_ones_stay_full(name: str, precision: str) -> None:
    params = _params()
    optimizer = _create(name, params, state_precision=precision)
    _run(optimizer, params, 0, 2)
    for key, value in optimizer.state[params[0]].items():
        if key != "step":
            assert isinstance(value, QuantizedState) and value.precision == precision, key
    assert not any(isinstance(v, QuantizedState) for v in optimizer.state[params[1]].values())


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_muons_momentum_takes_the_linear_table_and_adamws_moments_theirs(
    precision: str,
) -> None:
    """After one step from zero, Muon's momentum is (1 - momentum) * g, stored linearly
    with rank-4 factors."""
    generator = torch.Generator().manual_seed(3)
    hidden = torch.nn.Parameter(torch.randn(96, 128, generator=generator))
    head = torch.nn.Parameter(torch.randn(96, 128, generator=generator))
    groups = [
        {"params": [("blocks.0.weight", hidden)]},
        {"params": [("head.weight", head)], "use_muon": False},
    ]
    optimizer = optiplug.create("muon", groups, state_precision=precision, momentum=0.9)
    hidden.grad = torch.randn(hidden.shape, generator=generator)
    head.grad = torch.randn(head.shape, generator=generator)
    optimizer.step()
    momentum = optimizer.state[hidden]["momentum_buffer"]
    assert isinstance(momentum, QuantizedState) and momentum.linear and momentum.rank == LOW_RANK
    for key, linear in (("exp_avg", False), ("exp_avg_sq", precision == "int4")):
        moment = optimizer.state[head][key]
        assert isinstance(moment, QuantizedState) and moment.linear == linear, key
        assert moment.rank == 0, key
    expected = torch.zeros_like(hidden).lerp_(hidden.grad, 1 - 0.9)
    again = QuantizedState.encode(expected, precision, signed=True, linear=True, rank=LOW_RANK)
    assert torch.equal(momentum.codes, again.codes) and torch.equal(momentum.scales, again.scales)
    assert momentum.factors is not None and again.factors is not None
    assert torch.equal(momentum.factors, again.factors)


@pytest.mark.parametrize("name", ["adamw", "adam"])
@pytest.mark.parametrize("impl", ["loop", "fused"])
def test_int4_second_moments_take_the_linear_table_without_zero(name: str, impl: str) -> None:
    """Li et al.'s (and torchao's) 4-bit second moment: ``k / 16``, never zero; int8 keeps
    the dynamic table; the first moment stays dynamic in both."""
    for precision, linear in (("int4", True), ("int8", False)):
        params = _params(shape=(96, 128))
        optimizer = optiplug.create(name, params, impl=impl, state_precision=precision)
        _run(optimizer, params, 0, 3)
        first, second = (optimizer.state[params[0]][k] for k in ("exp_avg", "exp_avg_sq"))
        assert isinstance(second, QuantizedState) and not second.signed
        assert second.linear == linear and isinstance(first, QuantizedState) and not first.linear
        if linear:
            smallest = second.scales.repeat_interleave(BLOCK_SIZES[precision]) / 16
            decoded = second.dequantize().reshape(-1)
            assert torch.all(decoded >= smallest[: decoded.numel()] * (1 - 1e-6))


def test_a_muon_checkpoint_with_a_dynamic_momentum_loads_linear(tmp_path: Path) -> None:
    """State saved in the dynamic table (as before the linear one) is re-encoded on load."""
    params = _params(shape=(96, 128))
    named = [(f"p{i}", p) for i, p in enumerate(params)]
    optimizer = _create("muon", named, state_precision="int8")
    _run(optimizer, params, 0, 2)
    momentum = optimizer.state[params[0]]["momentum_buffer"]
    old = QuantizedState.encode(momentum.dequantize(), "int8", signed=True, writes=momentum.writes)
    optimizer.state[params[0]]["momentum_buffer"] = old
    checkpoint.save(tmp_path / "ckpt", optimizer)
    loaded = _create("muon", [(f"p{i}", p) for i, p in enumerate(params)], state_precision="int8")
    checkpoint.load(tmp_path / "ckpt", loaded)
    got = loaded.state[params[0]]["momentum_buffer"]
    assert isinstance(got, QuantizedState) and got.linear and got.rank == LOW_RANK
    expected = QuantizedState.encode(
        old.dequantize(), "int8", signed=True, linear=True, rank=LOW_RANK
    )
    assert torch.equal(got.codes, expected.codes)


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
@pytest.mark.parametrize("precision", LOW)
def test_the_update_is_torchs_on_the_decoded_state(name: str, precision: str) -> None:
    """One more step equals torch's own class stepping from the decoded state."""
    params = _params()
    optimizer = _create(name, params, lr=0.01, state_precision=precision)
    _run(optimizer, params, 0, 3)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    torch_class = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[
        name
    ]
    keywords = {"lr": 0.01, **ALGORITHMS[name], "foreach": False}
    if name == "adamw":
        keywords["weight_decay"] = 1e-2
    reference = torch_class(twins, **keywords)
    for param, twin in zip(params, twins, strict=True):
        reference.state[twin] = {
            key: value.dequantize() if isinstance(value, QuantizedState) else value.clone()
            for key, value in optimizer.state[param].items()
        }
    _grads(params, 3)
    _grads(twins, 3)
    optimizer.step()
    reference.step()
    for param, twin in zip(params, twins, strict=True):
        assert torch.equal(param.detach(), twin.detach())


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("precision", LOW)
def test_resume_through_a_checkpoint_is_bit_equal(
    name: str, precision: str, tmp_path: Path
) -> None:
    params = _params()
    named = [(f"p{i}", p) for i, p in enumerate(params)]
    optimizer = _create(name, named, state_precision=precision)
    _run(optimizer, params, 0, 3)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    _run(optimizer, params, 3, 6)
    resumed = _create(name, [(f"p{i}", p) for i, p in enumerate(twins)], state_precision=precision)
    checkpoint.load(tmp_path / "ckpt", resumed)
    _run(resumed, twins, 3, 6)
    for param, twin in zip(params, twins, strict=True):
        assert torch.equal(param.detach(), twin.detach())
    assert testing.same_state_value(optimizer.state_dict()["state"], resumed.state_dict()["state"])


@pytest.mark.parametrize(
    ("saved", "loading"),
    [("fp32", "int8"), ("int8", "fp32"), ("int4", "bf16"), ("int8", "int4"), ("int4", "int8")],
)
def test_a_checkpoint_loads_into_another_precision(
    saved: str, loading: str, tmp_path: Path
) -> None:
    """The loading optimizer keeps its precision; the values are the saved ones, re-encoded."""
    params = _params()
    optimizer = _create("adamw", [("w", params[0])], state_precision=saved)
    _run(optimizer, params[:1], 0, 3)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    twin = torch.nn.Parameter(params[0].detach().clone())
    loaded = _create("adamw", [("w", twin)], state_precision=loading)
    checkpoint.load(tmp_path / "ckpt", loaded)
    assert loaded.param_groups[0]["state_precision"] == loading
    for key in ("exp_avg", "exp_avg_sq"):
        before, after = optimizer.state[params[0]][key], loaded.state[twin][key]
        expected = (
            QuantizedState.encode(
                before.dequantize() if isinstance(before, QuantizedState) else before,
                loading,
                signed=key == "exp_avg",
                writes=before.writes if isinstance(before, QuantizedState) else 0,
                linear=key == "exp_avg_sq" and loading == "int4",
            )
            if loading != "fp32"
            else before.dequantize()
        )
        assert type(after) is type(expected)
        assert testing.same_state_value(after, expected), key


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_bad_precision_names_the_field_and_the_choices(name: str) -> None:
    with pytest.raises(HyperparameterError, match="fp32, bf16, int8, int4") as raised:
        optiplug.create(name, _params(), state_precision="int3", **ALGORITHMS[name])
    assert raised.value.field == "state_precision" and "int3" in str(raised.value)


@pytest.mark.parametrize("name", ["adamw", "lion", "sgd"])
@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_memory_is_the_codes_and_scales_and_the_estimate_agrees(name: str, precision: str) -> None:
    params = [torch.nn.Parameter(torch.randn(1024, 1024)) for _ in range(4)]
    optimizer = _create(name, params, state_precision=precision)
    _run(optimizer, params, 0, 1)
    count = sum(p.numel() for p in params)
    slots = {"adamw": 2, "lion": 1, "sgd": 1}[name]
    codes = count * (8 if precision == "int8" else 4) // 8
    scales = 4 * count // BLOCK_SIZES[precision]
    step_bytes = 4 * len(params) if name == "adamw" else 0
    report = optiplug.memory(optimizer)
    assert report.total == slots * (codes + scales) + step_bytes
    bound = {"int8": 2.1 if slots == 2 else 1.05, "int4": 1.1 if slots == 2 else 0.55}[precision]
    assert report.total / count <= bound
    estimate = optiplug.estimate_memory(
        name, count, num_tensors=len(params), state_precision=precision, **ALGORITHMS[name]
    )
    assert abs(estimate.total - report.total) <= 0.01 * report.total
    assert state_bytes_per_element(precision) * slots * count <= report.total


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_the_suite_holds_in_int8(name: str, check: Any) -> None:
    """The conformance suite, on a parameter large enough to take the int8 path.

    Muon's orthogonalized step has a spectral norm of about lr, so a 64x64
    target needs a larger lr than the suite's 0.05 (in full precision too).
    """
    lr = {"lr": 0.2} if name == "muon" else {}
    check(
        name,
        hparams={"state_precision": "int8", **ALGORITHMS[name], **lr},
        shape=(64, 64),
        dtype=torch.float32,
    )


# ------------------------------------------------ the training command
def test_train_takes_the_state_precision(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from optiplug.cli import main

    tiny = ["--layers", "1", "--d-model", "64", "--heads", "2", "--block-size", "32",
            "--batch-size", "8", "--max-chars", "100000", "--sample-chars", "20",
            "--eval-windows", "8", "--threads", "1", "--steps", "6"]  # fmt: skip
    code = main(["train", *tiny, "--state-precision", "int8", "--save", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0 and "state_precision='int8'" in out
    assert main(["train", *tiny[:-1], "8", "--resume", str(tmp_path / "run")]) == 0
    assert "state_precision='int8'" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", *tiny, "--state-precision", "int3"])

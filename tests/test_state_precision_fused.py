"""The fused C step of Adam and AdamW on int8, int4 and bf16 state (:mod:`optiplug_adam.native`).

Each fused step is checked against the slow path (decode, torch's own step,
encode) taken from the same state, and both against the step computed in
float64 from the decoded state. The tolerances come from the arithmetic:
both paths compute the new moments and parameter in float32 from the same
inputs, so they differ by a few roundings (torch's vectorized ``lerp`` may
use a fused multiply-add); a block's maximum therefore differs by a few
ulps of its terms, and a code by at most one table step, where the value
sits within rounding of a midpoint.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
import optiplug.base
from optiplug._state import native_state
from optiplug._state.codec import QuantizedState, _encode_blocks, _magnitudes
from optiplug._state.precision import BLOCK_SIZES, CODE_BITS
from optiplug_adam import native as native_adam
from optiplug_sgd import native as sgd_native

pytestmark = pytest.mark.skipif(
    all(shutil.which(name) is None for name in ("cc", "gcc", "clang")),
    reason="no C compiler on this machine",
)

EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTIPLUG_NATIVE", raising=False)
    # a step never waits for a build: the C steps these tests count are built first
    if native_adam.native_adam(wait=True) is None:
        pytest.skip("the C step could not be built here")
    assert native_state.state_kernel_or_none(sgd_native.SGD_STATE_KERNEL, wait=True) is not None


@contextlib.contextmanager
def _slow_path() -> Iterator[None]:
    """The fused step made unavailable, so the decode/step/encode path runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_adam, "native_adam", lambda wait=True: None)
        yield


def _pair(
    name: str, numel: int, precision: str, seed: int, **hparams: Any
) -> tuple[list[torch.optim.Optimizer], list[torch.nn.Parameter]]:
    """Two optimizers over equal parameters, each after one (slow, state-creating) step."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(numel, generator=generator)
    grad = torch.randn(numel, generator=generator) * 0.1
    optimizers, params = [], []
    for _ in range(2):
        param = torch.nn.Parameter(start.clone())
        param.grad = grad.clone()
        optimizer = optiplug.create(
            name, [param], impl="fused", state_precision=precision, **hparams
        )
        optimizer.step()
        optimizers.append(optimizer)
        params.append(param)
    return optimizers, params


def _codes(slot: QuantizedState) -> torch.Tensor:
    """One code per element (int4 unpacked, low nibble first), as int64."""
    codes = slot.codes.long()
    if slot.precision == "int4":
        codes = torch.stack((codes & 15, codes >> 4), dim=1).reshape(-1)
    return codes


def _float64_step(
    optimizer: torch.optim.Optimizer, param: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The new parameter, the size of its update's terms, and the new moments, in float64.

    The update's terms are ``lr / bias_correction1 * (beta1 * |m| + (1 - beta1) * |g|) / denom``:
    float32 rounds the new first moment relative to them (they may cancel).
    """
    group = optimizer.param_groups[0]
    state = optimizer.state[param]
    lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    step = float(state["step"]) + 1
    p = param.detach().double()
    g = -grad.double() if group["maximize"] else grad.double()
    if group["decoupled_weight_decay"]:
        p = p * (1 - lr * decay)
    else:
        g = g + decay * p
    old = state["exp_avg"].dequantize().double()
    m = old * beta1 + (1 - beta1) * g
    v = state["exp_avg_sq"].dequantize().double() * beta2 + (1 - beta2) * g * g
    step_size = lr / (1 - beta1**step)
    denom = v.sqrt() / (1 - beta2**step) ** 0.5 + eps
    terms = step_size * (beta1 * old.abs() + (1 - beta1) * g.abs()) / denom
    return p - step_size * m / denom, terms, m, v


def _assert_close_states(
    fused: dict[str, Any], slow: dict[str, Any], before: dict[str, torch.Tensor], grad: torch.Tensor
) -> None:
    """Codes at most one step apart and scales within the rounding of their terms."""
    assert torch.equal(fused["step"], slow["step"])
    block = BLOCK_SIZES[fused["exp_avg"].precision]
    for key, terms in (("exp_avg", before["exp_avg"].abs() + grad.abs()),
                       ("exp_avg_sq", before["exp_avg_sq"] + grad * grad)):  # fmt: skip
        mine, theirs = fused[key], slow[key]
        assert mine.writes == theirs.writes
        assert (_codes(mine) - _codes(theirs)).abs().max() <= 1
        padded = torch.nn.functional.pad(terms, (0, (-terms.numel()) % block))
        bound = 4 * EPS32 * padded.view(-1, block).amax(dim=1) + 1e-30
        assert torch.all((mine.scales - theirs.scales).abs() <= bound)


@settings(max_examples=25, deadline=None)
@given(
    numel=st.one_of(st.integers(4096, 50_000), st.sampled_from([4096, 4097, 8192, 16_383, 65_536])),
    precision=st.sampled_from(["int8", "int4"]),
    name=st.sampled_from(["adam", "adamw"]),
    weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
    maximize=st.booleans(),
    eps=st.sampled_from([1e-8, 1e-3]),
    lr=st.sampled_from([1e-3, 3e-2]),
    seed=st.integers(0, 2**16),
)
def test_the_fused_step_matches_the_slow_path(
    numel: int,
    precision: str,
    name: str,
    weight_decay: float,
    maximize: bool,
    eps: float,
    lr: float,
    seed: int,
) -> None:
    hparams = {"lr": lr, "weight_decay": weight_decay, "maximize": maximize, "eps": eps}
    (fast, slow), (p_fast, p_slow) = _pair(name, numel, precision, seed, **hparams)
    grad = torch.randn(numel, generator=torch.Generator().manual_seed(seed + 1))
    p_fast.grad, p_slow.grad = grad.clone(), grad.clone()
    expected, update, _, _ = _float64_step(fast, p_fast, grad)
    before = {key: fast.state[p_fast][key].dequantize() for key in ("exp_avg", "exp_avg_sq")}
    effective = grad if weight_decay == 0 or name == "adamw" else grad + weight_decay * p_fast
    bound = _step_both(fast, slow, p_fast, p_slow, update)
    assert torch.all((p_fast.detach().double() - expected).abs() <= bound.double())
    _assert_close_states(fast.state[p_fast], slow.state[p_slow], before, effective.detach())


def _step_both(
    fast: torch.optim.Optimizer,
    slow: torch.optim.Optimizer,
    p_fast: torch.Tensor,
    p_slow: torch.Tensor,
    update: torch.Tensor,
) -> torch.Tensor:
    """Step ``fast`` (by the C step, checked) and ``slow`` (decode, torch's step, encode).

    Returns:
        The bound the parameters were checked to agree within: 8 ulps of the
        parameter and of the update's terms (``update``, see :func:`_float64_step`).
    """
    calls = _counting(fast)
    with _slow_path():
        slow.step()
    assert calls == [True]
    bound = 8 * EPS32 * (p_slow.detach().abs() + update.float()) + 1e-30
    assert torch.all((p_fast.detach() - p_slow.detach()).abs() <= bound)
    return bound


def _within_one_bf16_step(mine: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Whether bfloat16 values differ by at most one unit in the last place of the larger.

    Both paths round the same float32 value stochastically with the same
    bits; the float32 values may differ by a few roundings, which moves a
    value across a bfloat16 boundary at most once.
    """
    a, b = mine.float(), theirs.float()
    larger = torch.maximum(a.abs(), b.abs())
    ulp = torch.where(larger > 0, 2.0 ** (torch.frexp(larger).exponent - 8), 0.0)
    return bool(torch.all((a - b).abs() <= ulp.clamp_min(2.0**-133)))


@settings(max_examples=20, deadline=None)
@given(
    numel=st.one_of(st.integers(4096, 30_000), st.sampled_from([4096, 4097, 8191, 65_536])),
    name=st.sampled_from(["adam", "adamw"]),
    weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
    maximize=st.booleans(),
    lr=st.sampled_from([1e-3, 3e-2]),
    seed=st.integers(0, 2**16),
)
def test_the_fused_bf16_step_matches_the_slow_path(
    numel: int, name: str, weight_decay: float, maximize: bool, lr: float, seed: int
) -> None:
    """bf16 moments: the C step's stochastic rounding draws the torch path's bits."""
    hparams = {"lr": lr, "weight_decay": weight_decay, "maximize": maximize}
    (fast, slow), (p_fast, p_slow) = _pair(name, numel, "bf16", seed, **hparams)
    for _ in range(2):
        grad = torch.randn(numel, generator=torch.Generator().manual_seed(seed + 1))
        p_fast.grad, p_slow.grad = grad.clone(), grad.clone()
        _, update, _, _ = _float64_step(fast, p_fast, grad)
        _step_both(fast, slow, p_fast, p_slow, update)
        for key in ("exp_avg", "exp_avg_sq"):
            mine, theirs = fast.state[p_fast][key], slow.state[p_slow][key]
            assert mine.precision == "bf16" and mine.writes == theirs.writes
            assert _within_one_bf16_step(mine.codes, theirs.codes)
        p_slow.data.copy_(p_fast.detach())  # the next step starts both from the same values
        for key in ("exp_avg", "exp_avg_sq"):
            slow.state[p_slow][key].codes.copy_(fast.state[p_fast][key].codes)


def test_the_fused_bf16_step_rounds_without_bias() -> None:
    """Stochastic rounding: a moment that rounding to nearest would freeze still moves."""
    param = torch.nn.Parameter(torch.zeros(8192))
    optimizer = optiplug.create("adamw", [param], impl="fused", state_precision="bf16", lr=0.0)
    param.grad = torch.ones(8192)
    optimizer.step()
    stored = optimizer.state[param]["exp_avg"]
    stored.codes.fill_(0.1)  # every element the bfloat16 nearest 0.1, exactly
    start = float(stored.dequantize()[0])
    beta1 = 0.9
    for _ in range(20):
        param.grad = torch.full((8192,), start * (1 + 2**-10))
        assert _counting(optimizer) == [True]
    # each step moves the exact EMA by at most 0.1 * start * 2**-10, far below half a
    # bfloat16 ulp (start * 2**-9 at least), so rounding to nearest would never move it
    exact = start + (1 - beta1**20) * start * 2**-10
    mean = optimizer.state[param]["exp_avg"].dequantize().double().mean()
    assert abs(float(mean) - exact) < 0.25 * (exact - start)


@settings(max_examples=20, deadline=None)
@given(
    numel=st.one_of(st.integers(4096, 30_000), st.sampled_from([4096, 4097, 8191, 65_536])),
    precision=st.sampled_from(["int8", "int4", "bf16"]),
    nesterov=st.booleans(),
    dampening=st.sampled_from([0.0, 0.1]),
    weight_decay=st.sampled_from([0.0, 0.01]),
    maximize=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_fused_sgd_step_equals_torchs_single_tensor_step(
    numel: int,
    precision: str,
    nesterov: bool,
    dampening: float,
    weight_decay: float,
    maximize: bool,
    seed: int,
) -> None:
    """Bit for bit: the same multiplies and fused multiply-adds as ATen's, on the same codes."""
    if nesterov:
        dampening = 0.0  # torch's nesterov requires it
    hparams = {"lr": 1e-2, "momentum": 0.9, "dampening": dampening, "nesterov": nesterov,
               "weight_decay": weight_decay, "maximize": maximize}  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    start, first = torch.randn(numel, generator=generator), torch.randn(numel, generator=generator)
    pair = []
    for impl in ("fused", "loop"):  # loop: torch's single-tensor step on the decoded buffer
        param = torch.nn.Parameter(start.clone())
        param.grad = first.clone()
        optimizer = optiplug.create("sgd", [param], impl=impl, state_precision=precision, **hparams)
        optimizer.step()
        pair.append((optimizer, param))
    (fast, p_fast), (slow, p_slow) = pair
    for step in range(2):
        grad = torch.randn(numel, generator=generator)
        p_fast.grad, p_slow.grad = grad.clone(), grad.clone()
        assert _counting(fast) == [True]
        slow.step()
        assert torch.equal(p_fast, p_slow)
        mine, theirs = fast.state[p_fast]["momentum_buffer"], slow.state[p_slow]["momentum_buffer"]
        assert mine.writes == theirs.writes == step + 1
        assert torch.equal(mine.codes.view(torch.uint8), theirs.codes.view(torch.uint8))
        assert torch.equal(mine.scales, theirs.scales)


@pytest.mark.parametrize(
    ("impl", "hparams"),
    [("fused", {"momentum": 0.0}), ("loop", {"momentum": 0.9}), ("foreach", {"momentum": 0.9})],
)
def test_the_fused_sgd_step_declines_and_changes_nothing(
    impl: str, hparams: dict[str, Any]
) -> None:
    param = torch.nn.Parameter(torch.randn(10_000))
    param.grad = torch.randn(10_000)
    optimizer = optiplug.create(
        "sgd", [param], impl=impl, lr=0.1, state_precision="int8", **hparams
    )
    optimizer.step()
    value = param.detach().clone()
    assert sgd_native.fused_sgd_step(optimizer, optimizer.param_groups[0], param) is False
    assert torch.equal(param.detach(), value)


def _counting(optimizer: torch.optim.Optimizer) -> list[bool]:
    """Step ``optimizer`` once with the fused step's answers recorded; returns them."""
    answers: list[bool] = []
    sgd = isinstance(optimizer, torch.optim.SGD)
    original = type(optimizer).state_step
    assert original is (sgd_native.fused_sgd_step if sgd else native_adam.fused_adam_step)

    def counted(*args: Any) -> bool:
        answers.append(original(*args))
        return answers[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(optimizer), "state_step", counted)  # the class's declared C step
        optimizer.step()
    return answers


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_moments_follow_the_float64_step(precision: str) -> None:
    """The new moments decode within one table step of the float64 ones (quantized)."""
    (fast, _), (param, _) = _pair("adamw", 20_000, precision, 7, lr=1e-2)
    grad = torch.randn(20_000, generator=torch.Generator().manual_seed(8))
    param.grad = grad
    _, _, m, v = _float64_step(fast, param, grad)
    assert _counting(fast) == [True]
    state = fast.state[param]
    for key, exact, signed in (("exp_avg", m, True), ("exp_avg_sq", v, False)):
        table = torch.tensor(sorted(set(optiplug._state.codec.dynamic_table(
            CODE_BITS[precision], signed, zero=signed))), dtype=torch.float64)  # fmt: skip
        block = BLOCK_SIZES[precision]
        padded = torch.nn.functional.pad(exact, (0, (-exact.numel()) % block)).view(-1, block)
        scale = padded.abs().amax(dim=1, keepdim=True)
        step = (table[1:] - table[:-1]).max()  # the widest step bounds each element's error
        decoded = state["exp_avg"].dequantize() if key == "exp_avg" else state[key].dequantize()
        error = (decoded.double() - exact).abs()
        bound = (scale * step).expand_as(padded).reshape(-1)[: exact.numel()] + 1e-12
        assert torch.all(error <= bound)


def test_adamw_int8_takes_the_fused_step_for_every_parameter() -> None:
    params = [torch.nn.Parameter(torch.randn(64, 100)) for _ in range(3)]
    optimizer = optiplug.create("adamw", params, impl="fused", state_precision="int8")
    for param in params:
        param.grad = torch.randn_like(param)
    assert _counting(optimizer) == [False] * 3  # the first step creates the state
    steps = [float(optimizer.state[p]["step"]) for p in params]
    writes = [optimizer.state[p]["exp_avg"].writes for p in params]
    for _ in range(2):
        assert _counting(optimizer) == [True] * 3
    assert [float(optimizer.state[p]["step"]) for p in params] == [s + 2 for s in steps]
    assert [optimizer.state[p]["exp_avg"].writes for p in params] == [w + 2 for w in writes]


@pytest.mark.parametrize(
    ("impl", "hparams", "precision"),
    [
        ("fused", {"amsgrad": True}, "int8"),
        ("fused", {}, "fp32"),
        ("loop", {}, "bf16"),
        ("loop", {}, "int8"),  # loop and foreach keep torch's arithmetic on the decoded state
        ("foreach", {}, "int4"),
    ],
)
def test_the_fused_step_declines_and_changes_nothing(
    impl: str, hparams: dict[str, Any], precision: str
) -> None:
    param = torch.nn.Parameter(torch.randn(10_000))
    param.grad = torch.randn(10_000)
    optimizer = optiplug.create("adamw", [param], impl=impl, state_precision=precision, **hparams)
    optimizer.step()
    before = copy.deepcopy(optimizer.state_dict())
    value = param.detach().clone()
    group = optimizer.param_groups[0]
    assert native_adam.fused_adam_step(optimizer, group, param) is False
    assert torch.equal(param.detach(), value)
    after = optimizer.state_dict()
    for key, slot in before["state"][0].items():
        assert torch.equal(torch.as_tensor(after["state"][0][key]), torch.as_tensor(slot))


def test_the_fused_step_declines_without_state_or_with_a_tensor_lr() -> None:
    param = torch.nn.Parameter(torch.randn(10_000))
    param.grad = torch.randn(10_000)
    optimizer = optiplug.create("adamw", [param], impl="fused", state_precision="int8")
    assert native_adam.fused_adam_step(optimizer, optimizer.param_groups[0], param) is False
    optimizer.step()
    group = {**optimizer.param_groups[0], "lr": torch.tensor(1e-3)}
    assert native_adam.fused_adam_step(optimizer, group, param) is False
    assert float(optimizer.state[param]["step"]) == 1


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("signed", [True, False])
def test_the_step_encodes_as_the_codec_does(precision: str, signed: bool) -> None:
    """Bit for bit, on random values and on each midpoint and its float32 neighbours."""
    bits, block = CODE_BITS[precision], BLOCK_SIZES[precision]
    magnitudes = torch.tensor(_magnitudes(bits, signed, zero=signed), dtype=torch.float32)
    finite = torch.cat([(magnitudes[1:] + magnitudes[:-1]) / 2, magnitudes])
    edges = torch.cat([finite, torch.nextafter(finite, torch.zeros(())), finite.nextafter(
        torch.ones(())), torch.tensor([0.0, -0.0, 1e-45, 1e-38, 1.0])])  # fmt: skip
    blocks = torch.cat([edges, torch.ones(1)])  # a block's maximum of 1 keeps them as they are
    generator = torch.Generator().manual_seed(bits + signed)
    spread = torch.rand(40_000, generator=generator) * 10.0 ** (
        -8 * torch.rand(40_000, generator=generator)
    )
    values = torch.cat([blocks, spread, torch.tensor([float("nan"), 3.0, float("inf")])])
    if signed:
        values = values * torch.where(torch.rand(values.numel(), generator=generator) < 0.5, -1, 1)
    kernel = native_adam.native_adam()
    assert kernel is not None
    codes, scales = kernel.encode(values.contiguous(), precision, signed)
    expected_codes, expected_scales = _encode_blocks(values, bits, signed, block)
    assert torch.equal(codes, expected_codes)
    assert torch.allclose(scales, expected_scales, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "without",
    [
        ("__AVX512VBMI__",),
        ("__AVX512VBMI__", "__AVX512F__"),
        ("__AVX512VBMI__", "__AVX512F__", "__AVX2__", "__AVX__", "__SSE2__"),
    ],
)
def test_every_instruction_set_path_steps_alike(without: tuple[str, ...]) -> None:
    """The AVX2 and plain C loops (built here by hiding the CPU's features) match, bit for bit."""
    hidden = "".join(f"#undef {feature}\n" for feature in without)
    name = "optiplug-adam-test-" + str(len(without))
    other = native_adam.NativeAdam(
        optiplug.base.build_c_library(hidden + native_adam._SOURCE, name=name)
    )
    kernel = native_adam.native_adam()
    assert kernel is not None
    for precision in ("int8", "int4", "bf16"):
        (first, second), (p_first, p_second) = _pair("adamw", 9_000, precision, 3, lr=1e-2)
        grad = torch.randn(9_000, generator=torch.Generator().manual_seed(4))
        scalars = native_adam._scalars(first, first.param_groups[0], 2.0)
        for chosen, optimizer, param in ((kernel, first, p_first), (other, second, p_second)):
            state = optimizer.state[param]
            chosen.step(param.detach(), grad, (state["exp_avg"], state["exp_avg_sq"]), scalars)
        assert torch.equal(p_first, p_second)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(first.state[p_first][key].codes, second.state[p_second][key].codes)
            assert torch.equal(first.state[p_first][key].scales, second.state[p_second][key].scales)
    sgd_kernels = (
        native_state.build_state_kernel(sgd_native.SGD_STATE_KERNEL),
        native_state.StateKernel(sgd_native.SGD_STATE_KERNEL, optiplug.base.build_c_library(
            hidden + sgd_native.SGD_STATE_KERNEL.c_source(), name=name + "-sgd")),
    )  # fmt: skip
    for precision in ("int8", "int4", "bf16"):
        params = [torch.nn.Parameter(torch.randn(9_000, generator=torch.Generator().manual_seed(5)))
                  for _ in range(2)]  # fmt: skip
        buffers = []
        for param in params:
            param.grad = torch.randn(9_000, generator=torch.Generator().manual_seed(6))
            sgd = optiplug.create("sgd", [param], impl="fused", lr=0.1, momentum=0.9,
                                  nesterov=True, state_precision=precision)  # fmt: skip
            sgd.step()
            buffers.append((sgd, sgd.state[param]["momentum_buffer"]))
        scalars = sgd_native._sgd_scalars(buffers[0][0].param_groups[0])
        for chosen, param, (_, buffer) in zip(sgd_kernels, params, buffers, strict=True):
            chosen.step(param.detach(), param.grad, [buffer], scalars)
        assert torch.equal(params[0], params[1])
        assert torch.equal(
            buffers[0][1].codes.view(torch.uint8), buffers[1][1].codes.view(torch.uint8)
        )
        assert torch.equal(buffers[0][1].scales, buffers[1][1].scales)

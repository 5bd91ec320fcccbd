"""C steps on low-precision state from an update's body (``optiplug.base.StateKernelSource``).

Each kernel is compared with the path it replaces: decode the slots, apply
the same float32 operations with torch (or the algorithm's own kernel), and
encode. The C body is compiled with IEEE arithmetic and no contraction, and
the encoding and bf16 rounding are the codec's own, so the two agree bit for
bit; nothing here needs a tolerance.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug._state.codec import in_precision
from optiplug.base import (
    KernelTableOptimizer,
    QuantizedState,
    StateKernel,
    StateKernelSource,
    build_state_kernel,
    state_kernel_or_none,
)
from optiplug.errors import NativeBuildError
from optiplug.validators import state_precision_field

pytestmark = pytest.mark.skipif(
    all(shutil.which(name) is None for name in ("cc", "gcc", "clang")),
    reason="no C compiler on this machine",
)

EMA = StateKernelSource(
    name="optiplug-test-ema",
    update="exp_avg = exp_avg + (1.0f - beta) * (grad - exp_avg);\nparam = param - lr * exp_avg;",
    slots=("exp_avg",),
    scalars=("beta", "lr"),
)


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Native kernels on, and the C steps these tests count built before they step.

    A step never waits for a build (it runs the decoding path meanwhile), so
    a test that counts C steps waits for its kernels here first.
    """
    from optiplug_lion.optimizer import Lion
    from optiplug_sgd.native import SGD_STATE_KERNEL

    monkeypatch.delenv("OPTIPLUG_NATIVE", raising=False)
    for source in (Lion.state_kernel, SGD_STATE_KERNEL, SignEma.state_kernel):
        assert source is not None
        assert state_kernel_or_none(source, wait=True) is not None


def _stored(value: torch.Tensor, precision: str) -> QuantizedState:
    found = in_precision(value, precision, signed=True)
    assert isinstance(found, QuantizedState)
    return found


def _codes(slot: QuantizedState) -> torch.Tensor:
    return slot.codes.view(torch.uint8)


@settings(max_examples=20, deadline=None)
@given(
    numel=st.one_of(st.integers(4096, 30_000), st.sampled_from([4096, 4097, 8191, 65_536])),
    precision=st.sampled_from(["int8", "int4", "bf16"]),
    seed=st.integers(0, 2**16),
)
def test_a_kernel_equals_decode_update_encode(numel: int, precision: str, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    param, grad, moment = (torch.randn(numel, generator=generator) for _ in range(3))
    mine, theirs = _stored(moment, precision), _stored(moment, precision)
    kernel = build_state_kernel(EMA)
    stepped = param.clone()
    kernel.step(stepped, grad, [mine], {"beta": 0.9, "lr": 0.1})
    beta, lr = torch.tensor(0.9), torch.tensor(0.1)  # float32, as the C body's scalars
    decoded = theirs.dequantize()
    decoded = decoded + (1 - beta) * (grad - decoded)
    expected = param - lr * decoded
    theirs.store(decoded)
    assert torch.equal(stepped, expected)
    assert torch.equal(_codes(mine), _codes(theirs))
    assert torch.equal(mine.scales, theirs.scales)
    assert mine.writes == theirs.writes == 1


@pytest.mark.parametrize(
    ("slots", "scalars"),
    [((), ()), (("param",), ()), (("m", "m"), ()), (("m",), ("lr", "lr")), (("m",), ("1x",))],
)
def test_a_source_names_its_bad_slots_and_scalars(slots: Any, scalars: Any) -> None:
    with pytest.raises(ValueError, match=r"StateKernelSource\.(slots|scalars)="):
        StateKernelSource("optiplug-test-bad", "", slots, scalars)


def test_a_body_that_does_not_compile_is_a_native_build_error() -> None:
    broken = StateKernelSource("optiplug-test-broken", "exp_avg = ;", ("exp_avg",), ())
    with pytest.raises(NativeBuildError, match="could not build"):
        build_state_kernel(broken)


def test_a_kernel_refuses_what_it_cannot_step() -> None:
    kernel = build_state_kernel(EMA)
    param, grad = torch.randn(8192), torch.randn(8192)
    int8, int4 = _stored(torch.randn(8192), "int8"), _stored(torch.randn(8192), "int4")
    assert kernel.applies(param, grad, [int8])
    assert not kernel.applies(param.double(), grad.double(), [int8])  # float32 only
    assert not kernel.applies(param, grad, [torch.randn(8192)])  # a plain slot
    assert not kernel.applies(param[:4096], grad[:4096], [int8])  # another shape
    assert not kernel.applies(param, grad, [int8, int4])  # one slot declared
    with pytest.raises(ValueError, match="scalars"):
        kernel.step(param, grad, [int8], {"beta": 0.9})


# ------------------------------------------------------------------ lion's kernel
def _lion_pair(
    precision: str, numel: int, seed: int, **hparams: Any
) -> list[tuple[torch.optim.Optimizer, torch.nn.Parameter]]:
    generator = torch.Generator().manual_seed(seed)
    start, grad = torch.randn(numel, generator=generator), torch.randn(numel, generator=generator)
    pair = []
    for _ in range(2):
        param = torch.nn.Parameter(start.clone())
        param.grad = grad.clone()
        optimizer = optiplug.create(
            "lion", [param], impl="fused", state_precision=precision, **hparams
        )
        optimizer.step()  # creates the state (the C step needs it stored)
        pair.append((optimizer, param))
    return pair


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = StateKernel.step

    def counted(self: StateKernel, *args: Any) -> None:
        calls.append(1)
        original(self, *args)

    monkeypatch.setattr(StateKernel, "step", counted)
    return calls


@settings(max_examples=20, deadline=None)
@given(
    numel=st.one_of(st.integers(1 << 15, 70_000), st.sampled_from([1 << 15, (1 << 15) + 1])),
    precision=st.sampled_from(["int8", "int4", "bf16"]),
    weight_decay=st.sampled_from([0.0, 0.1]),
    mode=st.sampled_from(["decoupled", "cautious"]),
    maximize=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_lion_steps_its_stored_momentum_as_its_fused_kernel_does(
    numel: int, precision: str, weight_decay: float, mode: str, maximize: bool, seed: int
) -> None:
    """Bit for bit against decode, Lion's fused float32 kernel, encode.

    From 2**15 elements on, where ``fused`` runs its C kernel; below, it runs
    the loop's torch ops, which round the momentum differently (next test).
    """
    hparams = {"lr": 1e-3, "weight_decay": weight_decay, "weight_decay_mode": mode,
               "maximize": maximize}  # fmt: skip
    (fast, p_fast), (slow, p_slow) = _lion_pair(precision, numel, seed, **hparams)
    with pytest.MonkeyPatch.context() as patch:
        calls = _counting(patch)
        patch.setattr(slow, "state_kernel", None, raising=False)  # the decode-step-encode path
        for step in range(2):
            grad = torch.randn(numel, generator=torch.Generator().manual_seed(seed + step + 1))
            p_fast.grad, p_slow.grad = grad.clone(), grad.clone()
            fast.step()
            slow.step()
    assert calls == [1, 1]
    assert torch.equal(p_fast, p_slow)
    mine, theirs = fast.state[p_fast]["exp_avg"], slow.state[p_slow]["exp_avg"]
    assert torch.equal(_codes(mine), _codes(theirs)) and torch.equal(mine.scales, theirs.scales)
    assert mine.writes == theirs.writes


def test_lion_below_its_kernel_size_rounds_the_momentum_within_a_code() -> None:
    """Under 2**15 elements ``fused`` steps with the loop's ops (a lerp); the C step as above.

    Both compute the same momentum up to a float32 rounding or two, so a code
    moves by at most one step and a block's maximum by a few ulps; the sign
    update, and so the parameters, agree exactly.
    """
    (fast, p_fast), (slow, p_slow) = _lion_pair("int8", 8192, 5, lr=1e-3)
    slow.state_kernel = None  # type: ignore[misc]  # the decode-step-encode path, this instance
    grad = torch.randn(8192, generator=torch.Generator().manual_seed(6))
    p_fast.grad, p_slow.grad = grad.clone(), grad.clone()
    fast.step()
    slow.step()
    assert torch.equal(p_fast, p_slow)
    mine, theirs = fast.state[p_fast]["exp_avg"], slow.state[p_slow]["exp_avg"]
    assert (_codes(mine).int() - _codes(theirs).int()).abs().max() <= 1
    # each new momentum is m + 0.01 * (g - m) rounded a few times: within a few ulps of its
    # terms, |m| + |g| at most, so each block's maximum moves by no more
    eps = torch.finfo(torch.float32).eps
    terms = (slow.state[p_slow]["exp_avg"].dequantize().abs() + grad.abs()).view(-1, 256)
    assert torch.all((mine.scales - theirs.scales).abs() <= 4 * eps * terms.amax(dim=1))


@pytest.mark.parametrize("impl", ["loop", "foreach"])
def test_lion_keeps_its_kernels_arithmetic_outside_fused(
    monkeypatch: pytest.MonkeyPatch, impl: str
) -> None:
    param = torch.nn.Parameter(torch.randn(8192))
    param.grad = torch.randn(8192)
    optimizer = optiplug.create("lion", [param], impl=impl, state_precision="int8")
    calls = _counting(monkeypatch)
    optimizer.step()
    optimizer.step()
    assert calls == []
    assert optimizer.state[param]["exp_avg"].precision == "int8"


# ------------------------------------------------------------------ a third party's optimizer
@attrs.frozen
class _SignEmaConfig:
    lr: float = 0.01
    beta: float = 0.9
    state_precision: str = state_precision_field()


class SignEma(KernelTableOptimizer):
    """A third party's optimizer on public API only: sign of an EMA of gradients."""

    algorithm = "sign-ema"
    config_class = _SignEmaConfig
    zero_state = ("exp_avg",)
    state_kernel = StateKernelSource(
        name="optiplug-test-sign-ema",
        update=(
            "exp_avg = exp_avg + (1.0f - beta) * (grad - exp_avg);\n"
            "param = param - lr * (float)((exp_avg > 0) - (exp_avg < 0));"
        ),
        slots=("exp_avg",),
        scalars=("lr", "beta"),
    )

    @staticmethod
    def _fused(
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        *,
        lr: float,
        beta: float,
    ) -> None:
        for param, grad, exp_avg in zip(params, grads, exp_avgs, strict=True):
            exp_avg.add_((1 - torch.tensor(beta)) * (grad - exp_avg))
            param.sub_(torch.tensor(lr) * exp_avg.sign())

    implementations: ClassVar[Mapping[str, Any]] = {"fused": _fused}

    def _kernel_options(self, group: dict[str, Any]) -> dict[str, Any]:
        return {"lr": group["lr"], "beta": group["beta"]}

    def _state_kernel_scalars(self, group: dict[str, Any]) -> Mapping[str, float] | None:
        return {"lr": group["lr"], "beta": group["beta"]}


def test_a_third_party_optimizer_gets_the_c_state_step(monkeypatch: pytest.MonkeyPatch) -> None:
    params = [torch.nn.Parameter(torch.randn(64, 128, generator=torch.Generator().manual_seed(i)))
              for i in range(2)]  # fmt: skip
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fast = SignEma(params, impl="fused", state_precision="int8")
    slow = SignEma(twins, impl="fused", state_precision="int8")
    calls = _counting(monkeypatch)
    monkeypatch.setattr(slow, "state_kernel", None, raising=False)
    for step in range(3):
        for p, q in zip(params, twins, strict=True):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + step))
            q.grad = p.grad.clone()
        fast.step()
        slow.step()
    assert len(calls) == 2 * 2  # steps 2 and 3 of both parameters; step 1 created the state
    for p, q in zip(params, twins, strict=True):
        assert torch.equal(p, q)
        assert torch.equal(_codes(fast.state[p]["exp_avg"]), _codes(slow.state[q]["exp_avg"]))


@pytest.mark.parametrize("name", ["lion", "sgd"])
def test_a_group_switched_to_another_precision_is_converted_not_stepped_in_the_old(
    name: str,
) -> None:
    """The C step takes slots stored in the group's precision only; others go the decoding way."""
    param = torch.nn.Parameter(torch.randn(8192))
    param.grad = torch.randn(8192)
    hparams = {"momentum": 0.9} if name == "sgd" else {}
    optimizer = optiplug.create(name, [param], impl="fused", state_precision="int8", **hparams)
    optimizer.step()
    optimizer.param_groups[0]["state_precision"] = "int4"
    optimizer.step()
    slot = next(iter(optimizer.state[param].values()))
    assert isinstance(slot, QuantizedState) and slot.precision == "int4"
    optimizer.step()  # now stored in the group's precision: the C step keeps it there
    assert next(iter(optimizer.state[param].values())).precision == "int4"


# ------------------------------------------------------------------ the pipeline of docs/plugins.md
def _documented_class() -> type[KernelTableOptimizer]:
    """``CautiousSignEma`` exactly as docs/plugins.md composes it from ``optiplug.base`` pieces."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "plugins.md").read_text()
    block = next(b for b in text.split("```python\n") if "class CautiousSignEma" in b)
    code = block.split("```", 1)[0].split("param = torch.nn.Parameter", 1)[0]
    namespace: dict[str, Any] = {"__name__": "documented"}
    exec(compile(code, "docs/plugins.md", "exec"), namespace)
    return namespace["CautiousSignEma"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["cautious", "decoupled"])
def test_a_third_party_pipeline_gets_cautious_decay_and_the_int8_c_step(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Bit for bit against the decoding path of the same class; param_groups never change."""
    cls = _documented_class()
    assert state_kernel_or_none(cls.state_kernel, wait=True) is not None  # built before stepping
    start = torch.randn(64, 128, generator=torch.Generator().manual_seed(3)) * 10
    fast_p, slow_p = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    hparams = {"weight_decay": 0.1, "weight_decay_mode": mode, "state_precision": "int8"}
    fast, slow = cls([fast_p], **hparams), cls([slow_p], **hparams)
    monkeypatch.setattr(slow, "state_kernel", None, raising=False)  # the decoding path
    calls = _counting(monkeypatch)
    groups = [fast.param_groups[0], slow.param_groups[0]]
    seen: list[tuple[float, float]] = []  # (the kernel's weight decay, the optimizer's meanwhile)
    options = cls._kernel_options

    def peeking(self: Any, group: dict[str, Any]) -> dict[str, Any]:
        seen.append((group["weight_decay"], slow.param_groups[0]["weight_decay"]))
        return options(self, group)  # type: ignore[no-any-return]

    monkeypatch.setattr(cls, "_kernel_options", peeking)
    for step in range(3):
        grad = torch.randn(64, 128, generator=torch.Generator().manual_seed(20 + step))
        fast_p.grad, slow_p.grad = grad.clone(), grad.clone()
        fast.step()
        slow.step()
    assert len(calls) == 2  # steps 2 and 3 of the fast one; step 1 created the state
    assert torch.equal(fast_p, slow_p)
    assert not torch.equal(fast_p, start)
    mine, theirs = fast.state[fast_p]["exp_avg"], slow.state[slow_p]["exp_avg"]
    assert mine.precision == "int8" and torch.equal(_codes(mine), _codes(theirs))
    assert [fast.param_groups[0], slow.param_groups[0]] == groups
    assert all(
        g is h for g, h in zip(groups, [fast.param_groups[0], slow.param_groups[0]], strict=True)
    )
    assert fast.param_groups[0]["weight_decay"] == 0.1
    decay = 0.0 if mode == "cautious" else 0.1
    assert seen and set(seen) == {(decay, 0.1)}, seen


def test_cautious_decay_differs_from_decoupled_where_signs_disagree() -> None:
    """The rule is applied, not a no-op: the two modes end apart on the same inputs."""
    cls = _documented_class()
    ends = []
    for mode in ("cautious", "decoupled"):
        param = torch.nn.Parameter(torch.randn(64, 128, generator=torch.Generator().manual_seed(4)))
        optimizer = cls([param], weight_decay=0.5, weight_decay_mode=mode, state_precision="int8")
        for step in range(2):
            param.grad = torch.randn(64, 128, generator=torch.Generator().manual_seed(30 + step))
            optimizer.step()
        ends.append(param.detach().clone())
    assert not torch.equal(ends[0], ends[1])

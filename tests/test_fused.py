"""optiplug-fused: the ``triton`` implementations of adamw, adam, sgd and lion.

The kernels run on the CPU through triton's interpreter: the ``device``
fixture sets ``TRITON_INTERPRET=1`` for CPU cases only (the variable is read
by the plugin on every call, and the plugin builds interpreted kernels for
CPU tensors and compiled ones for CUDA tensors whatever it was when triton
was imported), and restores it afterwards, so no other test sees it. The
same tests run on CUDA when a GPU is present.

Tolerances (``bound`` below). Gradients are drawn in advance and do not
depend on the parameters, so both implementations feed the same inputs to
the same recurrences (m, v, momentum). Per step, an element may then differ
by:

* one unit in the last place of the parameter's dtype at the largest
  magnitude seen, ``ulp(P)``: the two sides round ``p - update`` separately,
  and a difference below rounding in ``update`` can flip that rounding (for
  bf16/fp16 parameters this is the bf16/fp16 ulp: fp32 results within
  rounding of each other may straddle a bf16 rounding boundary);
* ``lr * R * (4 * n + 8) * 2**-24``: the update's own fp32 difference, where
  ``R`` bounds ``|update| / lr`` and the relative error of the state grows by
  at most 2 roundings per recurrence step (``4 n``) plus 8 for the ops of
  one update (bias corrections through ``exp(step * log(beta))``, divisions,
  possible FMA contraction on a GPU).

Over ``n`` steps the bound is the sum, times ``(1 + lr * wd * 2) ** n`` for
the weight-decay feedback of a parameter difference into the next update.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

import optiplug
import optiplug_fused
from optiplug.errors import (
    HyperparameterError,
    OptimizerUnavailableError,
    OptiplugError,
    StateDictError,
)
from optiplug_fused import availability
from optiplug_fused.plugin import IMPLEMENTATIONS

HAS_CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(
    not availability.triton_installed(), reason="triton is not installed"
)
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]

STEPS = 20
EPS32 = 2.0**-24
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (3,), (1023,), (4097,), (8, 256))
"""0-d, one element, odd sizes one under and one over a 4096-element block (these go to the
unaligned bucket), and a size that is a multiple of 8 (the aligned bucket, vector hints)."""

MANTISSA = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Single-threaded: tiny tensors, and a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """The device under test: CPU through triton's interpreter, or CUDA compiled."""
    if not availability.triton_installed():
        pytest.skip("triton is not installed")
    if request.param == "cpu":
        monkeypatch.setenv(availability.INTERPRET_VARIABLE, "1")
    else:
        monkeypatch.delenv(availability.INTERPRET_VARIABLE, raising=False)
    return torch.device(request.param)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tests: triton's interpreter."""
    if not availability.triton_installed():
        pytest.skip("triton is not installed")
    monkeypatch.setenv(availability.INTERPRET_VARIABLE, "1")


def ulp(magnitude: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` values at ``magnitude`` (normal range)."""
    exponent = math.floor(math.log2(max(magnitude, 2.0**-14)))
    return 2.0 ** (exponent - MANTISSA[dtype])


def bound(
    steps: int, magnitude: float, dtype: torch.dtype, lr: float, ratio: float, wd: float
) -> float:
    """The tolerance derived in the module docstring."""
    per_step = ulp(magnitude, dtype) + lr * ratio * (4 * steps + 8) * EPS32
    return steps * per_step * (1 + 2 * lr * wd) ** steps


# ------------------------------------------------------------------ helpers
def starts(shapes: Sequence[tuple[int, ...]], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def gradient_steps(
    shapes: Sequence[tuple[int, ...]], steps: int, seed: int = 1
) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(steps)]


def run(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    values: Sequence[torch.Tensor],
    grads: Sequence[Sequence[torch.Tensor]],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    storage: torch.dtype | None = None,
) -> tuple[list[torch.Tensor], torch.optim.Optimizer, float]:
    """Train from ``values`` with ``grads``; returns final params, optimizer, max |p| seen.

    ``storage`` emulates low-precision parameters on an fp32 reference: the
    values and gradients are rounded to it, and the parameters after each step.
    """
    round_to = storage or dtype
    params = [
        torch.nn.Parameter(v.to(round_to).to(device=device, dtype=dtype).clone()) for v in values
    ]
    optimizer = make(params)
    largest = max(float(p.detach().abs().max()) for p in params)
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = grad.to(round_to).to(device=device, dtype=dtype)
        optimizer.step()
        if storage is not None:
            with torch.no_grad():
                for param in params:
                    param.copy_(param.to(storage).to(dtype))
        largest = max(largest, *(float(p.detach().abs().max()) for p in params))
    return [p.detach().float().cpu() for p in params], optimizer, largest


def max_difference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True) if x.numel())


def triton_maker(name: str, **hparams: Any) -> Callable[[list[torch.nn.Parameter]], Any]:
    return lambda params: optiplug.create(name, params, impl="triton", **hparams)


def reference_maker(name: str, **hparams: Any) -> Callable[[list[torch.nn.Parameter]], Any]:
    """torch's single-tensor optimizer, or optiplug-lion's loop implementation."""
    if name == "lion":
        return lambda params: optiplug.create("lion", params, impl="loop", **hparams)
    torch_class = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    return lambda params: torch_class[name](params, foreach=False, **hparams)


def update_ratio(name: str, hparams: dict[str, Any], largest_grad: float, largest: float) -> float:
    """``R``: a bound on ``|update| / lr`` given the largest |g| and |p| of the run."""
    wd = hparams.get("weight_decay", 0.0)
    if name == "lion":
        return 1.0 + wd * largest  # |sign| <= 1, plus the decoupled decay
    if name == "sgd":
        momentum = hparams.get("momentum", 0.0)
        # L2 decay enters the gradient; momentum sums it with weights <= 1 / (1 - momentum)
        return (largest_grad + wd * largest) * (1 + momentum) / (1 - momentum)
    beta1, beta2 = hparams.get("betas", (0.9, 0.999))
    # Kingma & Ba: |m_hat| / sqrt(v_hat) <= (1 - beta1) / sqrt(1 - beta2) (and >= 1 holds too),
    # plus AdamW's decoupled decay
    return max(1.0, (1 - beta1) / math.sqrt(1 - beta2)) + wd * largest


# ------------------------------------------------------------------ parity
PARITY_CASES: list[tuple[str, dict[str, Any], torch.dtype]] = [
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}, torch.float32),
    ("adamw", {"lr": 1e-2, "amsgrad": True, "maximize": True}, torch.float32),
    ("adamw", {"lr": 1e-2, "betas": (0.3, 0.9), "eps": 1e-6}, torch.float32),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}, torch.bfloat16),
    ("adamw", {"lr": 1e-2, "amsgrad": True}, torch.float16),
    ("adam", {"lr": 1e-2}, torch.float32),
    ("adam", {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True, "maximize": True}, torch.float32),
    ("adam", {"lr": 1e-2, "weight_decay": 0.1}, torch.bfloat16),
    ("sgd", {"lr": 1e-2}, torch.float32),
    ("sgd", {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}, torch.float32),
    ("sgd", {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "maximize": True}, torch.float32),
    ("sgd", {"lr": 1e-2, "momentum": 0.5, "dampening": 0.3}, torch.float32),
    ("sgd", {"lr": 1e-2, "momentum": 0.9, "nesterov": True}, torch.bfloat16),
    ("sgd", {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}, torch.float16),
    ("lion", {"lr": 1e-2}, torch.float32),
    ("lion", {"lr": 1e-2, "weight_decay": 0.5, "maximize": True}, torch.float32),
    ("lion", {"lr": 1e-2, "betas": (0.95, 0.98)}, torch.bfloat16),
]


def _case_id(case: tuple[str, dict[str, Any], torch.dtype]) -> str:
    name, hparams, dtype = case
    flags = "-".join(f"{k}={v}" for k, v in hparams.items() if k != "lr")
    return f"{name}-{str(dtype).removeprefix('torch.')}-{flags or 'default'}"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("case", PARITY_CASES, ids=[_case_id(c) for c in PARITY_CASES])
def test_parity_with_reference(
    device: torch.device, case: tuple[str, dict[str, Any], torch.dtype]
) -> None:
    name, hparams, dtype = case
    values = starts(SHAPES)
    grads = gradient_steps(SHAPES, STEPS)
    ours, optimizer, largest = run(
        triton_maker(name, **hparams), values, grads, dtype=dtype, device=device
    )
    storage = None if dtype == torch.float32 else dtype
    expected, _, _ = run(reference_maker(name, **hparams), values, grads, storage=storage)
    assert optimizer.impl == "triton"
    largest_grad = max(float(g.abs().max()) for step in grads for g in step)
    ratio = update_ratio(name, hparams, largest_grad, largest)
    tolerance = bound(STEPS, largest, dtype, hparams["lr"], ratio, hparams.get("weight_decay", 0.0))
    if name == "lion" and device.type == "cuda":
        # an FMA may flip sign(c) where |c| is within one rounding of 0: one flip costs 2 lr
        tolerance += 2 * hparams["lr"]
    assert max_difference(ours, expected) <= tolerance


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_many_tensors_reuse_the_table(device: torch.device) -> None:
    """24 tensors of mixed sizes in two param groups; kept gradients reuse the table.

    Each group takes one launch per alignment class (at most two buckets of
    one device and dtype), and a step with the same gradient tensors reuses
    the group's table object.
    """
    shapes = [(i % 7 + 1, 3) if i % 2 else (i * 37 % 129,) for i in range(24)]
    values = starts(shapes, seed=3)
    grads = gradient_steps(shapes, 6, seed=4)
    settings = [{"weight_decay": 0.1}, {"weight_decay": 0.0, "lr": 2e-2}]

    def groups(params: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
        return [{"params": params[:12], **settings[0]}, {"params": params[12:], **settings[1]}]

    params = [torch.nn.Parameter(v.to(device)) for v in values]
    for param, grad in zip(params, grads[0], strict=True):
        param.grad = grad.to(device)
    optimizer = optiplug.create("adamw", groups(params), impl="triton", lr=1e-2)
    reference = [torch.nn.Parameter(v.clone()) for v in values]
    torch_opt = torch.optim.AdamW(groups(reference), lr=1e-2, foreach=False)
    plans = []
    for step_grads in grads:
        for param, ref, grad in zip(params, reference, step_grads, strict=True):
            param.grad.copy_(grad)  # same gradient tensors: the table is reused
            ref.grad = grad.clone()
        optimizer.step()
        torch_opt.step()
        plans.append((optimizer._plans[0], optimizer._plans[1]))
    assert all(plan[0] is plans[0][0] and plan[1] is plans[0][1] for plan in plans)
    for plan in plans[0]:
        assert len(plan.buckets) <= 2 and {b.aligned for b in plan.buckets} == {True, False}
        assert sum(bucket.count for bucket in plan.buckets) == 12
    # |p| over the run stays within steps * lr * R <= 6 * 0.02 * 4 of its final value (R < 4 for
    # |p| < 8: 3.16 + 0.1 |p|), so the final largest |p| + 0.5 bounds it
    largest = max(float(p.detach().abs().max()) for p in reference if p.numel()) + 0.5
    ratio = update_ratio("adamw", settings[0], 0.0, largest)
    tolerance = bound(len(grads), largest, torch.float32, 2e-2, ratio, 0.1)
    ours = [p.detach().cpu() for p in params]
    assert max_difference(ours, [p.detach() for p in reference]) <= tolerance


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_new_gradient_tensors_are_picked_up(device: torch.device) -> None:
    """Gradients set to None and recreated (torch's default zero_grad) are followed.

    New gradient tensors of the same parameters only repoint the table's
    gradient column; a parameter losing its gradient rebuilds the table and
    is skipped, as torch skips it.
    """
    first = torch.nn.Parameter(torch.ones(5, device=device))
    second = torch.nn.Parameter(torch.ones(3, device=device))
    optimizer = optiplug.create("sgd", [first, second], impl="triton", lr=0.5)
    plans = []
    for value in (1.0, 2.0, -4.0):
        optimizer.zero_grad()
        first.grad = torch.full((5,), value, device=device)
        second.grad = torch.full((3,), value, device=device)
        optimizer.step()
        plans.append(optimizer._plans[0])
    assert plans[0] is plans[1] is plans[2]
    optimizer.zero_grad()
    first.grad = torch.full((5,), 1.0, device=device)
    optimizer.step()
    assert optimizer._plans[0] is not plans[0]
    # 1 - 0.5 * (1 + 2 - 4) = 1.5, then 1.5 - 0.5 * 1 = 1.0 (exact in fp32); second skipped
    assert torch.equal(first.detach().cpu(), torch.full((5,), 1.0))
    assert torch.equal(second.detach().cpu(), torch.full((3,), 1.5))


# ------------------------------------------------------------------ refused steps
def _sparse_gradient(params: list[torch.nn.Parameter]) -> None:
    params[-1].grad = params[-1].grad.to_sparse()  # type: ignore[union-attr]


def _float64_parameter(params: list[torch.nn.Parameter]) -> None:
    params[-1].data = params[-1].data.double()
    params[-1].grad = params[-1].grad.double()  # type: ignore[union-attr]


REFUSALS: dict[str, tuple[Callable[[list[torch.nn.Parameter]], None], bool, str]] = {
    "sparse-gradient": (_sparse_gradient, False, "gradient is sparse"),
    "sparse-gradient-second-group": (_sparse_gradient, True, "gradient is sparse"),
    "float64-parameter": (_float64_parameter, False, "float64"),
}
"""failure -> (how the last of two parameters is spoiled, one group per parameter, message)."""
REFUSAL_CASES = [(name, failure) for name in sorted(IMPLEMENTATIONS) for failure in REFUSALS]
REFUSAL_SHAPES: tuple[tuple[int, ...], ...] = ((4,), (3,))


def _refusal_optimizer(
    name: str, params: list[torch.nn.Parameter], split: bool
) -> torch.optim.Optimizer:
    hparams: dict[str, Any] = {"lr": 0.1, "momentum": 0.9} if name == "sgd" else {"lr": 0.1}
    groups: list[Any] = [{"params": [p]} for p in params] if split else [{"params": params}]
    return optiplug.create(name, groups, impl="triton", **hparams)


def _clean_steps(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    grads: Sequence[Sequence[torch.Tensor]],
) -> None:
    for step_grads in grads:
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = grad.clone()
        optimizer.step()


@pytest.mark.parametrize(("name", "failure"), REFUSAL_CASES, ids=lambda v: str(v))
def test_refused_first_step_leaves_nothing_behind(interpret: None, name: str, failure: str) -> None:
    """A step refused for one tensor creates no state and moves no parameter, in any group.

    The following clean steps then equal, bit for bit, a run that never failed
    (a half-created SGD momentum buffer would start at zero instead of at the
    first gradient).
    """
    spoil, split, message = REFUSALS[failure]
    values = starts(REFUSAL_SHAPES, seed=7)
    grads = gradient_steps(REFUSAL_SHAPES, 3, seed=8)
    params = [torch.nn.Parameter(v.clone()) for v in values]
    optimizer = _refusal_optimizer(name, params, split)
    for param, grad in zip(params, grads[0], strict=True):
        param.grad = grad.clone()
    spoil(params)
    with pytest.raises(HyperparameterError, match=message) as caught:
        optimizer.step()
    where = "parameter 0 of param group 1" if split else "parameter 1 of param group 0"
    assert where in str(caught.value) and caught.value.algorithm == name
    assert not optimizer.state and optimizer.state_dict()["state"] == {}
    params[-1].data = params[-1].data.float()
    assert all(torch.equal(p.detach(), v) for p, v in zip(params, values, strict=True))
    _clean_steps(optimizer, params, grads)
    clean = [torch.nn.Parameter(v.clone()) for v in values]
    _clean_steps(_refusal_optimizer(name, clean, split), clean, grads)
    assert all(torch.equal(p.detach(), c.detach()) for p, c in zip(params, clean, strict=True))


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_refused_later_step_changes_nothing(interpret: None, name: str) -> None:
    """After clean steps, a refused step leaves the state and the parameters as they were."""
    grads = gradient_steps(REFUSAL_SHAPES, 2, seed=9)
    params = [torch.nn.Parameter(v.clone()) for v in starts(REFUSAL_SHAPES, seed=10)]
    optimizer = _refusal_optimizer(name, params, split=True)
    _clean_steps(optimizer, params, grads)
    before = copy.deepcopy(optimizer.state_dict())
    values = [p.detach().clone() for p in params]
    for param, grad in zip(params, grads[0], strict=True):
        param.grad = grad.clone()
    _sparse_gradient(params)
    with pytest.raises(HyperparameterError, match="gradient is sparse"):
        optimizer.step()
    after = optimizer.state_dict()["state"]
    assert after.keys() == before["state"].keys()
    for key, slots in before["state"].items():
        assert all(torch.equal(after[key][slot], value) for slot, value in slots.items())
    assert all(torch.equal(p.detach(), v) for p, v in zip(params, values, strict=True))


# ------------------------------------------------------------------ state round trips
ROUND_TRIPS: list[tuple[str, dict[str, Any], str]] = [
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}, "loop"),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}, "fused"),
    ("adam", {"lr": 1e-2, "weight_decay": 0.1}, "foreach"),
    ("sgd", {"lr": 1e-2, "momentum": 0.9, "nesterov": True}, "loop"),
    ("lion", {"lr": 1e-2, "weight_decay": 0.1}, "foreach"),
]


@pytest.mark.parametrize("case", ROUND_TRIPS, ids=lambda c: f"{c[0]}-{c[2]}")
@pytest.mark.parametrize("direction", ["to-triton", "from-triton"])
def test_state_round_trip(
    interpret: None, case: tuple[str, dict[str, Any], str], direction: str
) -> None:
    """k steps with one implementation, state_dict, load into the other, k more: as uninterrupted."""
    name, hparams, other = case
    first, second = ("triton", other) if direction == "from-triton" else (other, "triton")
    shapes = ((3,), (1023,), (4, 5))
    values = starts(shapes, seed=5)
    grads = gradient_steps(shapes, 6, seed=6)
    whole = [torch.nn.Parameter(v.clone()) for v in values]
    uninterrupted = optiplug.create(name, whole, impl=first, **hparams)
    part = [torch.nn.Parameter(v.clone()) for v in values]
    before = optiplug.create(name, part, impl=first, **hparams)
    for index, step_grads in enumerate(grads):
        for w, g in zip(whole, step_grads, strict=True):
            w.grad = g.clone()
        uninterrupted.step()
        if index < 3:
            for p, g in zip(part, step_grads, strict=True):
                p.grad = g.clone()
            before.step()
    saved = before.state_dict()
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in part]
    after = optiplug.create(name, resumed_params, impl=second, **hparams)
    after.load_state_dict(saved)
    assert after.impl == second
    assert after.state_dict()["state"].keys() == saved["state"].keys()
    for key, slots in saved["state"].items():
        assert set(after.state_dict()["state"][key]) == set(slots)
    for step_grads in grads[3:]:
        for p, g in zip(resumed_params, step_grads, strict=True):
            p.grad = g.clone()
        after.step()
    largest = max(float(p.detach().abs().max()) for p in whole)
    largest_grad = max(float(g.abs().max()) for step in grads for g in step)
    ratio = update_ratio(name, hparams, largest_grad, largest)
    tolerance = bound(len(grads), largest, torch.float32, 1e-2, ratio, 0.1)
    assert (
        max_difference([p.detach() for p in resumed_params], [w.detach() for w in whole])
        <= tolerance
    )


def test_low_precision_state_is_fp32_and_reloads_exactly(interpret: None) -> None:
    """bf16 parameters keep fp32 state; their own state dict reloads without rounding."""
    param = torch.nn.Parameter(torch.randn(7).to(torch.bfloat16))
    param.grad = torch.randn(7).to(torch.bfloat16)
    optimizer = optiplug.create("adamw", [param], impl="triton", lr=1e-2)
    optimizer.step()
    state = optimizer.state[param]
    assert state["exp_avg"].dtype == torch.float32
    assert state["step"].dtype == torch.float32 and state["step"].ndim == 0
    twin = optiplug.create("adamw", [torch.nn.Parameter(param.detach().clone())], impl="triton")
    twin.load_state_dict(optimizer.state_dict())
    loaded = next(iter(twin.state.values()))
    assert torch.equal(loaded["exp_avg_sq"], state["exp_avg_sq"])
    assert float(loaded["step"]) == 1.0


def test_low_precision_state_reloads_by_name(interpret: None) -> None:
    """Named parameters in another order: each fp32 state goes to the parameter of its name."""
    a = torch.nn.Parameter(torch.randn(5).to(torch.bfloat16))
    b = torch.nn.Parameter(torch.randn(2, 3).to(torch.float16))
    for param in (a, b):
        param.grad = torch.randn(param.shape).to(param.dtype)
    optimizer = optiplug.create("lion", [("a", a), ("b", b)], impl="triton", lr=1e-2)
    optimizer.step()
    twin_a, twin_b = (torch.nn.Parameter(p.detach().clone()) for p in (a, b))
    twin = optiplug.create("lion", [("b", twin_b), ("a", twin_a)], impl="triton", lr=1e-2)
    twin.load_state_dict(optimizer.state_dict())
    for original, copied in ((a, twin_a), (b, twin_b)):
        assert twin.state[copied]["exp_avg"].dtype == torch.float32
        assert torch.equal(twin.state[copied]["exp_avg"], optimizer.state[original]["exp_avg"])


def test_torch_bf16_state_loads_into_triton(interpret: None) -> None:
    """torch keeps bf16 state for bf16 parameters; the triton implementation widens it to fp32."""
    param = torch.nn.Parameter(torch.randn(9).to(torch.bfloat16))
    param.grad = torch.randn(9).to(torch.bfloat16)
    source = optiplug.create("adam", [param], impl="loop", lr=1e-2)
    source.step()
    target = optiplug.create("adam", [torch.nn.Parameter(param.detach().clone())], impl="triton")
    target.load_state_dict(source.state_dict())
    loaded = next(iter(target.state.values()))
    assert loaded["exp_avg"].dtype == torch.float32
    assert torch.equal(loaded["exp_avg"], source.state[param]["exp_avg"].float())


def test_no_grad_step_deepcopy_and_pickle(interpret: None) -> None:
    """The conformance checks' contract, on float32 (the conformance suite uses float64)."""
    params = [torch.nn.Parameter(torch.randn(4, 4))]
    optimizer = optiplug.create("lion", params, impl="triton", lr=1e-2)
    optimizer.step()
    assert not optimizer.state
    params[0].grad = torch.randn(4, 4)
    optimizer.step()
    for duplicate in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert duplicate.impl == "triton"
        assert torch.equal(
            duplicate.state_dict()["state"][0]["exp_avg"], optimizer.state[params[0]]["exp_avg"]
        )
        duplicate_param = duplicate.param_groups[0]["params"][0]
        duplicate_param.grad = torch.ones(4, 4)
        duplicate.step()  # its own table, on its own tensors
        assert not torch.equal(duplicate_param, params[0])


def test_quadratic_converges(interpret: None) -> None:
    target = torch.linspace(-1, 1, 16).reshape(4, 4)
    for name, lr in (("adamw", 0.05), ("adam", 0.05), ("sgd", 0.05), ("lion", 0.05)):
        weight = torch.nn.Parameter(torch.zeros(4, 4))
        optimizer = optiplug.create(name, [weight], impl="triton", lr=lr)
        initial = float(((weight.detach() - target) ** 2).sum())
        for _ in range(40):
            optimizer.zero_grad()
            ((weight - target) ** 2).sum().backward()
            optimizer.step()
        assert float(((weight.detach() - target) ** 2).sum()) < 0.1 * initial, name


# ------------------------------------------------------------------ lr/step on device, AMP
@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_tensor_lr_equals_float_lr(device: torch.device, name: str) -> None:
    """lr = 2**-7 and wd = 0.5 make 1 - lr*wd and lr itself exact in fp32: results are identical."""
    hparams = {"weight_decay": 0.5} if name != "sgd" else {"momentum": 0.9}
    values = starts(((33,),), seed=7)
    grads = gradient_steps(((33,),), 3, seed=8)
    floats, _, _ = run(triton_maker(name, lr=2.0**-7, **hparams), values, grads, device=device)
    lr = torch.tensor(2.0**-7, device=device)
    tensors, optimizer, _ = run(triton_maker(name, lr=lr, **hparams), values, grads, device=device)
    assert torch.is_tensor(optimizer.param_groups[0]["lr"])
    assert all(torch.equal(a, b) for a, b in zip(floats, tensors, strict=True))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_grad_scale_and_found_inf(device: torch.device, name: str) -> None:
    """grad_scale divides the gradients (by 1024: exact); found_inf skips everything."""
    hparams: dict[str, Any] = {"lr": 1e-2}
    if name == "sgd":
        hparams["momentum"] = 0.9
    values = starts(((5,), (70,)), seed=9)
    grads = gradient_steps(((5,), (70,)), 3, seed=10)
    plain, _, _ = run(triton_maker(name, **hparams), values, grads, device=device)

    params = [torch.nn.Parameter(v.to(device)) for v in values]
    optimizer = optiplug.create(name, params, impl="triton", **hparams)
    scale = torch.tensor(1024.0, device=device)
    skip, go = torch.ones(1, device=device), torch.zeros(1, device=device)
    for index, step_grads in enumerate(grads):
        if index == 0:  # a skipped first step: no state may change, SGD's buffer stays "new"
            for param in params:
                param.grad = torch.full_like(param, float("inf"))
            snapshot = [p.detach().clone() for p in params]
            optimizer.step(grad_scale=scale, found_inf=skip)
            assert all(torch.equal(p, s) for p, s in zip(params, snapshot, strict=True))
            for state in optimizer.state.values():
                for value in state.values():
                    assert not torch.is_tensor(value) or not value.abs().sum()
        for param, grad in zip(params, step_grads, strict=True):
            param.grad = (grad * 1024).to(device)
        optimizer.step(grad_scale=scale, found_inf=go)
    assert all(torch.equal(a, p.detach().cpu()) for a, p in zip(plain, params, strict=True))


def test_grad_scaler_skips_non_finite_steps(interpret: None) -> None:
    """torch.amp.GradScaler hands grad_scale/found_inf to the optimizer and skips inf steps."""
    weight = torch.nn.Parameter(torch.ones(8))
    optimizer = optiplug.create("adamw", [weight], impl="triton", lr=1e-2)
    assert optimizer._step_supports_amp_scaling
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaler.scale((weight * torch.full((8,), float("inf"))).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(weight.detach(), torch.ones(8))
    assert float(optimizer.state[weight]["step"]) == 0.0
    optimizer.zero_grad()
    scaler.scale((weight * 3.0).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    # first Adam step: m_hat = g, sqrt(v_hat) = |g|, so p = (1 - lr * wd) - lr * g / (|g| + eps)
    # with wd = 1e-2 (adamw's default); fp32 rounds p twice and the quotient once: <= 4 ulp(1)
    expected = (1 - 1e-2 * 1e-2) - 1e-2 * 3.0 / (3.0 + 1e-8)
    assert torch.allclose(weight.detach(), torch.full((8,), expected), rtol=0, atol=4 * EPS32)
    assert float(optimizer.state[weight]["step"]) == 1.0


@needs_triton
@needs_cuda
def test_cuda_graph_replay_equals_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured step with a device lr replays exactly as eager steps."""
    monkeypatch.delenv(availability.INTERPRET_VARIABLE, raising=False)
    shapes = ((3,), (4097,), (64, 65))
    values = starts(shapes, seed=11)
    grads = gradient_steps(shapes, 6, seed=12)

    def make(params: list[torch.nn.Parameter]) -> Any:
        lr = torch.tensor(1e-2, device="cuda")
        return optiplug.create("adamw", params, impl="triton", lr=lr, weight_decay=0.1)

    eager, _, _ = run(make, values, grads, device="cuda")
    params = [torch.nn.Parameter(v.cuda()) for v in values]
    optimizer = make(params)
    static = [g.cuda() for g in grads[0]]
    for param, grad in zip(params, static, strict=True):
        param.grad = grad
    optimizer.step()  # warm-up: compile, build the table and the state
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        optimizer.step()
    torch.cuda.current_stream().wait_stream(stream)
    for step_grads in grads[1:]:
        for grad, new in zip(static, step_grads, strict=True):
            grad.copy_(new)
        graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, p.detach().cpu()) for a, p in zip(eager, params, strict=True))


# ------------------------------------------------------------------ GPU compilation without a GPU
def _signature(source: Callable[..., None]) -> dict[str, str]:
    """Triton types of a kernel's arguments, from their names (see optiplug_fused.kernels)."""
    import inspect

    types = {}
    for name, parameter in inspect.signature(source).parameters.items():
        if parameter.annotation in ("tl.constexpr", "constexpr") or name.isupper():
            types[name] = "constexpr"
        elif name in ("blocks", "rows", "rng_ptr"):
            types[name] = "*i64"
        elif name.endswith("_ptr"):
            types[name] = "*fp32"
        elif name in ("seed", "count"):
            types[name] = "i32"
        else:
            types[name] = "fp32"
    return types


@needs_triton
@pytest.mark.parametrize(
    "name, constants, element_sizes",
    [
        ("adam", {"P_DTYPE": "fp32", "AMSGRAD": True, "DECOUPLED": True, "HAS_INF": True}, [4] * 5),
        ("adam", {"P_DTYPE": "bf16", "ROUND_BF16": True, "STOCHASTIC": True}, [2, 2, 4, 4]),
        ("sgd", {"P_DTYPE": "fp32", "HAS_MOMENTUM": True, "HAS_SCALE": True}, [4] * 3),
        ("lion", {"P_DTYPE": "fp16", "MAXIMIZE": True, "LR_TENSOR": True}, [2, 2, 4]),
        ("lion", {"P_DTYPE": "bf16", "ROUND_BF16": True, "LR_TENSOR": True}, [2, 2, 4]),
    ],
)
def test_kernels_compile_for_hopper_with_vector_access(
    name: str, constants: dict[str, Any], element_sizes: list[int]
) -> None:
    """The CUDA kernels compile to sm_90 PTX here, GPU or not, with 16-byte vector loads.

    This also runs after interpreted launches in the same process, which is
    what catches a kernel calling one of triton's ``@jit`` library functions
    (``tl.zeros_like``...): those are interpreted or compiled depending on
    ``TRITON_INTERPRET`` when triton was imported, so the kernels use builtins only.

    With the default launch configuration one thread holds
    ``BLOCK / (32 * NUM_WARPS)`` elements of each tensor read (``element_sizes``:
    bytes per element), loaded as 16-byte vectors when the bucket is aligned.
    """
    import re

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from optiplug_fused import kernels

    source = kernels._SOURCES[name]
    signature = _signature(source)
    flags = {k: False for k, v in signature.items() if v == "constexpr"}
    values = {**flags, "BLOCK": kernels.BLOCK, "ALIGNED": True, "HAS_WD": True}
    values.update(constants)
    values["P_DTYPE"] = {"fp32": tl.float32, "bf16": tl.bfloat16, "fp16": tl.float16}[
        values["P_DTYPE"]
    ]
    aligned = [["tt.divisibility", 16]]
    compiled = triton.compile(
        ASTSource(
            triton.JITFunction(source),
            signature,
            {k: v for k, v in values.items() if k in signature},
            {(0,): aligned, (1,): aligned},
        ),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": kernels.NUM_WARPS, "enable_fp_fusion": True},
    )
    ptx = compiled.asm["ptx"]
    per_thread = kernels.BLOCK // (32 * kernels.NUM_WARPS)
    vector_loads = sum(per_thread * size // 16 for size in element_sizes)
    assert len(re.findall(r"ld\.global\.v4\.b32", ptx)) == vector_loads
    # IEEE divisions and square roots, as torch's kernels (triton's "/" would be div.full)
    assert not re.search(r"(div|sqrt)\.(approx|full)", ptx)


# ------------------------------------------------------------------ stochastic rounding
@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_bf16_results_round_to_nearest_even(device: torch.device) -> None:
    """SGD with lr 1 on p = 1 gives exact fp32 results at and around bf16 rounding ties.

    bf16 has 7 mantissa bits: ulp(1) = 2**-7. 1 + 2**-8 is a tie (to even: 1),
    1 + 3 * 2**-8 a tie (to even: 1 + 2**-6), 1 + 2**-8 +- 2**-12 are just
    above and below it; inf stays inf and NaN stays NaN. The expected values
    are torch's own fp32 -> bf16 conversion (round to nearest even).
    """
    steps = [2.0**-8, 3 * 2.0**-8, 2.0**-8 + 2.0**-12, 2.0**-8 - 2.0**-12, -(2.0**-8), 0.0]
    start = torch.tensor([1.0] * len(steps) + [float("inf"), 1.0])
    grads = torch.tensor([-x for x in steps] + [0.0, float("nan")])
    param = torch.nn.Parameter(start.to(device=device, dtype=torch.bfloat16))
    param.grad = grads.to(device=device, dtype=torch.bfloat16)
    optiplug.create("sgd", [param], impl="triton", lr=1.0).step()
    expected = (start - grads).to(torch.bfloat16)
    assert torch.equal(param.detach().cpu()[:-1], expected[:-1])
    assert torch.isnan(param.detach().cpu()[-1])


def test_stochastic_rounding_is_unbiased(interpret: None) -> None:
    """Mean of bf16 results over many elements and seeds matches the fp32 update.

    p = 1 and SGD's fp32 result x = fl32(1 - lr * g) with lr * g = 1e-3 lies
    between the bf16 neighbours lo = 1 - 2**-8 and hi = 1: each rounding is
    hi with probability f = (x - lo) / 2**-8 (~0.744) when unbiased, so the
    mean of N roundings has standard deviation 2**-8 * sqrt(f (1 - f)) / sqrt(N)
    <= 2**-8 / (2 sqrt(N)). With N = 16384 * 4 it is 7.6e-6; the bound is 6
    of those (a false failure has probability ~2e-9). Round-to-nearest would
    give 1.0, 1e-3 away.
    """
    numel, repeats = 16384, 4
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.ones(numel, dtype=torch.bfloat16))
    optimizer = optiplug_fused_class("sgd")([param], lr=1e-3, stochastic_rounding=True)
    x = float(torch.tensor(1.0) - torch.tensor(1e-3) * torch.tensor(1.0))
    lo, hi = 1 - 2.0**-8, 1.0
    results = []
    for _ in range(repeats):
        with torch.no_grad():
            param.fill_(1.0)
        param.grad = torch.ones(numel, dtype=torch.bfloat16)
        optimizer.step()
        results.append(param.detach().float().clone())
    values = torch.cat(results)
    assert set(values.unique().tolist()) <= {lo, hi}
    sigma = 2.0**-8 / (2 * math.sqrt(values.numel()))
    assert abs(float(values.double().mean()) - x) <= 6 * sigma
    assert not torch.equal(results[0], results[1])  # a new seed every step


def test_stochastic_rounding_is_seeded_and_checked(interpret: None) -> None:
    def once() -> torch.Tensor:
        torch.manual_seed(123)
        param = torch.nn.Parameter(torch.ones(300, dtype=torch.bfloat16))
        param.grad = torch.full((300,), 0.3, dtype=torch.bfloat16)
        optiplug_fused_class("adamw")([param], lr=1e-3, stochastic_rounding=True).step()
        return param.detach().clone()

    assert torch.equal(once(), once())
    half = [torch.nn.Parameter(torch.ones(3, dtype=torch.float16))]
    with pytest.raises(HyperparameterError, match="stochastic_rounding"):
        optiplug_fused_class("lion")(half, stochastic_rounding=True)
    with pytest.raises(HyperparameterError, match="stochastic_rounding"):
        optiplug_fused_class("lion")([torch.nn.Parameter(torch.ones(3))], stochastic_rounding=1)


def optiplug_fused_class(name: str) -> Any:
    return getattr(optiplug_fused, IMPLEMENTATIONS[name][0])


# ------------------------------------------------------------------ availability, supports
@pytest.mark.cuda
def test_availability_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(availability.INTERPRET_VARIABLE, "1")
    if availability.triton_installed():
        assert availability.unavailable_reason() is None
    monkeypatch.delenv(availability.INTERPRET_VARIABLE)
    if availability.triton_installed() and not HAS_CUDA:
        assert availability.unavailable_reason() == "needs a CUDA device"
    monkeypatch.setitem(sys.modules, "triton", None)  # how Python spells "not importable"
    assert availability.unavailable_reason() == "triton is not installed"
    assert not availability.triton_supported([torch.zeros(3)])


@pytest.mark.cuda
def test_supports(monkeypatch: pytest.MonkeyPatch) -> None:
    if not availability.triton_installed():
        pytest.skip("triton is not installed")
    supported = availability.triton_supported
    monkeypatch.delenv(availability.INTERPRET_VARIABLE, raising=False)
    assert not supported([torch.zeros(3)])
    monkeypatch.setenv(availability.INTERPRET_VARIABLE, "1")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert supported([torch.zeros(3, dtype=dtype), torch.zeros((), dtype=dtype)])
    assert supported([torch.zeros(4, 6).t()])  # transposed: dense in another order
    assert not supported([torch.zeros(3, dtype=torch.float64)])
    assert not supported([torch.zeros(3, dtype=torch.int32)])
    assert not supported([torch.zeros(3, dtype=torch.complex64)])
    assert not supported([torch.zeros(8)[::2]])  # strided with gaps
    assert not supported([torch.zeros(3, 3).to_sparse()])
    if HAS_CUDA:
        monkeypatch.delenv(availability.INTERPRET_VARIABLE)
        assert supported([torch.zeros(3, device="cuda")])


@pytest.mark.cuda
def test_forced_triton_refused_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(availability.INTERPRET_VARIABLE, raising=False)
    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(OptiplugError, match="triton"):
        optiplug.create("adamw", params, impl="triton")
    if availability.triton_installed() and not HAS_CUDA:
        with pytest.raises(OptimizerUnavailableError, match="needs a CUDA device"):
            optiplug_fused_class("adamw")(params)
    monkeypatch.setenv(availability.INTERPRET_VARIABLE, "1")
    with pytest.raises(HyperparameterError, match="impl"):
        optiplug_fused_class("adamw")([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    with pytest.raises(HyperparameterError, match="impl"):
        optiplug_fused_class("adamw")(params, impl="loop")
    with pytest.raises(HyperparameterError, match="lr"):
        optiplug_fused_class("adamw")(params, lr=-1.0)
    optimizer = optiplug_fused_class("sgd")(params)
    with pytest.raises(HyperparameterError, match="impl"):
        optimizer.add_param_group({"params": [torch.zeros(2, dtype=torch.float64)]})
    assert len(optimizer.param_groups) == 1  # nothing half-added


def test_bad_state_dict_changes_nothing(interpret: None) -> None:
    param = torch.nn.Parameter(torch.randn(6))
    param.grad = torch.randn(6)
    optimizer = optiplug.create("adamw", [param], impl="triton", lr=1e-2)
    optimizer.step()
    saved = optimizer.state_dict()
    broken = copy.deepcopy(saved)
    broken["state"][0]["exp_avg"] = torch.zeros(5)
    before = {k: v.clone() for k, v in optimizer.state[param].items()}
    with pytest.raises(StateDictError, match="exp_avg"):
        optimizer.load_state_dict(broken)
    assert all(torch.equal(before[k], v) for k, v in optimizer.state[param].items())


def test_records_are_registered() -> None:
    for name, (class_name, _) in IMPLEMENTATIONS.items():
        records = {r.name: r for r in optiplug.default_registry().implementations(name)}
        record = records["triton"]
        assert record.algorithm == name and record.availability is not None
        assert record.factory.target == f"optiplug_fused.optimizers:{class_name}"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_plugin_module_imports_neither_torch_nor_triton() -> None:
    code = textwrap.dedent(
        """
        import sys
        import optiplug_fused.plugin as plugin
        records = plugin.optiplug_implementations()
        assert {r.algorithm for r in records} == {"adamw", "adam", "sgd", "lion"}
        assert {r.name for r in records} == {"triton"}
        assert "torch" not in sys.modules, "torch imported"
        assert "triton" not in sys.modules, "triton imported"
        """
    )
    env = {k: v for k, v in os.environ.items() if k != availability.INTERPRET_VARIABLE}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_lion_triton_takes_the_registered_config_and_refuses_cautious_decay(
    interpret: None,
) -> None:
    # the registered lion gained weight_decay_mode: the kernel still serves its default...
    param = torch.nn.Parameter(torch.ones(4096))
    optimizer = optiplug.create("lion", [param], impl="triton", lr=1e-2, weight_decay=0.1)
    assert optimizer.param_groups[0]["weight_decay_mode"] == "decoupled"
    # ...and refuses the mode it does not implement, adding nothing
    with pytest.raises(HyperparameterError, match=r"weight_decay_mode.*cautious"):
        optiplug.create(
            "lion", [param], impl="triton", lr=1e-2, weight_decay=0.1, weight_decay_mode="cautious"
        )

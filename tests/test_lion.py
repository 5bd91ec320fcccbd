"""optiplug-lion: the published update rule, for every implementation, and the optimizer contract."""

from __future__ import annotations

import copy
import pickle
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug._choice.chooser import chooser_of
from optiplug.errors import HyperparameterError
from optiplug_lion import LION_STATE, Lion
from optiplug_lion.functional import MIN_KERNEL_NUMEL

IMPLS = ("loop", "foreach", "fused")
STEPS = 50

# A tensor the fused kernel runs, one it leaves to the loop (small) and a
# non-contiguous one (also the loop), all float64 so the formula is exact enough.
SHAPES = ((256, 160), (7,), (5, 3))


@pytest.fixture(autouse=True)
def one_thread():
    """Run single-threaded: the tensors are small, and on a shared machine every
    two-thread OpenMP region can wait a whole scheduler time slice for the second core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_params(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    params = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in SHAPES]
    params.append(torch.randn(96, 40, generator=generator, dtype=torch.float64).t())
    return [torch.nn.Parameter(p) for p in params]


def gradients(params: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]


def lion_formula(
    start: list[torch.Tensor],
    steps: int,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    maximize: bool,
) -> list[torch.Tensor]:
    """The published rule, written out: c = b1*m + (1-b1)*g; p = p(1-lr*wd) - lr*sign(c); m = b2*m + (1-b2)*g."""
    beta1, beta2 = betas
    params = [p.detach().clone() for p in start]
    moments = [torch.zeros_like(p) for p in params]
    for step in range(steps):
        for i, grad in enumerate(gradients(params, step)):
            grad = -grad if maximize else grad
            c = beta1 * moments[i] + (1 - beta1) * grad
            params[i] = params[i] * (1 - lr * weight_decay) - lr * torch.sign(c)
            moments[i] = beta2 * moments[i] + (1 - beta2) * grad
    return params


def run(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: range) -> None:
    for step in steps:
        for param, grad in zip(params, gradients(params, step), strict=True):
            param.grad = grad
        optimizer.step()


def test_shapes_exercise_the_kernel_and_the_loop() -> None:
    params = make_params()
    assert params[0].numel() >= MIN_KERNEL_NUMEL
    assert params[1].numel() < MIN_KERNEL_NUMEL
    assert not params[3].is_contiguous()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("tensor_lr", [False, True])
def test_equals_formula(impl: str, weight_decay: float, maximize: bool, tensor_lr: bool) -> None:
    params = make_params()
    expected = lion_formula(
        params, STEPS, lr=0.01, betas=(0.9, 0.99), weight_decay=weight_decay, maximize=maximize
    )
    lr = torch.tensor(0.01, dtype=torch.float64) if tensor_lr else 0.01
    optimizer = Lion(params, lr=lr, impl=impl, weight_decay=weight_decay, maximize=maximize)
    run(optimizer, params, range(STEPS))
    assert optimizer.impl == impl
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12)


def test_create_uses_the_published_defaults() -> None:
    params = make_params()
    optimizer = optiplug.create("lion", params, impl="loop")
    assert isinstance(optimizer, Lion)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"], group["maximize"]) == (
        1e-4,
        (0.9, 0.99),
        0.0,
        False,
    )
    assert optiplug.spec("lion").state_slots == LION_STATE


@pytest.mark.parametrize(
    ("hparams", "field"),
    [
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"betas": (1.0, 0.9)}, "betas"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"maximize": 1}, "maximize"),
        ({"impl": "bogus"}, "impl"),
    ],
)
def test_bad_hyperparameters_name_field_and_value(hparams: dict, field: str) -> None:
    with pytest.raises(HyperparameterError) as caught:
        optiplug.create("lion", make_params(), **hparams)
    assert caught.value.field == field
    assert repr(caught.value.value) == repr(hparams[field])


def test_typo_gets_a_suggestion() -> None:
    with pytest.raises(HyperparameterError, match="weight_decay"):
        Lion(make_params(), weight_decays=0.1)
    with pytest.raises(HyperparameterError, match="loop") as caught:
        Lion(make_params(), impl="bogus")
    assert (caught.value.field, caught.value.value) == ("impl", "bogus")


def test_impl_none_measures_and_picks_a_supported_implementation() -> None:
    optimizer = optiplug.create("lion", make_params())
    assert optimizer.impl in IMPLS
    # measurements(), not decisions(): a choice made while the fused kernel was still
    # compiling past its budget is recorded there but not cached
    timings = [m.timings for key, m in chooser_of().measurements().items() if key[0] == "lion"]
    assert timings and set(timings[0]) == set(IMPLS)


@pytest.mark.parametrize(("first", "second"), [("fused", "loop"), ("loop", "foreach")])
def test_state_moves_between_implementations(first: str, second: str) -> None:
    params = make_params()
    expected = lion_formula(
        params, 10, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, maximize=False
    )
    optimizer = Lion(params, lr=0.01, weight_decay=0.1, impl=first)
    run(optimizer, params, range(5))
    moved = Lion(params, lr=0.5, impl=second)
    moved.load_state_dict(optimizer.state_dict())
    assert moved.impl == second and moved.param_groups[0]["lr"] == 0.01
    run(moved, params, range(5, 10))
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12)


def test_state_dict_round_trip_deepcopy_and_pickle() -> None:
    params = make_params()
    optimizer = Lion(params, lr=0.01, impl="foreach")
    run(optimizer, params, range(3))
    state = optimizer.state_dict()
    assert set(state["state"][0]) == {slot.name for slot in LION_STATE}
    for clone in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert clone.impl == "foreach"
        torch.testing.assert_close(clone.state_dict()["state"], state["state"])
    fresh = Lion(params, lr=0.01, impl="loop")
    fresh.load_state_dict(state)
    ours, theirs = fresh.state_dict(), optimizer.state_dict()
    torch.testing.assert_close(ours["state"], theirs["state"])
    assert ours["param_groups"] == theirs["param_groups"]  # numbers, flags and strings
    for param in params:  # loading copies: no tensor is shared with the source
        assert (
            fresh.state[param]["exp_avg"].data_ptr() != optimizer.state[param]["exp_avg"].data_ptr()
        )


def test_step_without_gradients_is_a_no_op() -> None:
    params = make_params()
    before = [p.detach().clone() for p in params]
    optimizer = Lion(params, lr=0.1, weight_decay=0.5, impl="fused")
    optimizer.step()
    assert not optimizer.state
    for got, want in zip(params, before, strict=True):
        assert torch.equal(got.detach(), want)


@pytest.mark.parametrize("impl", IMPLS)
def test_quadratic_converges(impl: str) -> None:
    target = torch.linspace(-1, 1, 40_000, dtype=torch.float64)
    x = torch.nn.Parameter(torch.zeros_like(target))
    optimizer = Lion([x], lr=0.05, impl=impl)
    initial = ((x - target) ** 2).mean().item()
    for _ in range(100):
        optimizer.zero_grad()
        loss = ((x - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    assert ((x - target) ** 2).mean().item() < 0.01 * initial


def test_named_parameters_and_lr_scheduler() -> None:
    model = torch.nn.Linear(4, 3)
    optimizer = optiplug.create("lion", model.named_parameters(), impl="loop", lr=0.1)
    assert optimizer.param_groups[0]["param_names"] == ["weight", "bias"]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


FALLBACK_SCRIPT = textwrap.dedent(
    """
    import warnings, torch
    import torch._inductor.config as inductor
    inductor.cpp.cxx = ("/nonexistent/c++",)
    from optiplug_lion import Lion
    from optiplug_lion.functional import FusedFallbackWarning, kernel_status
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(300, 200))
    b = torch.nn.Parameter(a.detach().clone())
    fused, foreach = Lion([a], lr=0.01, impl="fused"), Lion([b], lr=0.01, impl="foreach")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            a.grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(step))
            b.grad = a.grad.clone()
            fused.step()
            foreach.step()
    fallbacks = [w for w in caught if issubclass(w.category, FusedFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    assert torch.equal(a, b)
    assert kernel_status() == {("cpu", torch.float32): False}
    print("ok")
    """
)


def test_compile_failure_falls_back_to_foreach_with_one_warning(tmp_path) -> None:
    # no C compiler for the native kernel either, so torch.compile is tried, and fails
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "CC": "/nonexistent/cc",
        "OPTIPLUG_CACHE_DIR": str(tmp_path / "optiplug"),
    }
    done = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


# ------------------------------------------------------------------ cautious weight decay
def _cautious_reference(
    params: list[torch.Tensor],
    grads: list[list[torch.Tensor]],
    lr: float,
    wd: float,
    betas: tuple[float, float],
) -> list[torch.Tensor]:
    """Lion with cautious weight decay, in float64, from the published rule.

    c = b1*m + (1-b1)*g; u = sign(c); p <- p - lr*(u + wd*p*[u*p >= 0]);
    m <- b2*m + (1-b2)*g (Chen et al. 2023 for Lion; Chen et al. 2025,
    arXiv 2510.12402, for the mask; a zero product counts as agreement).
    """
    beta1, beta2 = betas
    ps = [p.detach().double().clone() for p in params]
    ms = [torch.zeros_like(p) for p in ps]
    for step in grads:
        for p, m, g in zip(ps, ms, step, strict=True):
            g = g.double()
            u = torch.sign(beta1 * m + (1 - beta1) * g)
            p -= lr * (u + wd * p * (u * p >= 0).double())
            m.mul_(beta2).add_((1 - beta2) * g)
    return ps


@pytest.mark.parametrize("impl", ["loop", "foreach", "fused"])
def test_cautious_weight_decay_matches_the_published_rule(impl: str) -> None:
    generator = torch.Generator().manual_seed(3)
    shapes = [(64, 64), (33,), (256, 160)]  # 256x160 (>= 2**15 elements) takes the fused kernel
    params = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    grads = [
        [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes] for _ in range(4)
    ]
    lr, wd, betas = 0.01, 0.5, (0.9, 0.99)
    expected = _cautious_reference(params, grads, lr, wd, betas)
    live = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = optiplug.create(
        "lion", live, lr=lr, weight_decay=wd, betas=betas, weight_decay_mode="cautious", impl=impl
    )
    for step in grads:
        for p, g in zip(live, step, strict=True):
            p.grad = g.clone()
        optimizer.step()
    # float64 throughout; 4 steps of a few roundings each: 1e-12 is far above the
    # rounding (about 4*8 ulps of values near 1) and far below the decay moved (lr*wd*|p|)
    for got, want in zip(live, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-12)
    decoupled = [torch.nn.Parameter(p.clone()) for p in params]
    plain = optiplug.create("lion", decoupled, lr=lr, weight_decay=wd, betas=betas, impl=impl)
    for step in grads:
        for p, g in zip(decoupled, step, strict=True):
            p.grad = g.clone()
        plain.step()
    assert not torch.equal(decoupled[0].detach(), live[0].detach())  # the mask mattered
    if impl == "fused":
        from optiplug_lion import functional

        # it was compiled and run; kept only where its first run agreed with the eager
        # update (a cached kernel built for another vector ISA gets it disabled)
        assert functional.kernel_status().get(("cpu", torch.float64)) is not None


def test_a_bad_weight_decay_mode_names_the_choices() -> None:
    with pytest.raises(HyperparameterError, match=r"weight_decay_mode.*decoupled, cautious"):
        optiplug.create("lion", [torch.nn.Parameter(torch.ones(2))], weight_decay_mode="gentle")


def test_a_compiled_kernel_that_disagrees_with_the_eager_update_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel that updates only part of its input (as a stale cached one did) is caught at once."""
    from optiplug_lion import functional

    def half_kernel(
        param: torch.Tensor, grad: torch.Tensor, avg: torch.Tensor, hyper: torch.Tensor
    ) -> None:
        half = param.numel() // 2
        functional._lion_kernel(param[:half], grad[:half], avg[:half], hyper)

    key = ("cpu", torch.float64)
    monkeypatch.setitem(functional._kernels, key, half_kernel)
    monkeypatch.setattr(functional, "_verified", set())
    params, twins = make_params(), make_params()
    fused = Lion(params, lr=0.01, impl="fused")
    loop = Lion(twins, lr=0.01, impl="loop")
    with pytest.warns(functional.FusedFallbackWarning, match="disagree with the eager update"):
        run(fused, params, range(3))
    run(loop, twins, range(3))
    for got, want in zip(params, twins, strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=0, atol=1e-12)
    assert functional.kernel_status()[key] is False


# ------------------------------------------------------------------ the native (C) kernel
needs_cc = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler"
)


def _one_tensor_case(dtype: torch.dtype, numel: int, seed: int) -> list[torch.Tensor]:
    """param, grad, momentum with zeros, a NaN gradient and ties mixed in."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(numel, generator=generator, dtype=dtype) for _ in range(3)]
    param, grad, avg = tensors
    avg[::7] = 0.0
    grad[::11] = 0.0
    param[::13] = 0.0
    grad[numel // 2] = float("nan")
    avg[::17] = -grad[::17] * (1 - 0.9) / 0.9  # beta1*m + (1-beta1)*g near a tie
    return tensors


@needs_cc
@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    numel=st.integers(1, 5000),
    seed=st.integers(0, 2**16),
    lr=st.sampled_from([1e-4, 0.01, 0.3]),
    weight_decay=st.sampled_from([0.0, 0.1, 2.0]),
    betas=st.sampled_from([(0.9, 0.99), (0.95, 0.98), (0.0, 0.5)]),
    maximize=st.booleans(),
    cautious=st.booleans(),
)
def test_the_native_kernel_is_the_eager_update_bit_for_bit(
    dtype, numel, seed, lr, weight_decay, betas, maximize, cautious
) -> None:
    """Same order of operations, IEEE rounding, no contraction: the C kernel equals the eager one."""
    from optiplug_lion.functional import LionHyper, _hyper_tensor, _lion_kernel
    from optiplug_lion.native import native_kernel

    param, grad, avg = _one_tensor_case(dtype, numel, seed)
    hyper = LionHyper(lr, *betas, weight_decay, maximize, cautious)
    packed = _hyper_tensor(hyper, param)
    eager_param, eager_avg = param.clone(), avg.clone()
    _lion_kernel(eager_param, grad, eager_avg, packed)
    native_kernel(dtype)(param, grad, avg, packed)
    torch.testing.assert_close(param, eager_param, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(avg, eager_avg, rtol=0, atol=0, equal_nan=True)


@needs_cc
def test_the_native_kernel_splits_over_threads_without_changing_a_bit() -> None:
    from optiplug_lion.functional import LionHyper, _hyper_tensor
    from optiplug_lion.native import native_kernel

    results = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        param, grad, avg = _one_tensor_case(torch.float32, 100_003, seed=5)
        packed = _hyper_tensor(LionHyper(0.01, 0.9, 0.99, 0.1, False, True), param)
        native_kernel(torch.float32)(param, grad, avg, packed)
        results.append((param, avg))
    for param, avg in results[1:]:  # elementwise: any split gives the same bits (NaN included)
        torch.testing.assert_close(param, results[0][0], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(avg, results[0][1], rtol=0, atol=0, equal_nan=True)


@needs_cc
def test_fused_on_a_cpu_runs_the_native_kernel_and_equals_the_formula() -> None:
    from optiplug_lion import functional

    params = make_params()
    expected = lion_formula(
        params, STEPS, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, maximize=False
    )
    optimizer = Lion(params, lr=0.01, impl="fused", weight_decay=0.1)
    run(optimizer, params, range(STEPS))
    kernel = functional._kernels[("cpu", torch.float64)]
    assert kernel is not None and kernel.__module__ == "optiplug_lion.native"
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12)


def test_without_native_kernels_fused_compiles_with_torch_and_equals_the_formula(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OPTIPLUG_NATIVE=0 (or no C compiler): the torch.compile kernel, same results."""
    from optiplug_lion import functional

    monkeypatch.setenv("OPTIPLUG_NATIVE", "0")
    monkeypatch.setattr(functional, "_kernels", {})
    monkeypatch.setattr(functional, "_verified", set())
    params = make_params()
    expected = lion_formula(params, 5, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, maximize=True)
    optimizer = Lion(params, lr=0.01, impl="fused", weight_decay=0.1, maximize=True)
    run(optimizer, params, range(5))
    kernel = functional._kernels[("cpu", torch.float64)]
    assert kernel is not None and getattr(kernel, "__module__", "") != "optiplug_lion.native"
    assert functional.kernel_status() == {("cpu", torch.float64): True}
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12)

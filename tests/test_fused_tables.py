"""optiplug-fused: the pointer tables' bookkeeping, and what a GPU, graphs or scale would show.

The CPU tests run the kernels through triton's interpreter
(``TRITON_INTERPRET=1``, set per test). They check what the interpreter can
show: gradients are referred to by address only (never kept alive), a
repoint reuses the bucket's own host buffer, a hyperparameter that adds a
state column rebuilds the table, repeated parameters are refused, channels_last
gradients repoint without a rebuild, device-tensor hyperparameters are
refused, stochastic rounding draws other bits in every bucket, a swapped
``param.data`` is followed, a rebuild of the same size rewrites the table in
place, and the launch configuration is per device.

The tests marked ``cuda`` need a device (``scripts/gpu_check.sh`` runs them):
no host synchronisation in a step (``torch.cuda.set_sync_debug_mode``), a
pinned staging buffer, torch's whole-network CUDA-graph recipe, a graph
replayed across an in-place rebuild, and a bucket on a device that is not
the current one.

Tolerances. Against torch's single-tensor optimizers, per step an element
may differ by one unit in the last place of fp32 at the largest ``|p|``
(the two sides round ``p - update`` separately) plus ``lr * R * (4 n + 8) *
2**-24`` (``R`` bounds ``|update| / lr``; the state's relative error grows
by at most 2 roundings per recurrence step, 8 more for one update's
operations), summed over the ``n`` steps: :func:`tolerance`.
"""

from __future__ import annotations

import gc
import math
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
import optiplug_fused
from optiplug.errors import HyperparameterError
from optiplug_fused import availability

HAS_CUDA = torch.cuda.is_available()
EPS32 = 2.0**-24


@pytest.fixture(autouse=True)
def interpret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CPU tensors run through triton's interpreter; one thread (tiny tensors, shared CPUs)."""
    if not availability.triton_installed():
        pytest.skip("triton is not installed")
    monkeypatch.setenv(availability.INTERPRET_VARIABLE, "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tolerance(steps: int, largest: float, lr: float, ratio: float) -> float:
    """The bound derived in the module docstring (fp32 parameters, no weight decay)."""
    ulp = 2.0 ** (math.floor(math.log2(max(largest, 2.0**-14))) - 23)
    return steps * (ulp + lr * ratio * (4 * steps + 8) * EPS32)


def grads_of(shapes: Sequence[tuple[int, ...]], steps: int, seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=generator) for s in shapes] for _ in range(steps)]


def the_plan(optimizer: Any, group: int = 0) -> Any:
    """The group's current table (a private attribute of the triton optimizers)."""
    return optimizer._plans[group]


def the_bucket(optimizer: Any, group: int = 0) -> Any:
    (bucket,) = the_plan(optimizer, group).buckets
    return bucket


# ------------------------------------------------------------------ gradients by address
def test_gradients_are_not_kept_alive() -> None:
    """After ``zero_grad()`` (set_to_none) the old gradient is freed, as with torch's loops."""
    param = torch.nn.Parameter(torch.ones(8))
    optimizer = optiplug.create("adamw", [param], impl="triton", lr=1e-2)
    for _ in range(2):  # the build, then a repoint
        param.grad = torch.full((8,), 0.5)
        optimizer.step()
        gone = weakref.ref(param.grad)
        optimizer.zero_grad()
        gc.collect()
        assert gone() is None


def test_repoint_copies_from_the_bucket_staging_buffer() -> None:
    """New gradient tensors repoint one column from the bucket's own buffer; no rebuild.

    Earlier gradients are held by the test so every new one has a new address.
    """
    shapes = [(16,), (24,)]
    values = [torch.randn(s, generator=torch.Generator().manual_seed(5)) for s in shapes]
    steps = grads_of(shapes, 4, seed=6)
    params = [torch.nn.Parameter(v.clone()) for v in values]
    reference = [torch.nn.Parameter(v.clone()) for v in values]
    optimizer = optiplug.create("adam", params, impl="triton", lr=1e-2)
    torch_opt = torch.optim.Adam(reference, lr=1e-2, foreach=False)
    held, plans, buffers = [], [], []
    for step_grads in steps:
        optimizer.zero_grad()
        for param, ref, grad in zip(params, reference, step_grads, strict=True):
            param.grad, ref.grad = grad.clone(), grad.clone()
        held.append([p.grad for p in params])
        optimizer.step()
        torch_opt.step()
        bucket = the_bucket(optimizer)
        plans.append(the_plan(optimizer))
        buffers.append(bucket.staging)
        column = bucket.rows[:, 2].tolist()
        assert column == [p.grad.data_ptr() for p in params]  # type: ignore[union-attr]
    assert all(plan is plans[0] for plan in plans)
    assert all(b is buffers[0] for b in buffers)  # one buffer of the bucket's, reused
    # Adam: |update| / lr <= (1 - beta1) / sqrt(1 - beta2) < 3.2 (Kingma & Ba)
    largest = max(float(p.detach().abs().max()) for p in reference) + 0.1
    bound = tolerance(len(steps), largest, 1e-2, 3.2)
    for ours, theirs in zip(params, reference, strict=True):
        assert float((ours.detach() - theirs.detach()).abs().max()) <= bound


# ------------------------------------------------------------------ columns follow the settings
def test_sgd_momentum_turned_on_after_the_first_step() -> None:
    """momentum 0 -> 0.9 adds the momentum-buffer column (it used to read address 0)."""
    shapes = [(33,), (8, 4)]
    values = [torch.randn(s, generator=torch.Generator().manual_seed(7)) for s in shapes]
    steps = grads_of(shapes, 4, seed=8)
    params = [torch.nn.Parameter(v.clone()) for v in values]
    reference = [torch.nn.Parameter(v.clone()) for v in values]
    optimizer = optiplug.create("sgd", params, impl="triton", lr=0.1)
    torch_opt = torch.optim.SGD(reference, lr=0.1, foreach=False)
    for number, step_grads in enumerate(steps):
        if number == 1:
            optimizer.param_groups[0]["momentum"] = 0.9
            torch_opt.param_groups[0]["momentum"] = 0.9
        for param, ref, grad in zip(params, reference, step_grads, strict=True):
            param.grad, ref.grad = grad.clone(), grad.clone()
        optimizer.step()
        torch_opt.step()
    assert all("momentum_buffer" in optimizer.state[p] for p in params)
    # SGD with momentum 0.9: |update| / lr <= max|g| / (1 - 0.9) (a geometric sum)
    largest_grad = max(float(g.abs().max()) for step in steps for g in step)
    largest = max(float(p.detach().abs().max()) for p in reference) + 0.1 * 4 * 10 * largest_grad
    bound = tolerance(len(steps), largest, 0.1, 10 * largest_grad)
    for ours, theirs in zip(params, reference, strict=True):
        assert float((ours.detach() - theirs.detach()).abs().max()) <= bound


def test_amsgrad_turned_on_after_the_first_step() -> None:
    """amsgrad False -> True adds ``max_exp_avg_sq`` (zeros at the switch): float64 reference."""
    grads = grads_of([(40,)], 4, seed=9)
    param = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 40))
    expected = param.detach().double().clone()
    optimizer = optiplug.create("adam", [param], impl="triton", lr=1e-2)
    m = torch.zeros(40, dtype=torch.float64)
    v = torch.zeros(40, dtype=torch.float64)
    vmax = torch.zeros(40, dtype=torch.float64)
    beta1, beta2, lr, eps = 0.9, 0.999, 1e-2, 1e-8
    for step, (grad,) in enumerate(grads, start=1):
        amsgrad = step >= 2
        optimizer.param_groups[0]["amsgrad"] = amsgrad
        param.grad = grad.clone()
        optimizer.step()
        g = grad.double()
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        if amsgrad:
            vmax = torch.maximum(vmax, v)
        second = vmax if amsgrad else v
        denom = second.sqrt() / math.sqrt(1 - beta2**step) + eps
        expected -= lr / (1 - beta1**step) * m / denom
    state = optimizer.state[param]
    assert torch.allclose(state["max_exp_avg_sq"].double(), vmax, rtol=4 * 4 * 2 * EPS32, atol=0)
    # |p| <= 1 + 4 * lr * 3.2; the float64 side has no rounding to speak of
    bound = tolerance(len(grads), 1.2, lr, 3.2)
    assert float((param.detach().double() - expected).abs().max()) <= bound


# ------------------------------------------------------------------ shared storage
def test_repeated_and_tied_parameters_are_refused() -> None:
    """Two rows over one storage would be updated by two programs at once: refused."""
    param = torch.nn.Parameter(torch.ones(8))
    with pytest.warns(UserWarning, match="duplicate"), pytest.raises(HyperparameterError) as err:
        optiplug.create("adamw", [param, param], impl="triton")
    assert err.value.field == "params" and "parameter 0 of param group 0" in str(err.value)
    tied = torch.nn.Parameter(param.data)
    with pytest.raises(HyperparameterError, match="shares its storage"):
        optiplug.create("sgd", [{"params": [param]}, {"params": [tied]}], impl="triton", lr=0.1)
    optimizer = optiplug.create("lion", [param], impl="triton")
    optimizer.param_groups[0]["params"].append(tied)
    param.grad, tied.grad = torch.ones(8), torch.ones(8)
    with pytest.raises(HyperparameterError, match="shares its storage"):
        optimizer.step()
    assert torch.equal(param.detach(), torch.ones(8))  # refused before any launch


# ------------------------------------------------------------------ layouts
def test_channels_last_gradients_repoint_without_rebuild() -> None:
    """A channels_last weight with channels_last gradients keeps its table across zero_grad."""
    shape = (8, 4, 3, 3)
    start = torch.randn(shape, generator=torch.Generator().manual_seed(10))
    weight = torch.nn.Parameter(start.clone().to(memory_format=torch.channels_last))
    reference = torch.nn.Parameter(start.clone())
    optimizer = optiplug.create("adamw", [weight], impl="triton", lr=1e-2)
    torch_opt = torch.optim.AdamW([reference], lr=1e-2, foreach=False)
    plans, held = [], []
    for (grad,) in grads_of([shape], 4, seed=11):
        optimizer.zero_grad()
        weight.grad = grad.clone().to(memory_format=torch.channels_last)
        reference.grad = grad.clone()
        held.append(weight.grad)
        optimizer.step()
        torch_opt.step()
        plans.append(the_plan(optimizer))
    assert all(plan is plans[0] for plan in plans)
    assert not plans[0].volatile
    # AdamW (weight decay 1e-2): R <= 3.2 + 1e-2 * |p|; (1 + 2 lr wd)^4 < 1.0001 is absorbed
    largest = float(reference.detach().abs().max()) + 0.2
    bound = tolerance(4, largest, 1e-2, 3.2 + 1e-2 * largest) * 1.001
    assert float((weight.detach() - reference.detach()).abs().max()) <= bound


# ------------------------------------------------------------------ host-read hyperparameters
def test_device_tensor_hyperparameters_are_refused() -> None:
    """Only lr may live on a device; a CPU one-element tensor is read as a number."""
    param = torch.nn.Parameter(torch.ones(4))
    param.grad = torch.full((4,), 0.5)
    optimizer = optiplug.create("adam", [param], impl="triton", lr=1e-2)
    optimizer.param_groups[0]["eps"] = torch.tensor(1e-8, device="meta")
    with pytest.raises(HyperparameterError) as err:
        optimizer.step()
    assert err.value.field == "eps"
    assert torch.equal(param.detach(), torch.ones(4))
    sgd = optiplug.create("sgd", [param], impl="triton", lr=0.5)
    sgd.param_groups[0]["momentum"] = torch.tensor([0.9, 0.9])
    with pytest.raises(HyperparameterError, match="momentum"):
        sgd.step()
    with pytest.raises(HyperparameterError, match="weight_decay"):
        sgd.add_param_group(
            {"params": [torch.nn.Parameter(torch.ones(2))], "weight_decay": torch.ones(1, 2)}
        )
    assert len(sgd.param_groups) == 1
    sgd.param_groups[0]["momentum"] = torch.tensor(0.0)
    sgd.step()  # 1 - 0.5 * 0.5, exact
    assert torch.equal(param.detach(), torch.full((4,), 0.75))


# ------------------------------------------------------------------ stochastic rounding
def test_stochastic_rounding_bits_differ_between_buckets() -> None:
    """Tensor 0 of two buckets, same values and gradients: other random bits in each.

    ``1 - 2**-9`` (exact in fp32) lies halfway between the bf16 neighbours
    ``1 - 2**-8`` and 1, so each element rounds either way with probability
    1/2: 4096 equal draws in both buckets happen with probability 2**-4096.
    """
    first = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    second = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    groups = [{"params": [first]}, {"params": [second]}]
    optimizer = optiplug_fused.TritonSGD(groups, lr=1.0, stochastic_rounding=True)
    for param in (first, second):
        param.grad = torch.full((4096,), 2.0**-9, dtype=torch.bfloat16)
    optimizer.step()
    assert set(torch.cat([first, second]).detach().float().tolist()) == {1 - 2**-8, 1}
    assert not torch.equal(first.detach(), second.detach())


# ------------------------------------------------------------------ storage swaps, in-place tables
def test_swapped_param_data_is_followed() -> None:
    """``param.data = ...`` after a step: the next step updates the new storage."""
    param = torch.nn.Parameter(torch.ones(5))
    optimizer = optiplug.create("sgd", [param], impl="triton", lr=0.5)
    param.grad = torch.ones(5)
    optimizer.step()  # 1 - 0.5 = 0.5
    old = param.data  # held, so a stale table would write here rather than into freed memory
    param.data = torch.full((5,), 2.0)
    optimizer.step()  # 2 - 0.5 = 1.5 (exact)
    assert torch.equal(param.detach(), torch.full((5,), 1.5))
    assert torch.equal(old, torch.full((5,), 0.5))


def test_same_size_rebuild_rewrites_the_table_in_place() -> None:
    """``load_state_dict`` rebuilds into the same table storage (a captured graph stays valid)."""
    shapes = [(16,), (7,)]
    values = [torch.randn(s, generator=torch.Generator().manual_seed(12)) for s in shapes]
    steps = grads_of(shapes, 3, seed=13)
    params = [torch.nn.Parameter(v.clone()) for v in values]
    reference = [torch.nn.Parameter(v.clone()) for v in values]
    optimizer = optiplug.create("adam", params, impl="triton", lr=1e-2)
    torch_opt = torch.optim.Adam(reference, lr=1e-2, foreach=False)
    tables: list[list[int]] = []
    for number, step_grads in enumerate(steps):
        for param, ref, grad in zip(params, reference, step_grads, strict=True):
            param.grad, ref.grad = grad.clone(), grad.clone()
        if number == 2:
            optimizer.load_state_dict(optimizer.state_dict())
        optimizer.step()
        torch_opt.step()
        plan = the_plan(optimizer)
        tables.append(sorted(t.data_ptr() for b in plan.buckets for t in (b.rows, b.blocks)))
    assert tables[0] == tables[1] == tables[2]
    largest = max(float(p.detach().abs().max()) for p in reference) + 0.1
    bound = tolerance(len(steps), largest, 1e-2, 3.2)
    for ours, theirs in zip(params, reference, strict=True):
        assert float((ours.detach() - theirs.detach()).abs().max()) <= bound


# ------------------------------------------------------------------ launch configuration
def test_launch_configuration_is_per_device() -> None:
    """A configuration set for the CPU is used by tables built afterwards; bad ones refused."""
    from optiplug_fused import kernels

    default = kernels.launch_config("cpu")
    assert default == (kernels.BLOCK, kernels.NUM_WARPS)
    with pytest.raises(HyperparameterError, match="block"):
        kernels.set_launch_config("cpu", 3000, 8)
    with pytest.raises(HyperparameterError, match="num_warps"):
        kernels.set_launch_config("cpu", 1024, 3)
    kernels.set_launch_config("cpu", 512, 4)
    try:
        param = torch.nn.Parameter(torch.ones(1100))
        param.grad = torch.full((1100,), 0.25)
        optimizer = optiplug.create("sgd", [param], impl="triton", lr=1.0)
        optimizer.step()  # 1 - 0.25, exact: every one of the ceil(1100 / 512) = 3 blocks ran
        bucket = the_bucket(optimizer)
        assert (bucket.block, bucket.num_warps, bucket.num_blocks) == (512, 4, 3)
        assert torch.equal(param.detach(), torch.full((1100,), 0.75))
    finally:
        kernels.reset_launch_config("cpu")
    assert kernels.launch_config("cpu") == default


# ------------------------------------------------------------------ CUDA
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA tests: compiled kernels."""
    monkeypatch.delenv(availability.INTERPRET_VARIABLE, raising=False)


@pytest.mark.cuda
@needs_cuda
def test_cuda_step_never_synchronises(compiled: None) -> None:
    """Repoints, float and CPU-tensor hyperparameters: no host sync in a step."""
    params = [torch.nn.Parameter(torch.randn(n, device="cuda")) for n in (1000, 4096)]
    optimizer = optiplug.create("adamw", params, impl="triton", lr=torch.tensor(1e-3))
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()  # builds the table (host-to-device copies, allowed to block)
    bucket = the_plan(optimizer).buckets[0]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            optimizer.zero_grad()
            for p in params:
                p.grad = torch.randn_like(p)
            optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert bucket.staging is not None and bucket.staging.is_pinned()


def _eager_and_graphed(
    values: list[torch.Tensor], grads: list[list[torch.Tensor]], rebuild_at: int | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """torch's whole-network graph recipe (``zero_grad(set_to_none=True)`` before capture)."""

    def make(params: list[torch.nn.Parameter]) -> Any:
        lr = torch.tensor(1e-2, device="cuda")
        return optiplug.create("adamw", params, impl="triton", lr=lr, weight_decay=0.1)

    eager = [torch.nn.Parameter(v.cuda()) for v in values]
    optimizer = make(eager)
    for step_grads in grads:
        for p, g in zip(eager, step_grads, strict=True):
            p.grad = g.cuda()
        optimizer.step()
    params = [torch.nn.Parameter(v.cuda()) for v in values]
    static = [g.cuda() for g in grads[0]]
    optimizer = make(params)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for p, g in zip(params, static, strict=True):
            p.grad = g * 1.0  # a new tensor, as backward makes
        optimizer.step()

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compile, build the table and the state
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for number, step_grads in enumerate(grads[1:], start=1):
        if number == rebuild_at:  # the gradients of the last replay: a repeated step
            assert all(torch.equal(g.cpu(), new) for g, new in zip(static, step_grads, strict=True))
            optimizer.load_state_dict(optimizer.state_dict())  # new state tensors
            optimizer.step()  # eager: rebuilt in place, the replays below read the new table
            continue
        for g, new in zip(static, step_grads, strict=True):
            g.copy_(new)
        graph.replay()
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in eager], [p.detach().cpu() for p in params]


@pytest.mark.cuda
@needs_cuda
def test_cuda_graph_whole_network_recipe_replays_as_eager(compiled: None) -> None:
    """Gradients set to None before capture: the repoint is captured, replays equal eager."""
    shapes = [(3,), (4097,), (64, 65)]
    values = [torch.randn(s, generator=torch.Generator().manual_seed(14)) for s in shapes]
    grads = grads_of(shapes, 6, seed=15)
    eager, graphed = _eager_and_graphed(values, grads, rebuild_at=None)
    assert all(torch.equal(a, b) for a, b in zip(eager, graphed, strict=True))


@pytest.mark.cuda
@needs_cuda
def test_cuda_graph_survives_an_in_place_rebuild(compiled: None) -> None:
    """load_state_dict between replays rewrites the captured table in place: still valid."""
    shapes = [(5,), (4096,)]
    values = [torch.randn(s, generator=torch.Generator().manual_seed(16)) for s in shapes]
    grads = grads_of(shapes, 5, seed=17)
    schedule = [grads[0], grads[1], grads[1], *grads[2:]]  # the eager step repeats a gradient
    eager, graphed = _eager_and_graphed(values, schedule, rebuild_at=2)
    assert all(torch.allclose(a, b, rtol=0, atol=0) for a, b in zip(eager, graphed, strict=True))


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_bucket_on_another_device_than_the_current(compiled: None) -> None:
    """Parameters on cuda:1 while cuda:0 is current: launched on cuda:1, equal to torch."""
    torch.cuda.set_device(0)
    start = torch.randn(5000, generator=torch.Generator().manual_seed(18))
    param = torch.nn.Parameter(start.to("cuda:1"))
    reference = torch.nn.Parameter(start.to("cuda:1"))
    optimizer = optiplug.create("adamw", [param], impl="triton", lr=1e-2)
    torch_opt = torch.optim.AdamW([reference], lr=1e-2, foreach=False)
    for (grad,) in grads_of([(5000,)], 3, seed=19):
        param.grad, reference.grad = grad.to("cuda:1"), grad.to("cuda:1")
        optimizer.step()
        torch_opt.step()
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    largest = float(reference.detach().abs().max()) + 0.1
    bound = tolerance(3, largest, 1e-2, 3.2 + 1e-2 * largest) * 1.001
    assert float((param.detach() - reference.detach()).abs().max().cpu()) <= bound


def test_sweep_times_every_candidate_and_keeps_the_fastest() -> None:
    """The sweep (interpreted here: tiny sizes) returns one timing per candidate, fastest first."""
    from optiplug_fused import kernels, tuning

    candidates = ((512, 4), (1024, 2))
    try:
        kept = tuning.sweep("cpu", numel=64, tensors=2, steps=1, candidates=candidates)
        assert sorted((t.block, t.num_warps) for t in kept) == sorted(candidates)
        assert [t.seconds for t in kept] == sorted(t.seconds for t in kept)
        assert kernels.launch_config("cpu") == (kept[0].block, kept[0].num_warps)
    finally:
        kernels.reset_launch_config("cpu")
    tuning.sweep("cpu", numel=64, tensors=2, steps=1, candidates=candidates, apply=False)
    assert not kernels.has_launch_config("cpu")
    with pytest.raises(HyperparameterError, match="block"):
        tuning.sweep("cpu", numel=64, tensors=2, steps=1, candidates=((100, 4),))
    assert not kernels.has_launch_config("cpu")


def test_default_launch_keeps_two_blocks_per_sm_on_hopper() -> None:
    """Compiled for sm_90a (no GPU needed), the default fits at least two blocks per SM.

    An SM has 65,536 registers, allocated per thread in multiples of 8: a
    block needs ``ceil(regs / 8) * 8 * 32 * num_warps``. The Adam kernel keeps
    every element of a thread in registers, and the unaligned variant (scalar
    accesses) needs about twice what the aligned one does: 4096 elements per
    8 warps took 218 registers there, one block per SM.
    """
    import inspect
    import os
    import re
    import shutil
    import subprocess

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from optiplug_fused import kernels

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    cuobjdump = shutil.which("cuobjdump", path=tools) or shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump (bundled with triton's CUDA backend) is missing")
    source = kernels._SOURCES["adam"]
    names = inspect.signature(source).parameters
    signature = {
        name: "constexpr"
        if name.isupper()
        else "*i64"
        if name in ("blocks", "rows", "rng_ptr")
        else "*fp32"
        if name.endswith("_ptr")
        else "i32"
        if name == "seed"
        else "fp32"
        for name in names
    }
    block, warps = kernels.BLOCK, kernels.NUM_WARPS
    for aligned in (True, False):
        constants: dict[str, Any] = {
            n: False for n, kind in signature.items() if kind == "constexpr"
        }
        constants.update(BLOCK=block, ALIGNED=aligned, HAS_WD=True, P_DTYPE=tl.float32)
        hints = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
        compiled = triton.compile(
            ASTSource(triton.JITFunction(source), signature, constants, hints),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": warps, "enable_fp_fusion": True},
        )
        cubin = Path(tempfile.mkdtemp()) / "adam.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run(
            [cuobjdump, "-res-usage", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
        registers = int(re.search(r"REG:(\d+)", usage).group(1))  # type: ignore[union-attr]
        per_block = -(-registers // 8) * 8 * 32 * warps
        assert 65536 // per_block >= 2, (aligned, registers)

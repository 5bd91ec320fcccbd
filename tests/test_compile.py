"""``torch.compile(optimizer.step)`` steps like the eager optimizer, for every first-party algorithm.

Two identical models get the same gradients for :data:`STEPS` steps; one
optimizer steps eagerly, the other through ``torch.compile(step,
fullgraph=False)``. Parameters and every state tensor must agree within a
bound derived from the arithmetic (see :func:`fp32_bound` and
:func:`muon_bound`), and the compiled step must have been traced into graphs
without a single graph break, so no part of it silently ran eagerly.

Backend: ``aot_eager`` by default (``OPTIPLUG_COMPILE_BACKEND`` overrides it,
e.g. ``inductor``). It runs Dynamo, which is where the crashes were
(``_init_group``, attrs classes built inside ``step``), and AOTAutograd's
functionalisation of the in-place updates, at about a third of inductor's
cost on CPU; both backends pass.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import optiplug
from optiplug.base import KernelTableOptimizer

BACKEND = os.environ.get("OPTIPLUG_COMPILE_BACKEND", "aot_eager")
STEPS = 5
FP32_UNIT_ROUNDOFF = 2.0**-24
ROUNDINGS_PER_STEP = 8
"""Roundings of one element's update in one step: an update is a handful of ops
(scale, add, lerp, divide, square root...), each rounded once in fp32; a
compiled kernel may fuse (round fewer times) or reassociate them."""
BF16_EPSILON = 2.0**-8
NS_BF16_ERROR = 0.06
"""Newton-Schulz in bf16 against float64, relative Frobenius error: at most 0.058
over the spectra measured in docs/optimizers/muon.md."""
MUON_LR = 0.02


TORCH_BACKED = {"sgd", "adam", "adamw", "multi"}
"""Cases that step (partly) through torch's own optimizer classes."""
TORCH_OPTIMIZER_BREAK = "Call to `torch._dynamo.graph_break()`"


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    return param.ndim == 2 and name.startswith("hidden")


# (test id, algorithm, keywords)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("sgd", "sgd", {"impl": "foreach", "lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("adam", "adam", {"impl": "foreach", "lr": 1e-2}),
    ("adamw", "adamw", {"impl": "foreach", "lr": 1e-2, "weight_decay": 0.1}),
    *[
        (f"lion-{impl}", "lion", {"impl": impl, "lr": 1e-3, "weight_decay": 0.1})
        for impl in ("loop", "foreach", "fused")
    ],
    ("muon", "muon", {"lr": MUON_LR, "weight_decay": 0.1, "ns_dtype": "bfloat16"}),
    (
        "multi",
        "multi",
        {
            "routes": [
                {"algorithm": "muon", "match": is_hidden_matrix, "lr": MUON_LR},
                # foreach: torch keeps its fused kernels out of graphs (a graph break)
                {"algorithm": "adamw", "match": "*", "lr": 1e-2, "impl": "foreach"},
            ]
        },
    ),
]


class Net(nn.Module):
    """Two hidden matrices (a tall one and a square one, for Muon) and a head (AdamW)."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.hidden1 = nn.Linear(8, 16)
        self.hidden2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """One thread (tiny tensors, busy machine) and a clean Dynamo cache and counters."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


def fp32_bound(want: torch.Tensor) -> float:
    """Eager against compiled fp32 after :data:`STEPS` steps, per element.

    Each step rounds an element's update :data:`ROUNDINGS_PER_STEP` times at
    most, each rounding off by at most ``2**-24`` of a value no larger than
    the tensor's largest element (or 1: gradients are N(0, 1) and the
    updates are below that), and the gradients are the same on both sides,
    so the differences add up over the steps.
    """
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    return STEPS * ROUNDINGS_PER_STEP * FP32_UNIT_ROUNDOFF * scale


def muon_bound(param: torch.Tensor) -> float:
    """Eager against compiled Muon for one matrix after :data:`STEPS` steps, per element.

    Each step moves the matrix by ``lr * adjust * O``, ``adjust =
    sqrt(max(1, rows/cols))``, ``O`` from Newton-Schulz in bf16. With
    ``aot_eager`` (or ``eager``) the graph runs the same aten kernels in the
    same order, so as in tests/test_muon.py ``O`` may differ by at most one
    bf16 ulp (``2**-8`` relative to ``|O| <= 1``) per step (measured: not at
    all). ``inductor`` fuses bf16 elementwise ops keeping fp32 intermediates
    and splits ``addmm``: another rounding path, which Newton-Schulz amplifies
    (its first coefficient is 3.4 per iteration) up to its own bf16 error,
    at most :data:`NS_BF16_ERROR` of ``|O|_F = sqrt(min(rows, cols))`` for
    each of the two results (measured: 0.055 on the first step of the
    16x8 matrix, against the bound's 0.34).
    """
    rows, cols = param.shape
    adjust = math.sqrt(max(1.0, rows / cols))
    if BACKEND in ("eager", "aot_eager"):
        per_step = BF16_EPSILON
    else:
        per_step = 2 * NS_BF16_ERROR * math.sqrt(min(rows, cols))
    return STEPS * MUON_LR * adjust * per_step


def set_gradients(step: int, *models: nn.Module) -> None:
    generator = torch.Generator().manual_seed(1000 + step)
    grads = [torch.randn(p.shape, generator=generator) for p in models[0].parameters()]
    for model in models:
        for param, grad in zip(model.parameters(), grads, strict=True):
            param.grad = grad.clone()


def state_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every state tensor, keyed ``"<parameter index>.<slot>"``."""
    return {
        f"{index}.{slot}": value
        for index, slots in optimizer.state_dict()["state"].items()
        for slot, value in slots.items()
        if isinstance(value, torch.Tensor)
    }


def labelled(label: str) -> Callable[[str], str]:
    """An ``assert_close`` message that names the tensor."""
    return lambda message: f"{label}: {message}"


@pytest.mark.parametrize(
    ("algorithm", "hparams"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_compiled_step_matches_eager_step(algorithm: str, hparams: dict[str, Any]) -> None:
    eager_model, compiled_model = Net(), Net()
    eager = optiplug.create(algorithm, eager_model.named_parameters(), **hparams)
    compiled = optiplug.create(algorithm, compiled_model.named_parameters(), **hparams)
    step = torch.compile(compiled.step, backend=BACKEND, fullgraph=False)
    for number in range(STEPS):
        set_gradients(number, eager_model, compiled_model)
        eager.step()
        step()

    # Traced, not skipped: graphs were built, and nothing broke out of them but
    # torch.optim.Optimizer's own two deliberate breaks around the update (it
    # switches grad mode there; pytorch/pytorch#104053), which torch's classes
    # (sgd, adam, adamw, and multi's adamw route) inherit.
    assert counters["stats"]["unique_graphs"] >= 1
    breaks = {
        reason: count
        for reason, count in counters["graph_break"].items()
        if not (algorithm in TORCH_BACKED and reason.startswith(TORCH_OPTIMIZER_BREAK))
    }
    assert not breaks, breaks

    uses_muon = algorithm == "muon" or any(
        r["algorithm"] == "muon" for r in hparams.get("routes", ())
    )
    named = zip(eager_model.named_parameters(), compiled_model.parameters(), strict=True)
    for (name, param), got in named:
        bound = fp32_bound(param)
        if uses_muon and is_hidden_matrix(name, param):
            bound += muon_bound(param)
        torch.testing.assert_close(got, param, rtol=0, atol=bound, msg=labelled(name))
    want_state, got_state = state_tensors(eager), state_tensors(compiled)
    assert got_state.keys() == want_state.keys()
    assert want_state, "no state to compare"
    for key, want in want_state.items():
        # Momenta and moments depend on the gradients only, never on Newton-Schulz.
        bound = fp32_bound(want)
        torch.testing.assert_close(got_state[key], want, rtol=0, atol=bound, msg=labelled(key))


def test_kernel_table_optimizers_leave_init_group_to_torch() -> None:
    # torch.compile calls a method named ``_init_group`` eagerly and takes its
    # result as a constant (torch's optimizers return flags such as has_complex);
    # one returning the group's tensor lists crashed tracing ("Cannot construct
    # ConstantVariable for value of type Parameter"). The base's hook has its own name.
    assert not hasattr(KernelTableOptimizer, "_init_group")
    lion = type(optiplug.create("lion", [nn.Parameter(torch.zeros(2))], impl="loop"))
    assert not hasattr(lion, "_init_group")

"""torch's own optimizer test inputs (``optim_db``) through optiplug: accepted and bit-equal, or refused.

For torch's Adam, AdamW and SGD (optiplug's own), and for every class the
torch bridge serves (optiplug-torch: Adagrad, Adadelta, Adamax, ASGD, LBFGS,
NAdam, RAdam, RMSprop, Rprop, SparseAdam, Adafactor, Muon), every CPU input of
``torch.testing._internal.common_optimizers.optim_db`` is given to
``optiplug.create`` with each kernel spelling torch takes (none, ``foreach``
True/False, ``fused`` True/False, ``differentiable``). Each combination is
either accepted, and then steps bit for bit as torch's class does with the
same keywords (the same kernel: flags are spellings of ``impl``), or refused
with a :class:`~optiplug.errors.HyperparameterError` naming the keyword.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
from optiplug.errors import HyperparameterError
from optiplug_torch.catalog import ENTRIES as TORCH_ENTRIES
from optiplug_torch.catalog import Entry

INPUTS_CHILD = """
import sys, torch
from torch.testing._internal.common_optimizers import optim_db
wanted = sys.argv[2].split(",")
found = {
    info.optim_cls.__name__: [
        dict(given.kwargs) for given in info.optim_inputs_func(device="cpu", dtype=torch.float32)
    ]
    for info in optim_db
    if info.optim_cls.__name__ in wanted
}
torch.save(found, sys.argv[1])
"""


def _torch_inputs() -> dict[str, list[dict[str, Any]]]:
    """torch's ``optim_db`` CPU inputs for the classes tested here, read in a fresh interpreter.

    Importing torch's internal test module changes global state (it calls
    ``torch.backends.disable_global_flags()``, after which Lightning cannot
    set its cuDNN flags), so it is never imported into the test process.
    """
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "inputs.pt"
        done = subprocess.run(
            [sys.executable, "-c", INPUTS_CHILD, str(out), ",".join([*ALGORITHMS, *BRIDGED])],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"torch's optimizer test inputs did not load: {done.stderr[-500:]}")
        inputs: dict[str, list[dict[str, Any]]] = torch.load(out, weights_only=True)
        return inputs


ALGORITHMS = {"Adam": "adam", "AdamW": "adamw", "SGD": "sgd"}
BRIDGED = {entry.class_name: entry for entry in TORCH_ENTRIES}
"""The torch bridge's classes, by torch's class name."""
SPELLINGS: list[dict[str, Any]] = [
    {},
    {"foreach": True},
    {"foreach": False},
    {"fused": True},
    {"fused": False},
    {"fused": False, "foreach": False},
    {"differentiable": True},
]
REFUSED = {"differentiable": "optiplug's steps run under torch.no_grad()"}


_INPUTS = _torch_inputs()


def _cases() -> list[Any]:
    cases = []
    for class_name, inputs in sorted(_INPUTS.items()):
        if class_name not in ALGORITHMS:
            continue
        name, torch_class = ALGORITHMS[class_name], getattr(torch.optim, class_name)
        for index, given in enumerate(inputs):
            for flags in SPELLINGS:
                label = f"{name}-{index}-{'-'.join(f'{k}={v}' for k, v in flags.items()) or 'none'}"
                cases.append(pytest.param(torch_class, name, given, flags, id=label))
    return cases


def _params() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((5, 3), (3,))]


def _run(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize(("torch_class", "name", "kwargs", "flags"), _cases())
def test_torch_inputs_are_bit_equal_or_refused_with_the_reason(
    torch_class: type, name: str, kwargs: dict[str, Any], flags: dict[str, Any]
) -> None:
    ours, theirs = _params(), _params()
    refused = [key for key, value in flags.items() if key in REFUSED and value]
    if refused:
        with pytest.raises(HyperparameterError, match=REFUSED[refused[0]]):
            optiplug.create(name, ours, **kwargs, **flags)
        return
    # torch's CPU default (no flags, or fused=False alone) is its for-loop kernel
    impl = {} if flags.get("fused") or flags.get("foreach") is not None else {"impl": "loop"}
    optimizer = optiplug.create(name, ours, **kwargs, **flags, **impl)
    _run(optimizer, ours)
    _run(torch_class(theirs, **kwargs, **flags), theirs)
    for mine, twin in zip(ours, theirs, strict=True):
        assert torch.equal(mine.detach(), twin.detach())


@pytest.mark.parametrize(
    ("name", "keywords", "field", "message"),
    [
        ("adamw", {"fused": True, "foreach": True}, "fused", "cannot be True with foreach=True"),
        ("adamw", {"fused": True, "impl": "loop"}, "impl", "contradicts fused=True"),
        ("sgd", {"foreach": "yes"}, "foreach", "must be True, False or None"),
        ("adam", {"capturable": True}, "capturable", "CUDA-graph capture"),
        ("adam", {"decoupled_weight_decay": True}, "decoupled_weight_decay", "is 'adamw'"),
        ("adamw", {"decoupled_weight_decay": False}, "decoupled_weight_decay", "is 'adam'"),
    ],
)
def test_a_contradictory_or_unsupported_torch_keyword_is_refused_naming_it(
    name: str, keywords: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(HyperparameterError, match=message) as refused:
        optiplug.create(name, _params(), lr=1e-3, **keywords)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("name", "keywords", "impl"),
    [
        ("adamw", {"fused": True}, "fused"),
        ("adam", {"foreach": True}, "foreach"),
        ("sgd", {"foreach": False}, "loop"),
        ("adamw", {"capturable": False, "differentiable": False}, None),
        ("adam", {"decoupled_weight_decay": False}, None),
        ("adamw", {"decoupled_weight_decay": True, "fused": None, "foreach": None}, None),
    ],
)
def test_torch_keywords_spell_impl(name: str, keywords: dict[str, Any], impl: str | None) -> None:
    optimizer = optiplug.create(name, _params(), lr=1e-3, **keywords)
    if impl is not None:
        assert optimizer.impl == impl  # type: ignore[attr-defined]


# ------------------------------------------------------------------ the torch bridge's classes
def _bridged_cases() -> list[Any]:
    """Every CPU input of each bridged class, with each kernel spelling its signature can take.

    A class that names no kernel flag (LBFGS, SparseAdam, Muon) is given its
    inputs alone: torch's class takes no ``foreach``, ``fused`` or
    ``differentiable`` there, and the bridge refuses them as unknown keywords.
    """
    cases = []
    for class_name, entry in sorted(BRIDGED.items()):
        inputs = _INPUTS.get(class_name, [])
        assert inputs, f"optim_db has no CPU inputs for {class_name}"
        for index, given in enumerate(inputs):
            for flags in SPELLINGS if entry.flags else [{}]:
                label = "-".join(f"{k}={v}" for k, v in flags.items()) or "none"
                cases.append(pytest.param(entry, given, flags, id=f"{entry.name}-{index}-{label}"))
    return cases


def _bridged_params(entry: Entry) -> list[torch.nn.Parameter]:
    """A matrix and a vector (two matrices for Muon; an embedding table for SparseAdam)."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(10, 4)] if entry.sparse else [(5, 3), (3, 4) if entry.matrices else (3,)]
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def _gradient(entry: Entry, param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random gradient: SparseAdam's is sparse, holding three rows (one repeated)."""
    if not entry.sparse:
        return torch.randn(param.shape, generator=generator)
    rows = torch.tensor([[1, 7, 1]])
    values = torch.randn(3, param.shape[1], generator=generator)
    return torch.sparse_coo_tensor(rows, values, param.shape, check_invariants=True)


def _bridged_run(entry: Entry, optimizer: Any, params: list[torch.nn.Parameter]) -> None:
    """Three steps; L-BFGS's closure evaluates a fixed quadratic and its gradient."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        if entry.closure:
            targets = [torch.randn(p.shape, generator=generator) for p in params]

            def closure(targets: list[torch.Tensor] = targets) -> torch.Tensor:
                optimizer.zero_grad()
                loss = sum(((p - t) ** 2).sum() for p, t in zip(params, targets, strict=True))
                assert isinstance(loss, torch.Tensor)
                loss.backward()
                return loss

            optimizer.step(closure)
            continue
        for param in params:
            param.grad = _gradient(entry, param, generator)
        optimizer.step()


def _refusal(entry: Entry, flags: dict[str, Any]) -> str | None:
    """The reason the bridge refuses ``flags``, or None when it accepts them."""
    if flags.get("differentiable"):
        return REFUSED["differentiable"]
    if flags.get("fused") and "fused" not in entry.flags:
        return "asks for impl='fused', which .* does not have"
    return None


@pytest.mark.parametrize(("entry", "kwargs", "flags"), _bridged_cases())
def test_bridged_torch_inputs_are_bit_equal_or_refused_with_the_reason(
    entry: Entry, kwargs: dict[str, Any], flags: dict[str, Any]
) -> None:
    """Accepted and bit-equal to torch's class with the same kernel, or refused, saying why.

    torch's class is given only the flags its signature names (``fused=False``
    to a class without a fused kernel is torch's default kernel, which the
    bridge reads it as).
    """
    ours, theirs = _bridged_params(entry), _bridged_params(entry)
    reason = _refusal(entry, flags)
    if reason is not None:
        with pytest.raises(HyperparameterError, match=reason):
            optiplug.create(f"torch:{entry.name}", ours, **kwargs, **flags)
        return
    # torch's CPU default (no flags, or fused=False alone) is its for-loop kernel
    spelled = flags.get("fused") or flags.get("foreach") is not None
    impl = {} if spelled or not entry.flags else {"impl": "loop"}
    optimizer = optiplug.create(f"torch:{entry.name}", ours, **kwargs, **flags, **impl)
    _bridged_run(entry, optimizer, ours)
    torch_class = getattr(torch.optim, entry.class_name)
    own_flags = {k: v for k, v in flags.items() if k in entry.flags}
    _bridged_run(entry, torch_class(theirs, **kwargs, **own_flags), theirs)
    for mine, twin in zip(ours, theirs, strict=True):
        assert torch.equal(mine.detach(), twin.detach())

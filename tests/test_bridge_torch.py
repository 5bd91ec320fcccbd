"""The torch.optim bridge (optiplug-torch): every catalogue entry and implementation, table-driven.

Per entry and implementation: three steps bit-equal to torch's own class
with the same kernel flags (the same kernel runs, so equality is exact on any
CPU), a checkpoint resume bit-equal to an uninterrupted run, an exact memory
report, bad hyperparameters refused with the typed error, and the catalogue
against the installed class's signature. The model holds a matrix and a
vector (Muon: two matrices; SparseAdam: an ``nn.Embedding(sparse=True)``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

import optiplug
from optiplug import checkpoint, testing
from optiplug.errors import ClosureRequiredError, HyperparameterError, UnknownOptimizerError
from optiplug_torch import plugin
from optiplug_torch.catalog import ENTRIES, VERSION, Entry
from optiplug_torch.config import CONFIGS
from optiplug_torch.optimizers import CLASSES, SparseGradientRequired

BY_NAME = {entry.name: entry for entry in ENTRIES}
FLAGS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
FLAGS["default"] = {}
CASES = [
    pytest.param(entry, impl, id=f"{entry.name}-{impl}")
    for entry in ENTRIES
    for impl in (["loop", *entry.flags] if entry.flags else ["default"])
]
QUICK_CHECKS = tuple(c for c in testing.CHECKS if c is not testing.check_quadratic_converges)


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    """The bridge alone: every name is the catalogue's plain name."""
    own = optiplug.Registry(autoload=False)
    info = own.register(plugin, "torch", distribution="optiplug-torch", version="0.1.0")
    assert info.status == "active", info.error
    return own


# ------------------------------------------------------------------ the model
def _model(entry: Entry, seed: int = 0) -> list[tuple[str, torch.nn.Parameter]]:
    """Named float32 parameters: a matrix and a vector (two matrices for Muon; an embedding)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = {"w": (5, 4), "v": (4, 5) if entry.matrices else (5,)}
    if entry.sparse:
        shapes = {"embedding": (10, 4)}
    return [(n, torch.nn.Parameter(torch.randn(s, generator=generator))) for n, s in shapes.items()]


def _loss(entry: Entry, params: list[torch.nn.Parameter], step: int) -> torch.Tensor:
    """A fixed loss for step ``step``: a least-squares fit (an embedding lookup for SparseAdam)."""
    generator = torch.Generator().manual_seed(100 + step)
    if entry.sparse:
        rows = torch.randint(0, 10, (6,), generator=generator)
        looked_up = torch.nn.functional.embedding(rows, params[0], sparse=True)
        return (looked_up - torch.randn(6, 4, generator=generator)).square().sum()
    x = torch.randn(3, 4, generator=generator)
    out = x @ params[0].T
    out = out @ params[1].T if entry.matrices else out + params[1]
    return (out - torch.randn(out.shape, generator=generator)).square().mean()


def _steps(
    entry: Entry, optimizer: Any, params: list[torch.nn.Parameter], first: int, n: int
) -> None:
    """``n`` steps from step ``first`` (L-BFGS re-evaluates the loss through its closure)."""
    for step in range(first, first + n):

        def closure(step: int = step) -> torch.Tensor:
            optimizer.zero_grad()
            loss = _loss(entry, params, step)
            loss.backward()
            return loss

        if entry.closure:
            optimizer.step(closure)
        else:
            closure()
            optimizer.step()


def _tensors(named: list[tuple[str, torch.nn.Parameter]]) -> list[torch.nn.Parameter]:
    return [p for _, p in named]


# ------------------------------------------------------------------ parity with torch
@pytest.mark.parametrize(("entry", "impl"), CASES)
def test_three_steps_equal_torchs_own_class(
    registry: optiplug.Registry, entry: Entry, impl: str
) -> None:
    mine, theirs = _tensors(_model(entry)), _tensors(_model(entry))
    bridged = registry.create(entry.name, mine, impl=impl)
    assert bridged.impl == impl  # type: ignore[attr-defined]
    native = getattr(torch.optim, entry.class_name)(theirs, **FLAGS[impl])
    _steps(entry, bridged, mine, 0, 3)
    _steps(entry, native, theirs, 0, 3)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a.detach(), b.detach())
    assert not torch.equal(mine[0].detach(), _tensors(_model(entry))[0].detach())


@pytest.mark.parametrize(("entry", "impl"), CASES)
def test_torch_kernel_flags_spell_impl(
    registry: optiplug.Registry, entry: Entry, impl: str
) -> None:
    """``foreach=``/``fused=`` as torch takes them choose the same kernel as ``impl=``."""
    optimizer = registry.create(entry.name, _tensors(_model(entry)), **FLAGS[impl])
    expected = impl if FLAGS[impl] else "default"
    assert optimizer.impl == expected  # type: ignore[attr-defined]


def test_without_impl_foreach_is_chosen_and_fused_only_when_asked(
    registry: optiplug.Registry,
) -> None:
    for entry in ENTRIES:
        chosen = registry.create(entry.name, _tensors(_model(entry))).impl  # type: ignore[attr-defined]
        assert chosen == ("foreach" if entry.flags else "default"), entry.name


def test_fused_adagrad_refuses_parameters_its_kernel_does_not_take(
    registry: optiplug.Registry,
) -> None:
    """torch's fused Adagrad runs floating-point CPU and CUDA tensors: integers are refused."""
    spec = next(i for i in registry.spec("adagrad").implementations if i.name == "fused")
    assert spec.can_run([torch.zeros(2)])
    assert not spec.can_run([torch.zeros(2, dtype=torch.int64)])
    assert not spec.can_run([torch.zeros(2, device="meta")])


# ------------------------------------------------------------------ checkpoint and memory
@pytest.mark.parametrize(("entry", "impl"), CASES)
def test_checkpoint_resume_is_bit_equal(
    registry: optiplug.Registry, entry: Entry, impl: str, tmp_path: Path
) -> None:
    named = _model(entry)
    params = _tensors(named)
    original = registry.create(entry.name, named, impl=impl)
    _steps(entry, original, params, 0, 2)
    checkpoint.save(tmp_path / "ckpt", original)
    saved = [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named]
    _steps(entry, original, params, 2, 2)

    restored = registry.create(entry.name, saved, impl=impl)
    checkpoint.load(tmp_path / "ckpt", restored)
    twins = _tensors(saved)
    _steps(entry, restored, twins, 2, 2)
    for mine, twin in zip(params, twins, strict=True):
        assert torch.equal(mine.detach(), twin.detach())
    assert testing.same_state_value(original.state_dict()["state"], restored.state_dict()["state"])


def _storages(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _storages(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _storages(item)


def _real_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every distinct storage the state holds (not the parameters')."""
    params = {p.untyped_storage().data_ptr() for g in optimizer.param_groups for p in g["params"]}
    seen = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in _storages(list(optimizer.state.values()))
    }
    return sum(size for pointer, size in seen.items() if pointer not in params)


@pytest.mark.parametrize(("entry", "impl"), CASES)
def test_memory_report_is_exact(registry: optiplug.Registry, entry: Entry, impl: str) -> None:
    params = _tensors(_model(entry))
    optimizer = registry.create(entry.name, params, impl=impl)
    _steps(entry, optimizer, params, 0, 2)
    assert optiplug.memory(optimizer).total == _real_bytes(optimizer) > 0


# ------------------------------------------------------------------ conformance
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
@pytest.mark.parametrize("check", QUICK_CHECKS, ids=lambda check: check.__name__)
def test_conformance(registry: optiplug.Registry, entry: Entry, check: Any) -> None:
    if entry.limitation:
        pytest.skip(f"torch:{entry.name}: {entry.limitation}")
    reason = dict(entry.deviations).get(check.__name__)
    if reason:
        pytest.skip(f"torch:{entry.name}: {reason}")
    check(entry.name, registry=registry)


# ------------------------------------------------------------------ refusals
BAD = [
    ("adagrad", "lr_decay", -1.0),
    ("adagrad", "eps", 0.0),
    ("adadelta", "rho", 1.5),
    ("adamax", "betas", (0.9, 1.0)),
    ("asgd", "lambd", -1.0),
    ("lbfgs", "history_size", 0),
    ("lbfgs", "line_search_fn", "armijo"),
    ("lbfgs", "max_eval", 2.5),
    ("nadam", "momentum_decay", -0.1),
    ("radam", "betas", (0.9,)),
    ("rmsprop", "momentum", -0.5),
    ("rmsprop", "centered", "yes"),
    ("rprop", "etas", (1.5, 1.2)),
    ("rprop", "step_sizes", (1.0, 0.5)),
    ("sparse_adam", "lr", 0.0),
    ("adafactor", "beta2_decay", 0.5),
    ("adafactor", "d", 0.5),
    ("adafactor", "eps", (-1.0, 1e-3)),
    ("muon", "ns_steps", 100),
    ("muon", "adjust_lr_fn", "other"),
    ("muon", "ns_coefficients", (1.0, 2.0)),
]


@pytest.mark.parametrize(("name", "field", "value"), BAD, ids=[f"{n}-{f}" for n, f, _ in BAD])
def test_a_bad_hyperparameter_is_refused_naming_it(
    registry: optiplug.Registry, name: str, field: str, value: Any
) -> None:
    entry = BY_NAME[name]
    with pytest.raises(HyperparameterError) as refused:
        registry.create(name, _tensors(_model(entry)), **{field: value})
    assert (refused.value.field, refused.value.value) == (field, value)
    with pytest.raises(HyperparameterError):  # the class built directly refuses it too
        CLASSES[name](_tensors(_model(entry)), **{field: value})


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_an_unknown_keyword_and_capturable_are_refused(
    registry: optiplug.Registry, entry: Entry
) -> None:
    with pytest.raises(HyperparameterError) as unknown:
        registry.create(entry.name, _tensors(_model(entry)), momentom=0.9)
    assert unknown.value.field == "momentom"
    with pytest.raises(HyperparameterError, match=r"capturable|differentiable"):
        registry.create(entry.name, _tensors(_model(entry)), differentiable=True)


def test_muon_refuses_a_vector_naming_it(registry: optiplug.Registry) -> None:
    params = [
        ("w", torch.nn.Parameter(torch.randn(4, 4))),
        ("b", torch.nn.Parameter(torch.zeros(4))),
    ]
    with pytest.raises(HyperparameterError, match=r"b of shape \(4,\).*must be 2-D") as refused:
        registry.create("muon", params)
    assert refused.value.field == "params"


def test_lbfgs_needs_a_closure_and_one_group(registry: optiplug.Registry) -> None:
    entry = BY_NAME["lbfgs"]
    params = _tensors(_model(entry))
    optimizer = registry.create("lbfgs", params)
    _loss(entry, params, 0).backward()
    before = [p.detach().clone() for p in params]
    with pytest.raises(ClosureRequiredError):
        optimizer.step()
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, params, strict=True))
    groups = [{"params": [params[0]]}, {"params": [params[1]], "lr": 0.5}]
    with pytest.raises(HyperparameterError, match="must be one group") as refused:
        registry.create("lbfgs", groups)
    assert refused.value.field == "params"


def test_sparse_adam_refuses_a_dense_gradient_before_any_update(
    registry: optiplug.Registry,
) -> None:
    params = _tensors(_model(BY_NAME["sparse_adam"]))
    optimizer = registry.create("sparse_adam", params)
    params[0].grad = torch.ones_like(params[0])
    before = params[0].detach().clone()
    with pytest.raises(SparseGradientRequired, match="dense gradient"):
        optimizer.step()
    assert torch.equal(before, params[0].detach()) and not optimizer.state


def test_sparse_adam_trains_an_embedding_module(registry: optiplug.Registry) -> None:
    """With ``nn.Embedding(sparse=True)`` the rows looked up, and only they, move."""
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    before = embedding.weight.detach().clone()
    optimizer = registry.create("sparse_adam", embedding.parameters(), lr=0.1)
    embedding(torch.tensor([1, 3])).sum().backward()
    optimizer.step()
    moved = (embedding.weight.detach() != before).any(dim=1)
    assert moved.nonzero().flatten().tolist() == [1, 3]


# ------------------------------------------------------------------ the catalogue
SKIPPED = {"self", "params", "foreach", "fused", "capturable", "differentiable"}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_catalogue_matches_torchs_signature(entry: Entry) -> None:
    torch_class = getattr(torch.optim, entry.class_name)
    signature = inspect.signature(torch_class).parameters.values()
    expected = [(p.name, p.default) for p in signature if p.name not in SKIPPED]
    assert [(p.name, p.default) for p in entry.params] == expected
    assert [(f.name, f.default) for f in attrs.fields(CONFIGS[entry.name])] == expected
    flags = {p.name for p in signature} & {"foreach", "fused"}
    assert set(entry.flags) == flags
    assert torch.__version__.startswith(VERSION + ".")


def test_every_torch_optimizer_is_served_by_optiplug_or_the_bridge() -> None:
    """torch.optim's classes: optiplug's own adam, adamw and sgd, and the catalogue's."""
    classes = {
        name
        for name, value in vars(torch.optim).items()
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer)
    }
    native = {"Adam", "AdamW", "SGD", "Optimizer"}
    assert classes - native == {entry.class_name for entry in ENTRIES}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_spec_records_its_origin(registry: optiplug.Registry, entry: Entry) -> None:
    spec = registry.spec(f"torch:{entry.name}")
    assert spec.origin is not None
    assert (spec.origin.library, spec.origin.version) == ("torch", VERSION)
    assert spec.origin.target == f"torch.optim:{entry.class_name}"
    assert spec.origin.limitation == entry.limitation
    assert spec.step_closure == entry.closure


def test_default_registry_serves_qualified_names_and_hf_names() -> None:
    registry = optiplug.default_registry()
    assert registry.has("torch:asgd") and registry.has("torch:rmsprop")
    hf = {
        name
        for spec in registry.optimizer_specs()
        for name in (h.optim for h in spec.hf_names)
        if spec.provider is not None and spec.provider.plugin == "torch"
    }
    assert hf == {"adagrad", "rmsprop"}
    with pytest.raises(UnknownOptimizerError):
        registry.spec("torch:adam")  # optiplug serves adam itself

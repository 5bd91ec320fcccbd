"""Every catalogue entry the installed distributions provide, table-driven, one case each.

The entries are read from the default registry when the tests are collected,
so a bridge installed later (its entry points registered) is covered
without a change here. Each entry is created by name on a small two-layer
network (matrices and vectors, given as named parameters), stepped three
times the way its spec says (:func:`optiplug.base.training_step`: a closure
or a kept graph where it asks; the module itself for the algorithms that
take ``model``; train mode for a schedule-free one), saved through
:mod:`optiplug.checkpoint`, loaded into a fresh optimizer of the same name,
and resumed: three more steps must equal, bit for bit, three more steps of
the uninterrupted run (the same kernels run on the same values in the same
order, so nothing but a lost or changed state can make them differ). The
memory report must equal the bytes of the distinct storages its state and
its groups' tensors hold (counted here, independently of optiplug).

An entry either passes, or is *limited*: its
:attr:`~optiplug.Origin.limitation` says why, ``optiplug list``,
``optiplug show`` and its bridge's docs page show it, and the same protocol
still fails on it here (a limitation the entry has outgrown is stale, and
fails the test).

heavyball compiles its kernels with ``torch.compile`` unless told not to;
here they run eagerly (``heavyball.utils.compile_mode = None``), as in its
bridge's own tests: compiling 37 optimizers on two CPU cores takes many
minutes, and the compiled and eager kernels compute the same update.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
from optiplug import checkpoint, testing
from optiplug.base import set_training, training_step
from optiplug.cli.main import main as cli

PASS_RATE = 0.95
"""The share of entries that must pass every check (not be limited)."""

DOCS = Path(__file__).parents[1] / "docs"


def _entries() -> list[str]:
    """Every registered algorithm, under the name that reaches it."""
    registry = optiplug.default_registry()
    return sorted(registry.name_of(spec) for spec in registry.optimizer_specs())


ENTRIES = _entries()


@pytest.fixture(scope="module", autouse=True)
def _eager_heavyball() -> Iterator[None]:
    """heavyball's kernels uncompiled (see the module docstring); nothing when it is absent."""
    try:
        import heavyball  # type: ignore[import-untyped]
    except ImportError:
        yield
        return
    before = heavyball.utils.compile_mode
    heavyball.utils.compile_mode = None
    yield
    heavyball.utils.compile_mode = before


# ------------------------------------------------------------------ the protocol
def _network(spec: optiplug.OptimizerSpec) -> torch.nn.Module:
    """Linear -> tanh -> Linear in float32, the first weight of the spec's example shape.

    A blockwise-quantized state declares 64x64 (its quantized path needs
    4096 elements); the rest get 4x4. Biases give every entry 1-D parameters.
    """
    rows, columns = tuple(spec.example_shape or (4, 4))[-2:]
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(columns, rows), torch.nn.Tanh(), torch.nn.Linear(rows, 2)
    )


def _loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    """Mean squared error on batch ``step`` (its own generator: the global one is untouched)."""
    generator = torch.Generator().manual_seed(100 + step)
    first = next(iter(model.parameters()))
    inputs = torch.randn(8, first.shape[1], generator=generator)
    targets = torch.randn(8, 2, generator=generator)
    return torch.nn.functional.mse_loss(model(inputs), targets)


def _create(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """``name`` over ``model``'s named parameters (and ``model=`` where it takes the module)."""
    spec = optiplug.default_registry().spec(name)
    fields = {h.name for h in spec.hyperparameters}
    hparams: dict[str, Any] = {"lr": 0.01} if "lr" in fields else {}
    hparams.update(spec.example_hparams)
    if "model" in fields:
        hparams["model"] = model
    return optiplug.create(name, list(model.named_parameters()), **hparams)


def _steps(optimizer: Any, model: torch.nn.Module, first: int, count: int) -> None:
    """Steps ``first..first+count-1`` in train mode, as the spec says; eval mode after."""
    set_training(optimizer, True)
    for step in range(first, first + count):

        def loss(step: int = step) -> torch.Tensor:
            return _loss(model, step)

        training_step(optimizer, loss)
    set_training(optimizer, False)  # checkpoints are taken at the evaluation point


def _storages(value: Any) -> Iterator[torch.Tensor]:
    """The plain tensors in ``value``: tensor subclasses by their inner tensors."""
    if isinstance(value, torch.Tensor):
        flatten = getattr(value, "__tensor_flatten__", None)
        if type(value) is not torch.Tensor and callable(flatten):
            for attribute in flatten()[0]:
                yield from _storages(getattr(value, attribute))
        else:
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _storages(item)
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from _storages(item)


def real_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every distinct storage its state and its groups' tensor values hold.

    Parameters' own storages are not state (a group may keep a view of
    one); each storage counts once, however many tensors view it.
    """
    groups = optimizer.param_groups
    params = {p.untyped_storage().data_ptr() for g in groups for p in g["params"]}
    values: list[Any] = list(optimizer.state.values())
    values += [{k: v for k, v in g.items() if k != "params"} for g in groups]
    seen: dict[int, int] = {}
    for tensor in _storages(values):
        storage = tensor.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _same_parameters(left: torch.nn.Module, right: torch.nn.Module) -> bool:
    pairs = zip(left.parameters(), right.parameters(), strict=True)
    return all(torch.equal(a.detach(), b.detach()) for a, b in pairs)


def run_protocol(name: str, directory: Path) -> None:
    """Create, 3 steps, save, load into a fresh optimizer, resume 3: bit-equal, memory exact.

    The global generator is seeded differently before each continuation:
    an update that drew from it (rather than from state the checkpoint
    keeps) would make the two runs differ.

    Raises:
        AssertionError: a check failed (the message says which).
    """
    spec = optiplug.default_registry().spec(name)
    model = _network(spec)
    original = _create(name, model)
    _steps(original, model, 0, 3)
    checkpoint.save(directory / "ckpt", original)
    twin = _network(spec)
    twin.load_state_dict(model.state_dict())
    torch.manual_seed(1)
    _steps(original, model, 3, 3)  # the uninterrupted run

    resumed = _create(name, twin)
    result = checkpoint.load(directory / "ckpt", resumed)
    assert result.problems == (), f"{name}: loading reported {result.problems}"
    torch.manual_seed(2)
    _steps(resumed, twin, 3, 3)
    assert _same_parameters(model, twin), f"{name}: the resumed run diverged"
    saved, loaded = original.state_dict()["state"], resumed.state_dict()["state"]
    assert testing.same_state_value(saved, loaded), f"{name}: the resumed state differs"
    for optimizer in (original, resumed):
        reported, counted = optiplug.memory(optimizer).total, real_bytes(optimizer)
        assert reported == counted, f"{name}: memory reports {reported} bytes, holds {counted}"


# ------------------------------------------------------------------ every entry
@pytest.mark.parametrize("name", ENTRIES)
def test_entry_passes_or_is_limited_with_a_shown_reason(name: str, tmp_path: Path) -> None:
    reason = testing.limitation(name)
    if not reason:
        run_protocol(name, tmp_path)
        return
    assert reason.strip(), f"{name}: a limitation must say why"
    _assert_shown(name, reason)
    try:
        run_protocol(name, tmp_path)
    except Exception as failure:  # the limitation holds: creating or stepping failed here
        assert not isinstance(failure, (KeyboardInterrupt, SystemExit))
        return
    pytest.fail(f"{name} is marked limited ({reason}) but passes every check: the note is stale")


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(list(argv)) == 0
    return out.getvalue()


def _assert_shown(name: str, reason: str) -> None:
    """``optiplug show``, ``optiplug list`` and the bridge's docs page state the limitation."""
    assert f"limited: {reason}" in _cli("show", name), f"optiplug show {name}"
    assert f"limited: {name}: {reason}" in _LISTING(), f"optiplug list: {name}"
    spec = optiplug.default_registry().spec(name)
    plugin = spec.provider.plugin if spec.provider is not None else ""
    page = DOCS / "bridges" / f"{plugin}.md"
    plain = f"`{spec.name}`"
    rows = [line for line in page.read_text("utf-8").splitlines() if line.startswith(f"| {plain}")]
    assert rows and all("limited" in row for row in rows), f"{page.name}: {name} is not limited"


class _Listing:
    """``optiplug list``'s output, computed once per process."""

    text: str | None = None

    def __call__(self) -> str:
        if self.text is None:
            self.text = _cli("list")
        return self.text


_LISTING = _Listing()


def test_at_least_95_percent_of_the_entries_pass() -> None:
    limited = [name for name in ENTRIES if testing.limitation(name)]
    assert ENTRIES, "no optimizer plugin installed"
    assert len(ENTRIES) - len(limited) >= PASS_RATE * len(ENTRIES), limited


def test_the_table_is_read_from_the_registry() -> None:
    """Each bridge installed here reaches the table (a bridge merged later too)."""
    registry = optiplug.default_registry()
    plugins = {s.provider.plugin for s in registry.optimizer_specs() if s.provider is not None}
    providers = {registry.spec(name).provider.plugin for name in ENTRIES}  # type: ignore[union-attr]
    assert providers == plugins

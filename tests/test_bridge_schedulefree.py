"""The schedule-free bridge (optiplug-schedulefree): every ``schedulefree`` optimizer, table-driven.

Each optimizer of the catalogue is checked against schedulefree itself: the
schema, group state and state slots against the installed class (its
signature, and what a step really leaves in its groups and state), every
step against the library class run directly, resume through
``optiplug.checkpoint`` against an uninterrupted run, and the memory report
against the state's storages counted here. The bridge is registered alone
in a throwaway registry; ``test_installed_bridge_*`` checks the entry point.
"""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_resume import run_trainer
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug import checkpoint, testing
from optiplug.base import set_training
from optiplug.errors import HyperparameterError, OptimizerUnavailableError

schedulefree = pytest.importorskip("schedulefree")
import torch  # noqa: E402  (after the skip: schedulefree imports torch anyway)

from optiplug_schedulefree import plugin  # noqa: E402
from optiplug_schedulefree.catalog import CATALOG, LIBRARY_VERSION, Entry  # noqa: E402
from optiplug_schedulefree.config import CONFIGS  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NAMES = [item.name for item in CATALOG]
WRAPPERS = [item.name for item in CATALOG if item.cls.startswith("ScheduleFreeWrapper")]
BUILDABLE = [name for name in NAMES if name not in WRAPPERS]
CLOSURE = [item.name for item in CATALOG if item.cls.endswith("Closure")]


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    found = optiplug.Registry(autoload=False)
    info = found.register(plugin, "schedulefree", distribution="optiplug-schedulefree", version="0")
    assert info.status == "active", info.error
    return found


def _entry(name: str) -> Entry:
    return next(item for item in CATALOG if item.name == name)


# ------------------------------------------------------------------ catalogue
def test_catalogue_lists_every_optimizer_schedulefree_exports() -> None:
    exported = {
        name
        for name, value in vars(schedulefree).items()
        if isinstance(value, type) and callable(getattr(value, "step", None))
    }
    assert exported == {item.cls for item in CATALOG}
    assert len(set(NAMES)) == len(NAMES)
    from importlib.metadata import version

    # the table was written from LIBRARY_VERSION; the distribution accepts its minor series
    assert version("schedulefree").split(".")[:2] == LIBRARY_VERSION.split(".")[:2]


@pytest.mark.parametrize("name", NAMES)
def test_catalogue_matches_the_class_signature(name: str) -> None:
    item = _entry(name)
    cls = getattr(schedulefree, item.cls)
    assert f"{cls.__module__}:{cls.__qualname__}" == item.target
    skipped = {"self", "params", "base", "foreach"}
    signature = inspect.signature(cls.__init__).parameters.values()
    named = [p for p in signature if p.name not in skipped]
    assert [p.name for p in named] == [p.name for p in item.params]
    for declared, found in zip(item.params, named, strict=True):
        assert declared.default == found.default, declared.name
        assert type(declared.default) is type(found.default), declared.name
    takes_foreach = "foreach" in inspect.signature(cls.__init__).parameters
    assert bool(item.implementations) <= takes_foreach


def _param(shape: tuple[int, ...] = (4, 4), seed: int = 0) -> torch.nn.Parameter:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape, generator=generator, dtype=torch.float64))


def _grad(step: int, like: torch.Tensor) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(like.shape, generator=generator, dtype=like.dtype)


def _steps(optimizer: Any, param: torch.nn.Parameter, start: int, stop: int) -> None:
    """Steps ``start..stop-1`` on fixed gradients; a closure where the class needs one."""
    closure_form = type(optimizer).__name__.endswith("Closure")
    set_training(optimizer, True)
    for step in range(start, stop):

        def closure(step: int = step) -> float:
            param.grad = _grad(step, param)
            return 0.0

        if closure_form:
            optimizer.step(closure)
        else:
            closure()
            optimizer.step()
    set_training(optimizer, False)


@pytest.mark.parametrize("name", BUILDABLE)
def test_group_state_and_slots_are_what_a_step_leaves(
    registry: optiplug.Registry, name: str
) -> None:
    item = _entry(name)
    param = _param()
    optimizer = registry.create(name, [param], **item.example_hparams)
    _steps(optimizer, param, 0, 2)
    group = optimizer.param_groups[0]
    hyperparameters = {p.name for p in item.params} | {"params", "foreach"}
    assert set(group) - hyperparameters == set(item.group_state)
    assert set(optimizer.state[param]) == {slot.name for slot in item.state}


@pytest.mark.parametrize("name", BUILDABLE)
def test_schema_holds_every_keyword_with_its_default(
    registry: optiplug.Registry, name: str
) -> None:
    shown = {h.name: h.default for h in registry.spec(name).hyperparameters}
    assert shown == {p.name: p.default for p in _entry(name).params}
    spec = registry.spec(name)
    assert spec.origin is not None and spec.origin.target == _entry(name).target
    assert spec.origin.paper == "https://arxiv.org/abs/2405.15682"


@pytest.mark.parametrize(
    "name, field, value",
    [
        ("adamw_schedulefree", "betas", (0.0, 0.999)),  # eval() divides by beta1
        ("adamw_schedulefree", "warmup_steps", -1),
        ("adamw_schedulefree", "warmup_steps", 1.5),
        ("adamw_schedulefree", "r", float("nan")),
        ("adamw_schedulefree_reference", "decay_at_z", 1),
        ("sgd_schedulefree", "momentum", 0.0),  # schedulefree's own check: (0, 1)
        ("sgd_schedulefree", "momentum", 1.0),
        ("radam_schedulefree", "silent_sgd_phase", "yes"),
    ],
)
def test_bad_values_name_field_and_value(
    registry: optiplug.Registry, name: str, field: str, value: Any
) -> None:
    with pytest.raises(HyperparameterError) as caught:
        registry.create(name, [_param()], **{field: value})
    assert caught.value.field == field and name in str(caught.value)


_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.sampled_from([0.0, 1.0])
)


@settings(max_examples=60, deadline=None)
@given(lr=_VALUES, momentum=_VALUES, weight_decay=_VALUES)
def test_sgd_ranges_are_the_library_checks(lr: Any, momentum: Any, weight_decay: Any) -> None:
    """Where schedulefree checks a value itself, the schema accepts exactly what it accepts.

    Non-finite values are the exception: the library's comparisons let inf
    and nan through (nan fails every comparison), the schema refuses them.
    """
    config = CONFIGS["sgd_schedulefree"]
    keywords = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
    try:
        config(**keywords)
        ours = True
    except HyperparameterError:
        ours = False
    try:
        schedulefree.SGDScheduleFree([_param()], **keywords)
        theirs = all(math.isfinite(v) for v in keywords.values())
    except ValueError:
        theirs = False
    assert ours == theirs, keywords


def test_the_reference_forms_report_their_one_step(registry: optiplug.Registry) -> None:
    for name in ("adamw_schedulefree_reference", "sgd_schedulefree_reference"):
        optimizer: Any = registry.create(name, [_param()])
        assert optimizer.impl == "default"  # the class takes foreach and ignores it
    loop: Any = registry.create("adamw_schedulefree", [_param()], impl="loop")
    assert loop.impl == "loop" and loop.param_groups[0]["foreach"] is False


def test_listing_imports_neither_torch_nor_schedulefree() -> None:
    """The installed distribution alone, in a fresh interpreter: listing imports neither."""
    code = (
        "import sys, optiplug; registry = optiplug.Registry(autoload=False); "
        "[info] = registry.load_distribution('optiplug-schedulefree'); names = registry.optimizers(); "
        "assert info.status == 'active' and 'adamw_schedulefree' in names, names; "
        "assert 'torch' not in sys.modules and 'schedulefree' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_installed_bridge_names_every_entry_and_its_limits() -> None:
    registry = optiplug.Registry(autoload=False)
    registry.load_distribution("optiplug-schedulefree")
    bridged = {
        s.name
        for s in registry.optimizer_specs()
        if s.provider and s.provider.plugin == "schedulefree"
    }
    assert bridged == set(NAMES)
    for name in NAMES:
        spec = registry.spec(f"schedulefree:{name}")
        assert spec.origin is not None and spec.origin.limitation == _entry(name).limitation
        assert spec.train_eval == _entry(name).train_eval
    with pytest.raises(OptimizerUnavailableError, match="wraps an optimizer object"):
        registry.create("schedulefree:schedulefree_wrapper", [_param()])


# ------------------------------------------------------------------ conformance
def _cases() -> list[Any]:
    cases: list[Any] = []
    for item in CATALOG:
        cases.append((item.name, None))
        cases += [(item.name, impl) for impl in item.implementations]
    return cases


@pytest.mark.parametrize("name, impl", _cases())
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_conformance(
    registry: optiplug.Registry, name: str, impl: str | None, check: Callable[..., None]
) -> None:
    item = _entry(name)
    steps_without_closure = check is not testing.check_hyperparameter_errors
    if item.limitation and (name in WRAPPERS or steps_without_closure):
        pytest.skip(f"{name}: {item.limitation}")
    check(name, impl=impl, registry=registry)


# ------------------------------------------------------------------ against the library
_HPARAMS: dict[str, Any] = {"lr": 0.05, "weight_decay": 0.01, "r": 0.5, "weight_lr_power": 1.5}


def _library_keywords(item: Entry, impl: str | None) -> dict[str, Any]:
    keywords = {**_HPARAMS, **item.example_hparams}
    if any(p.name == "warmup_steps" for p in item.params):
        keywords["warmup_steps"] = 2
    if item.implementations:
        keywords["foreach"] = impl != "loop"
    return keywords


@pytest.mark.parametrize("name, impl", [c for c in _cases() if c[0] in BUILDABLE])
def test_every_step_equals_the_library_class_run_directly(
    registry: optiplug.Registry, name: str, impl: str | None
) -> None:
    item = _entry(name)
    keywords = _library_keywords(item, impl)
    ours, theirs = _param(), _param()
    bridged = registry.create(
        name, [ours], impl=impl, **{k: v for k, v in keywords.items() if k != "foreach"}
    )
    library = getattr(schedulefree, item.cls)([theirs], **keywords)
    for start in range(4):  # eval/train switches between steps, as a training loop does
        _steps(bridged, ours, start, start + 1)
        _steps(library, theirs, start, start + 1)
        assert torch.equal(ours.detach(), theirs.detach()), start
    assert bridged.param_groups[0]["k"] == library.param_groups[0]["k"] == 4


# ------------------------------------------------------------------ checkpoint
@pytest.mark.parametrize("name", BUILDABLE)
def test_resume_through_checkpoint_is_bit_equal(
    registry: optiplug.Registry, name: str, tmp_path: Path
) -> None:
    """3 steps, eval(), save, then 3 more; a fresh optimizer loading the save takes the same 3."""
    item = _entry(name)
    param = _param()
    optimizer = registry.create(name, [("layer.weight", param)], lr=0.05, **item.example_hparams)
    _steps(optimizer, param, 0, 3)  # ends in eval mode, where checkpoints are taken
    checkpoint.save(tmp_path / "ckpt", optimizer)
    saved = param.detach().clone()
    _steps(optimizer, param, 3, 6)

    twin = torch.nn.Parameter(saved)
    resumed = registry.create(name, [("layer.weight", twin)], lr=0.05, **item.example_hparams)
    checkpoint.load(tmp_path / "ckpt", resumed)
    for key in item.group_state:  # the running state came back, not the fresh defaults
        assert testing.same_state_value(resumed.param_groups[0][key], _group_at_save(key, item))
    _steps(resumed, twin, 3, 6)
    assert torch.equal(param.detach(), twin.detach())
    for key in item.group_state:
        assert testing.same_state_value(
            optimizer.param_groups[0][key], resumed.param_groups[0][key]
        )
    for slot, value in optimizer.state[param].items():
        assert testing.same_state_value(value, resumed.state[twin][slot]), slot


def _group_at_save(key: str, item: Entry) -> Any:
    """What a group holds after 3 steps and eval(): recomputed by a run of the library class."""
    param = _param()
    library = getattr(schedulefree, item.cls)([param], lr=0.05, **item.example_hparams)
    _steps(library, param, 0, 3)
    return library.param_groups[0][key]


# ------------------------------------------------------------------ memory
@pytest.mark.parametrize("name", BUILDABLE)
def test_memory_report_counts_the_real_bytes(registry: optiplug.Registry, name: str) -> None:
    item = _entry(name)
    param = _param((8, 16))
    optimizer = registry.create(name, [param], **item.example_hparams)
    _steps(optimizer, param, 0, 1)
    seen = {param.untyped_storage().data_ptr()}
    real: dict[str, int] = {}
    for slot, value in optimizer.state[param].items():
        storage = value.untyped_storage()
        real[slot] = 0 if storage.data_ptr() in seen else storage.nbytes()
        seen.add(storage.data_ptr())
    report = optiplug.memory(optimizer)
    assert report.by_slot == real
    assert report.total == sum(real.values()) == len(item.state) * 8 * 16 * 8  # float64 slots


# ------------------------------------------------------------------ Hugging Face Trainer
@pytest.mark.slow
def test_resume_through_the_hf_trainer_is_bit_equal(
    registry: optiplug.Registry, tmp_path: Path
) -> None:
    """6 Trainer steps against 3, a checkpoint, and 3 resumed ones: the same weights, bit for bit.

    The Trainer calls ``optimizer.train()`` before each step and does not
    switch to eval mode before saving, so the checkpoint holds the gradient
    point ``y`` and ``train_mode=True``; resuming continues from there.
    """
    pytest.importorskip("transformers")
    whole = run_trainer(tmp_path / "whole", "adamw_schedulefree", registry)
    resumed = run_trainer(
        tmp_path / "resumed", "adamw_schedulefree", registry, resume=tmp_path / "whole"
    )
    for (key, value), (_, again) in zip(
        whole.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(value, again), key
    assert resumed.optimizer.param_groups[0]["k"] == whole.optimizer.param_groups[0]["k"] == 6

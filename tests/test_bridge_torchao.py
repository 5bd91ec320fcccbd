"""The torchao bridge (optiplug-torchao): every ``torchao.optim`` optimizer, table-driven.

Each optimizer of the catalogue is checked against torchao itself: the
schema against the installed class's signature, resume through
``optiplug.checkpoint`` against an uninterrupted run of the same class, the
memory report against the storages of the state's inner tensors counted
here. The bridge is registered alone in a throwaway registry, so the plain
names are its own; ``test_installed_bridge_*`` checks the installed entry
point.
"""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hf_resume import run_trainer
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug import checkpoint, testing
from optiplug.errors import HyperparameterError, OptimizerUnavailableError

torchao_optim = pytest.importorskip("torchao.optim")
import torch  # noqa: E402  (after the skip: torchao imports torch anyway)

from optiplug_torchao import plugin  # noqa: E402
from optiplug_torchao.catalog import CATALOG, LIBRARY_VERSION, Entry  # noqa: E402
from optiplug_torchao.config import CONFIGS  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch.compile's subclass notes

NAMES = [item.name for item in CATALOG]
RUNNABLE = [item.name for item in CATALOG if not item.limitation]
QUANTIZED = ("adamw8bit", "adamw4bit")
"""Checked in the default run; the other entries' stepping checks are marked slow."""


def _case(name: str, *, fast: tuple[str, ...] = QUANTIZED) -> Any:
    return name if name in fast else pytest.param(name, marks=pytest.mark.slow)


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    found = optiplug.Registry(autoload=False)
    info = found.register(plugin, "torchao", distribution="optiplug-torchao", version="0")
    assert info.status == "active", info.error
    return found


def _skip_limited(item: Entry) -> None:
    if item.limitation:
        pytest.skip(f"{item.name}: {item.limitation}")


def _entry(name: str) -> Entry:
    return next(item for item in CATALOG if item.name == name)


# ------------------------------------------------------------------ catalogue
def test_catalogue_lists_every_optimizer_torchao_exports() -> None:
    exported = {
        name
        for name in torchao_optim.__all__
        if isinstance(getattr(torchao_optim, name), type)
        and issubclass(getattr(torchao_optim, name), torch.optim.Optimizer)
    }
    assert exported == {item.cls for item in CATALOG}
    assert len(set(NAMES)) == len(NAMES)
    # the table was written from LIBRARY_VERSION; the distribution accepts its minor series
    assert _installed_version().split(".")[:2] == LIBRARY_VERSION.split(".")[:2]


def _installed_version() -> str:
    from importlib.metadata import version

    return version("torchao").split("+")[0]


def _default_text(value: Any) -> Any:
    """A signature default as the torch-free table spells it (a class by its public path)."""
    if isinstance(value, type):
        return f"torch.optim.{value.__name__}"
    return value


@pytest.mark.parametrize("name", NAMES)
def test_catalogue_matches_the_class_signature(name: str) -> None:
    item = _entry(name)
    cls = getattr(torchao_optim, item.cls)
    assert f"{cls.__module__}:{cls.__qualname__}" == item.target
    signature = inspect.signature(cls.__init__).parameters.values()
    named = [p for p in signature if p.name not in ("self", "params") and p.kind != p.VAR_KEYWORD]
    assert [p.name for p in named] == [p.name for p in item.params]
    for declared, found in zip(item.params, named, strict=True):
        assert declared.default == _default_text(found.default), declared.name
        assert type(declared.default) is type(_default_text(found.default)), declared.name


@pytest.mark.parametrize("name", RUNNABLE)
def test_schema_holds_every_keyword_with_its_default(
    registry: optiplug.Registry, name: str
) -> None:
    item = _entry(name)
    shown = {h.name: h.default for h in registry.spec(name).hyperparameters}
    assert shown == {p.name: p.default for p in item.params}
    origin = registry.spec(name).origin
    assert origin is not None and origin.target == item.target and origin.library == "torchao"


@pytest.mark.parametrize(
    "field, value",
    [("block_size", 0), ("block_size", 2.5), ("amsgrad", 1), ("eps", 0.0), ("betas", (0.9,))],
)
def test_bad_values_name_field_and_value(
    registry: optiplug.Registry, field: str, value: Any
) -> None:
    param = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(HyperparameterError) as caught:
        registry.create("adamw8bit", [param], **{field: value})
    assert caught.value.field == field and repr(value) in str(caught.value)


_NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0]))


@settings(max_examples=60, deadline=None)
@given(lr=_NUMBERS, beta1=_NUMBERS, beta2=_NUMBERS, eps=_NUMBERS)
def test_ranges_are_torchaos_checks_and_eps_above_zero(
    lr: float, beta1: float, beta2: float, eps: float
) -> None:
    """The schema accepts what torchao's own checks accept, except a zero or non-finite value.

    torchao checks ``lr >= 0``, ``eps >= 0`` and each beta in [0, 1); its
    comparisons let inf (and nan, which fails every comparison written as
    ``not 0 <= x``) through. The schema also refuses ``eps = 0`` (0/0 where
    a gradient element is 0) and non-finite values.
    """
    keywords: dict[str, Any] = {"lr": lr, "betas": (beta1, beta2), "eps": eps}
    try:
        CONFIGS["adamw8bit"](**keywords)
        ours = True
    except HyperparameterError:
        ours = False
    try:
        torchao_optim.AdamW8bit([torch.nn.Parameter(torch.zeros(4))], **keywords)
        theirs = True
    except ValueError:
        theirs = False
    values = (lr, beta1, beta2, eps)
    assert ours == (theirs and eps != 0.0 and all(math.isfinite(v) for v in values)), keywords


def test_listing_imports_neither_torch_nor_torchao() -> None:
    """The installed distribution alone, in a fresh interpreter: listing imports neither."""
    code = (
        "import sys, optiplug; registry = optiplug.Registry(autoload=False); "
        "[info] = registry.load_distribution('optiplug-torchao'); names = registry.optimizers(); "
        "assert info.status == 'active' and 'adamw8bit' in names and 'adamw4bit' in names, names; "
        "assert 'torch' not in sys.modules and 'torchao' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_installed_bridge_names_every_entry_and_its_limits() -> None:
    registry = optiplug.Registry(autoload=False)
    registry.load_distribution("optiplug-torchao")
    bridged = {
        s.name for s in registry.optimizer_specs() if s.provider and s.provider.plugin == "torchao"
    }
    assert bridged == set(NAMES)
    for name in NAMES:
        spec = registry.spec(f"torchao:{name}")
        assert spec.origin is not None and spec.origin.limitation == _entry(name).limitation
        assert not registry.implementations(f"torchao:{name}")  # torchao's own step only
    assert "CUDA" in _entry("cpu_offload").limitation


# ------------------------------------------------------------------ conformance
_CHEAP = (testing.check_hyperparameter_errors, testing.check_no_grad_step_is_noop)
_STEPPING = (
    testing.check_quadratic_converges,
    testing.check_state_dict_round_trip,
    testing.check_deepcopy_and_pickle,
)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("check", _CHEAP, ids=lambda check: check.__name__)
def test_conformance_without_steps(registry: optiplug.Registry, name: str, check: Any) -> None:
    _skip_limited(_entry(name))
    check(name, registry=registry)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("check", _STEPPING, ids=lambda check: check.__name__)
def test_conformance_with_steps(registry: optiplug.Registry, name: str, check: Any) -> None:
    _skip_limited(_entry(name))
    check(name, registry=registry)


def test_cpu_offload_says_why_it_cannot_run_here(registry: optiplug.Registry) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(OptimizerUnavailableError, match="CUDA or XPU"):
        registry.create("cpu_offload", [torch.nn.Parameter(torch.zeros(4))], lr=1e-3)


# ------------------------------------------------------------------ training helpers
SHAPE = (64, 64)  # 4096 elements: torchao quantizes a state of >= 4096 elements


def _param(seed: int = 0) -> torch.nn.Parameter:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*SHAPE, generator=generator))


def _grad(step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(*SHAPE, generator=generator)


def _steps(optimizer: Any, param: torch.nn.Parameter, start: int, stop: int) -> None:
    for step in range(start, stop):
        param.grad = _grad(step)
        optimizer.step()


def _fresh(registry: optiplug.Registry, name: str, param: torch.nn.Parameter) -> Any:
    return registry.create(name, [("layer.weight", param)], lr=1e-2)


# ------------------------------------------------------------------ against torchao
_SAME_KERNEL = {"lr": 2e-2}
"""A tensor lr: the compiled step the other default-run tests built is reused."""
_OTHER_VALUES = {"lr": 2e-2, "betas": (0.8, 0.99), "weight_decay": 0.1, "eps": 1e-6}
"""Every float the compiled step specializes on changed: one compilation per class (slow)."""


def _peer_cases() -> list[Any]:
    cases: list[Any] = [(name, _SAME_KERNEL) for name in QUANTIZED]
    slow = pytest.mark.slow
    return cases + [pytest.param(name, _OTHER_VALUES, marks=slow) for name in NAMES]


@pytest.mark.parametrize("name, keywords", _peer_cases())
def test_every_step_equals_the_torchao_class_run_directly(
    registry: optiplug.Registry, name: str, keywords: dict[str, Any]
) -> None:
    """The keywords reach torchao unchanged: the same steps and state, bit for bit."""
    item = _entry(name)
    _skip_limited(item)
    ours, theirs = _param(), _param()
    bridged = registry.create(name, [ours], **keywords)
    library = getattr(torchao_optim, item.cls)([theirs], **keywords)
    for step in range(3):
        _steps(bridged, ours, step, step + 1)
        _steps(library, theirs, step, step + 1)
        assert torch.equal(ours.detach(), theirs.detach()), step
    for slot, value in library.state[theirs].items():
        assert testing.same_state_value(value, bridged.state[ours][slot]), slot


# ------------------------------------------------------------------ checkpoint
@pytest.mark.parametrize("name", [_case(n) for n in NAMES])
def test_resume_through_checkpoint_is_bit_equal(
    registry: optiplug.Registry, name: str, tmp_path: Path
) -> None:
    """3 steps, save, 3 more; a fresh optimizer loading the save takes the same 3 steps."""
    _skip_limited(_entry(name))
    param = _param()
    optimizer = _fresh(registry, name, param)
    _steps(optimizer, param, 0, 3)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    saved = param.detach().clone()
    _steps(optimizer, param, 3, 6)

    twin = torch.nn.Parameter(saved)
    resumed = _fresh(registry, name, twin)
    checkpoint.load(tmp_path / "ckpt", resumed)
    for slot, value in resumed.state[twin].items():  # the quantized type is kept, not dequantized
        assert type(value) is type(optimizer.state[param][slot]), slot
    _steps(resumed, twin, 3, 6)
    assert torch.equal(param.detach(), twin.detach())
    for slot, value in optimizer.state[param].items():
        assert testing.same_state_value(value, resumed.state[twin][slot]), slot


# ------------------------------------------------------------------ copies
@pytest.mark.parametrize("name", [_case(n, fast=("adamw8bit",)) for n in NAMES])
def test_copies_step_exactly_like_the_original(registry: optiplug.Registry, name: str) -> None:
    """Deep copies and pickles keep what torchao's step reads (block_size, is_adamw...)."""
    _skip_limited(_entry(name))
    param = _param()
    optimizer = _fresh(registry, name, param)
    _steps(optimizer, param, 0, 2)
    duplicates = [copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))]
    _steps(optimizer, param, 2, 4)
    for duplicate in duplicates:
        twin = duplicate.param_groups[0]["params"][0]
        _steps(duplicate, twin, 2, 4)
        assert torch.equal(param.detach(), twin.detach())
        for slot, value in optimizer.state[param].items():
            assert testing.same_state_value(value, duplicate.state[twin][slot]), slot


# ------------------------------------------------------------------ memory
def _storage_bytes(tensor: torch.Tensor, seen: set[int]) -> int:
    """Bytes of the storages holding ``tensor``: a subclass's inner tensors, each storage once."""
    if type(tensor) is not torch.Tensor and hasattr(type(tensor), "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
        return sum(_storage_bytes(getattr(tensor, n), seen) for n in names)
    storage = tensor.untyped_storage()
    if storage.data_ptr() in seen:
        return 0
    seen.add(storage.data_ptr())
    return storage.nbytes()


@pytest.mark.parametrize("name", [_case(n) for n in NAMES])
def test_memory_report_counts_the_real_bytes(registry: optiplug.Registry, name: str) -> None:
    _skip_limited(_entry(name))
    param = _param()
    optimizer = _fresh(registry, name, param)
    _steps(optimizer, param, 0, 1)
    seen = {param.untyped_storage().data_ptr()}
    real = {slot: _storage_bytes(v, seen) for slot, v in optimizer.state[param].items()}
    group_lr = optimizer.param_groups[0]["lr"]  # torchao keeps lr as a 0-d float32 tensor
    real["lr"] = _storage_bytes(group_lr, seen) if isinstance(group_lr, torch.Tensor) else 0
    report = optiplug.memory(optimizer)
    assert abs(report.total - sum(real.values())) <= 0.01 * sum(real.values())
    for slot in ("exp_avg", "exp_avg_sq", "step"):
        assert report.by_slot[slot] == real[slot], slot
    if name in QUANTIZED:
        # 8-bit: one uint8 code per element (4096 B), one float32 scale per block of
        # 256 (64 B), a 256-entry float32 code book (1024 B). 4-bit: two codes per byte
        # (2048 B), scales per block of 128 (128 B), a 16-entry code book (64 B).
        expected = {"adamw8bit": 4096 + 64 + 1024, "adamw4bit": 2048 + 128 + 64}[name]
        assert real["exp_avg"] == expected
        assert report.by_slot["exp_avg"] < param.numel() * param.element_size()


# ------------------------------------------------------------------ Hugging Face Trainer
@pytest.mark.slow
@pytest.mark.parametrize("name", QUANTIZED)
def test_resume_through_the_hf_trainer_is_bit_equal(
    registry: optiplug.Registry, name: str, tmp_path: Path
) -> None:
    """6 Trainer steps against 3, a checkpoint, and 3 resumed ones: the same weights, bit for bit."""
    pytest.importorskip("transformers")
    whole = run_trainer(tmp_path / "whole", name, registry)
    resumed = run_trainer(tmp_path / "resumed", name, registry, resume=tmp_path / "whole")
    for (key, value), (_, again) in zip(
        whole.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(value, again), key
    state = next(iter(resumed.optimizer.state.values()))
    assert float(state["step"]) == 6.0 and type(state["exp_avg"]).__name__.startswith("OptimState")

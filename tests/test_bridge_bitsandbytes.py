"""The bitsandbytes bridge (optiplug-bitsandbytes): every ``bitsandbytes.optim`` optimizer, table-driven.

Each entry of the catalogue is checked against bitsandbytes itself: the
schema against the installed class's signature, three steps against the
class run directly (the same kernel on the same inputs: bit for bit),
resume through ``optiplug.checkpoint`` against an uninterrupted run, and
the memory report against the bytes of the tensors in ``optimizer.state``
counted here. The model has a 2-D parameter above bitsandbytes'
``min_8bit_size`` of 4096 elements (80 x 64 = 5120: 8-bit codes where the
entry keeps 8-bit state) and 1-D ones below it (float32 state always).
"""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import optiplug
from optiplug import checkpoint
from optiplug.errors import HyperparameterError, OptimizerUnavailableError

bnb_optim = pytest.importorskip("bitsandbytes.optim")
import torch  # noqa: E402  (after the skip: bitsandbytes imports torch anyway)

from optiplug_bitsandbytes import plugin  # noqa: E402
from optiplug_bitsandbytes.catalog import (  # noqa: E402
    BLOCK_SIZE,
    CATALOG,
    LIBRARY_VERSION,
    QMAP_ENTRIES,
    REQUIRED,
    Entry,
)

pytestmark = pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")

NAMES = [item.name for item in CATALOG]
RUNNABLE = [item.name for item in CATALOG if not item.limitation]
LIMITED = [item.name for item in CATALOG if item.limitation]
SHAPES = ((80, 64), (64,), (7,))
"""A matrix above min_8bit_size (5120 elements: 20 blocks of 256) and two small vectors."""


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    found = optiplug.Registry(autoload=False)
    info = found.register(plugin, "bitsandbytes", distribution="optiplug-bitsandbytes", version="0")
    assert info.status == "active", info.error
    return found


def _entry(name: str) -> Entry:
    return next(item for item in CATALOG if item.name == name)


def _keywords(item: Entry) -> dict[str, Any]:
    """Keywords every entry runs with: lr always, momentum where it must be > 0."""
    keywords: dict[str, Any] = {"lr": 1e-2}
    if any(p.check == "momentum_required" for p in item.params):
        keywords["momentum"] = 0.9
    return keywords


# ------------------------------------------------------------------ catalogue
def test_catalogue_lists_every_optimizer_bitsandbytes_exports() -> None:
    exported = {
        name
        for name in dir(bnb_optim)
        if isinstance(getattr(bnb_optim, name), type)
        and issubclass(getattr(bnb_optim, name), torch.optim.Optimizer)
    }
    assert exported == {item.cls for item in CATALOG}
    assert len(set(NAMES)) == len(NAMES) == 40
    from importlib.metadata import version

    assert version("bitsandbytes").split(".")[:2] == LIBRARY_VERSION.split(".")[:2]


@pytest.mark.parametrize("name", NAMES)
def test_catalogue_matches_the_class_signature(name: str) -> None:
    item = _entry(name)
    cls = getattr(bnb_optim, item.cls)
    assert f"{cls.__module__}:{cls.__qualname__}" == item.target
    signature = inspect.signature(cls.__init__).parameters.values()
    named = [p for p in signature if p.name not in ("self", "params")]
    assert [p.name for p in named] == [p.name for p in item.params]
    for declared, found in zip(item.params, named, strict=True):
        default = REQUIRED if found.default is inspect.Parameter.empty else found.default
        assert declared.default == default, declared.name
        assert type(declared.default) is type(default), declared.name


@pytest.mark.parametrize("name", RUNNABLE)
def test_schema_holds_every_keyword_with_its_default(
    registry: optiplug.Registry, name: str
) -> None:
    item = _entry(name)
    shown = {h.name: h.default for h in registry.spec(name).hyperparameters}
    assert shown == {p.name: p.default for p in item.params}
    origin = registry.spec(name).origin
    assert origin is not None and origin.target == item.target
    assert origin.library == "bitsandbytes"


@pytest.mark.slow
def test_listing_imports_neither_torch_nor_bitsandbytes() -> None:
    """The installed distribution alone, in a fresh interpreter: listing imports neither."""
    code = (
        "import sys, optiplug; registry = optiplug.Registry(autoload=False); "
        "[info] = registry.load_distribution('optiplug-bitsandbytes'); "
        "names = registry.optimizers(); "
        "assert info.status == 'active' and 'adamw8bit' in names, names; "
        "assert 'torch' not in sys.modules and 'bitsandbytes' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------ bad values
_BAD = [
    ("adamw8bit", "lr", -1.0),
    ("adamw8bit", "eps", 0.0),
    ("adamw8bit", "betas", (0.9,)),
    ("adamw8bit", "betas", (0.9, 1.0)),
    ("adamw8bit", "amsgrad", True),
    ("adamw8bit", "optim_bits", 8),
    ("adamw8bit", "min_8bit_size", -1),
    ("adamw8bit", "args", object()),
    ("adamw", "optim_bits", 16),
    ("adamw", "is_paged", 1),
    ("lion8bit", "weight_decay", -0.1),
    ("ademamix8bit", "betas", (0.9, 0.999)),
    ("ademamix8bit", "t_alpha", 0),
    ("sgd8bit", "momentum", 0),
    ("sgd8bit", "nesterov", True),
    ("lars", "max_unorm", -1.0),
    ("lamb8bit", "max_unorm", 0.5),
    ("rmsprop8bit", "alpha", 0.0),
    ("rmsprop8bit", "centered", True),
    ("adagrad8bit", "lr_decay", 0.1),
    ("pytorchlars", "momentum", 0),
]


@pytest.mark.parametrize("name, field, value", _BAD)
def test_bad_values_name_field_and_value(
    registry: optiplug.Registry, name: str, field: str, value: Any
) -> None:
    param = torch.nn.Parameter(torch.zeros(4))
    keywords = {**_keywords(_entry(name)), field: value}
    with pytest.raises(HyperparameterError) as caught:
        registry.create(name, [param], **keywords)
    assert caught.value.field == field and repr(value) in str(caught.value)
    assert param.grad is None and torch.equal(param, torch.zeros(4))


@pytest.mark.parametrize("name", ["sgd", "sgd8bit", "lars8bit"])
def test_a_missing_required_lr_is_refused(registry: optiplug.Registry, name: str) -> None:
    with pytest.raises(HyperparameterError, match="required") as caught:
        registry.create(name, [torch.nn.Parameter(torch.zeros(4))], momentum=0.9)
    assert caught.value.field == "lr"


@pytest.mark.parametrize("name", LIMITED)
def test_limited_entries_say_why(registry: optiplug.Registry, name: str) -> None:
    """AdEMAMix32bit's state is one buffer short: bitsandbytes' own class fails at its step."""
    item = _entry(name)
    param = torch.nn.Parameter(torch.randn(80, 64))
    library = getattr(bnb_optim, item.cls)([param])
    param.grad = torch.ones_like(param)
    with pytest.raises(RuntimeError, match="broadcast"):
        library.step()
    with pytest.raises(OptimizerUnavailableError, match="one first-moment buffer"):
        registry.create(name, [torch.nn.Parameter(torch.zeros(4))])


# ------------------------------------------------------------------ training helpers
def _params() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s, generator=generator)) for s in SHAPES]


def _steps(optimizer: Any, params: list[torch.nn.Parameter], start: int, stop: int) -> None:
    for step in range(start, stop):
        generator = torch.Generator().manual_seed(1000 + step)
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()


def _same_state(one: dict[str, Any], other: dict[str, Any]) -> None:
    assert one.keys() == other.keys()
    for slot, value in one.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == other[slot].dtype and torch.equal(value, other[slot]), slot
        else:
            assert value == other[slot], slot


# ------------------------------------------------------------------ against bitsandbytes
@pytest.mark.parametrize("name", RUNNABLE)
def test_every_step_equals_the_bitsandbytes_class(registry: optiplug.Registry, name: str) -> None:
    """The keywords reach bitsandbytes unchanged: the same kernel, the same bits, 3 steps."""
    item = _entry(name)
    ours, theirs = _params(), _params()
    bridged = registry.create(name, ours, **_keywords(item))
    library = getattr(bnb_optim, item.cls)(theirs, **_keywords(item))
    for step in range(3):
        _steps(bridged, ours, step, step + 1)
        _steps(library, theirs, step, step + 1)
        for mine, peer in zip(ours, theirs, strict=True):
            assert torch.equal(mine.detach(), peer.detach()), step
    for mine, peer in zip(ours, theirs, strict=True):
        _same_state(bridged.state[mine], library.state[peer])
    big = bridged.state[ours[0]]
    if item.bits == 8:  # the 8-bit codes the name promises; the small vectors stay float32
        assert big["state1"].dtype == torch.uint8 and "absmax1" in big and "qmap1" in big
        assert bridged.state[ours[1]]["state1"].dtype == torch.float32


# ------------------------------------------------------------------ checkpoint
@pytest.mark.parametrize("name", RUNNABLE)
def test_resume_through_checkpoint_is_bit_equal(
    registry: optiplug.Registry, name: str, tmp_path: Path
) -> None:
    """3 steps, save, 3 more; a fresh optimizer loading the save takes the same 3 steps."""
    item = _entry(name)
    params = _params()
    optimizer = registry.create(name, params, **_keywords(item))
    _steps(optimizer, params, 0, 3)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    saved = [p.detach().clone() for p in params]
    _steps(optimizer, params, 3, 6)

    twins = [torch.nn.Parameter(s) for s in saved]
    resumed = registry.create(name, twins, **_keywords(item))
    checkpoint.load(tmp_path / "ckpt", resumed)
    _steps(resumed, twins, 3, 6)
    for param, twin in zip(params, twins, strict=True):
        assert torch.equal(param.detach(), twin.detach())
        _same_state(optimizer.state[param], resumed.state[twin])


@pytest.mark.parametrize("name", ["adamw8bit", "lion32bit", "lars8bit"])
def test_copies_step_exactly_like_the_original(registry: optiplug.Registry, name: str) -> None:
    """Deep copies and pickles keep what bitsandbytes' step reads (args, optimizer_name...)."""
    params = _params()
    optimizer = registry.create(name, params, **_keywords(_entry(name)))
    _steps(optimizer, params, 0, 2)
    duplicates = [copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))]
    _steps(optimizer, params, 2, 4)
    for duplicate in duplicates:
        twins = duplicate.param_groups[0]["params"]
        _steps(duplicate, twins, 2, 4)
        for param, twin in zip(params, twins, strict=True):
            assert torch.equal(param.detach(), twin.detach())
            _same_state(optimizer.state[param], duplicate.state[twin])


def test_bitsandbytes_own_nested_state_dict_loads(registry: optiplug.Registry) -> None:
    """What bitsandbytes' own state_dict writes (codes nested under one key) loads too."""
    ours, theirs = _params(), _params()
    library = bnb_optim.AdamW8bit(theirs, lr=1e-2)
    _steps(library, theirs, 0, 2)
    nested = library.state_dict()
    assert "__bnb_optimizer_quant_state__" in nested["state"][0]
    for mine, peer in zip(ours, theirs, strict=True):
        mine.data.copy_(peer.detach())
    bridged = registry.create("adamw8bit", ours, lr=1e-2)
    bridged.load_state_dict(nested)
    _steps(bridged, ours, 2, 4)
    _steps(library, theirs, 2, 4)
    for mine, peer in zip(ours, theirs, strict=True):
        assert torch.equal(mine.detach(), peer.detach())


def test_a_corrupt_state_is_refused_and_nothing_changes(registry: optiplug.Registry) -> None:
    params = _params()
    optimizer = registry.create("adamw8bit", params, lr=1e-2)
    _steps(optimizer, params, 0, 1)
    state = optimizer.state_dict()
    state["state"][0]["absmax1"] = -state["state"][0]["absmax1"] - 1.0
    fresh = registry.create("adamw8bit", _params(), lr=1e-2)
    with pytest.raises(optiplug.errors.StateDictError, match="absmax1"):
        fresh.load_state_dict(state)
    assert not fresh.state


# ------------------------------------------------------------------ memory
def _state_bytes(optimizer: Any) -> dict[str, int]:
    """Bytes of the storages in ``optimizer.state``, by slot, each storage once."""
    seen: set[int] = set()
    found: dict[str, int] = {}
    for slots in optimizer.state.values():
        for slot, value in slots.items():
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                found[slot] = found.get(slot, 0) + value.untyped_storage().nbytes()
    return found


@pytest.mark.parametrize("name", RUNNABLE)
def test_memory_report_counts_the_real_bytes(registry: optiplug.Registry, name: str) -> None:
    item = _entry(name)
    params = _params()
    optimizer = registry.create(name, params, **_keywords(item))
    _steps(optimizer, params, 0, 1)
    report = optiplug.memory(optimizer)
    real = _state_bytes(optimizer)
    assert report.total == sum(real.values())
    assert {k: v for k, v in report.by_slot.items() if v} == real
    if item.bits == 8:
        # the 80x64 matrix: one uint8 code per element, a float32 absmax per block of 256;
        # one 256-entry float32 map per state, shared by every parameter (counted once);
        # the vectors (64 and 7 elements, below min_8bit_size) in float32
        n, blocks, small = 80 * 64, math.ceil(80 * 64 / BLOCK_SIZE), 64 + 7
        moments = 2 if "state2" in optimizer.state[params[0]] else 1
        stacked = 2 if item.cls.endswith("AdEMAMix8bit") else 1  # AdEMAMix's two first moments
        codes = (stacked + moments - 1) * (n + 4 * blocks) + moments * 4 * QMAP_ENTRIES
        vectors = (stacked + moments - 1) * 4 * small
        unorm = real.get("unorm_vec", 0)
        assert report.total == codes + vectors + unorm


# ------------------------------------------------------------------ Hugging Face
def test_hf_names_route_to_the_state_they_name() -> None:
    """Through the installed registry: every bitsandbytes name goes to this bridge first."""
    pytest.importorskip("transformers")
    from optiplug_integrations.transformers import hf_optimizers

    table = hf_optimizers()
    for optim, (name, _) in plugin.HF_OPTIM.items():
        assert table[optim].routes[0].name == f"bitsandbytes:{name}", optim
        eight = "8bit" in optim
        assert (_entry(name).bits == 8) == eight, optim
        assert _entry(name).paged == ("paged" in optim), optim


def test_hf_trainer_with_adamw_bnb_8bit_keeps_uint8_codes(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    from optiplug_integrations.transformers import from_training_args

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(80, 64)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": ((self.layer(x) - y) ** 2).mean()}

    generator = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(80, generator=generator), "y": torch.randn(64)} for _ in range(32)]
    arguments = TrainingArguments(
        output_dir=str(tmp_path),
        optim="adamw_bnb_8bit",
        max_steps=2,
        per_device_train_batch_size=8,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(
            model=Model(),
            args=arguments,
            train_dataset=data,
            optimizer_cls_and_kwargs=from_training_args(arguments),
        )
        trainer.train()
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    record = optiplug.record_of(inner)
    assert record is not None and record.spec.name == "adamw8bit"
    weight = trainer.model.layer.weight
    assert inner.state[weight]["state1"].dtype == torch.uint8
    assert inner.state[weight]["step"] == 2

"""The heavyball bridge (optiplug-heavyball): every registered optimizer, table-driven.

Per optimizer of the catalogue: optiplug's conformance checks on CPU, a
checkpoint resume bit-equal to an uninterrupted run, an exact memory report,
the same updates as heavyball's own class, and the catalogue against the
installed class. heavyball compiles its kernels with ``torch.compile`` by
default; these tests run them eagerly (``heavyball.utils.compile_mode = None``),
as a CPU machine with two cores must.
"""

from __future__ import annotations

import copy
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import heavyball  # type: ignore[import-untyped]
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug import checkpoint, testing
from optiplug.base import set_training
from optiplug.errors import HyperparameterError, StateDictError
from optiplug_heavyball import plugin, state
from optiplug_heavyball.catalog import CATALOG, EXCLUDED, LIBRARY_DEFAULT, VERSION, Entry
from optiplug_heavyball.config import CONFIGS, RULES

ENTRIES = {entry.name: entry for entry in CATALOG}
NAMES = sorted(ENTRIES)
QUICK_CHECKS = tuple(c for c in testing.CHECKS if c is not testing.check_quadratic_converges)
SHAPE = (4, 4)
SEED = 0x5EED  # the bridge's generator seed for update k of group 0 is SEED + k


@pytest.fixture(scope="module", autouse=True)
def _eager_heavyball() -> Iterator[None]:
    """heavyball's kernels uncompiled (compiling 37 optimizers on 2 CPU cores takes many minutes)."""
    before = heavyball.utils.compile_mode
    heavyball.utils.compile_mode = None
    yield
    heavyball.utils.compile_mode = before


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    """The bridge alone (no first-party plugin): every name is the catalogue's plain name."""
    own = optiplug.Registry(autoload=False)
    info = own.register(plugin, "heavyball", distribution="optiplug-heavyball", version="0.1.0")
    assert info.status == "active", info.error
    return own


def _limited(name: str, check: str = "") -> None:
    """Skip, with the catalogue's reason, a check the optimizer cannot pass.

    A limitation names the checks it skips (``check_quadratic_converges``);
    one that names none skips every check.
    """
    reason = ENTRIES[name].limitation
    if reason and (not check or check in reason):
        pytest.skip(f"heavyball:{name}: {reason}")


# ------------------------------------------------------------------ (a) conformance
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("check", QUICK_CHECKS, ids=lambda check: check.__name__)
def test_conformance(registry: optiplug.Registry, name: str, check: Any) -> None:
    _limited(name, check.__name__)
    check(name, registry=registry)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_quadratic_converges(registry: optiplug.Registry, name: str) -> None:
    _limited(name, "check_quadratic_converges")
    testing.check_quadratic_converges(name, registry=registry)


# ------------------------------------------------------------------ helpers
def _parameter(seed: int = 0, shape: tuple[int, ...] = SHAPE) -> torch.nn.Parameter:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape, generator=generator))


def _model() -> list[tuple[str, torch.nn.Parameter]]:
    """A matrix and a vector: heavyball treats the first parameter of a group specially."""
    return [("w", _parameter(0)), ("b", _parameter(1, (4,)))]


def _gradient(step: int, like: torch.Tensor | None = None, index: int = 0) -> torch.Tensor:
    """A fixed gradient sequence (not drawn from the global generator the bridge isolates)."""
    generator = torch.Generator().manual_seed(1000 + 100 * index + step)
    return torch.randn(*(SHAPE if like is None else like.shape), generator=generator)


def _steps(
    optimizer: torch.optim.Optimizer,
    params: torch.Tensor | list[torch.nn.Parameter],
    first: int,
    count: int,
) -> None:
    tensors = [params] if isinstance(params, torch.Tensor) else params
    set_training(optimizer, True)
    for step in range(first, first + count):
        for index, param in enumerate(tensors):
            param.grad = _gradient(step, param, index)
        optimizer.step()


# ------------------------------------------------------------------ (b) checkpoint resume
@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_resume_is_bit_equal(
    registry: optiplug.Registry, name: str, tmp_path: Path
) -> None:
    """Save after 2 steps, resume in a fresh optimizer: 2 more steps equal the uninterrupted run.

    The global generator is reseeded differently before each continuation:
    heavyball draws random numbers (PSGD's probes, Muon's orthogonalisation
    start) and the bridge makes them a function of the optimizer state.
    """
    _limited(name, "checkpoint")
    named = _model()
    params = [p for _, p in named]
    original = registry.create(name, named, lr=0.01)
    _steps(original, params, 0, 2)
    set_training(original, False)  # checkpoints are taken in eval mode (schedule-free)
    checkpoint.save(tmp_path / "ckpt", original)
    saved = [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named]
    torch.manual_seed(1)
    _steps(original, params, 2, 2)

    restored = registry.create(name, saved, lr=0.01)
    checkpoint.load(tmp_path / "ckpt", restored)
    torch.manual_seed(2)
    twins = [p for _, p in saved]
    _steps(restored, twins, 2, 2)
    for mine, twin in zip(params, twins, strict=True):
        assert torch.equal(mine.detach(), twin.detach())


def _clashing_names() -> list[str]:
    """Catalogue names another provider also serves (optiplug's adamw, pytorch-optimizer's soap)."""
    specs = optiplug.default_registry().optimizer_specs()
    others = {s.name for s in specs if s.provider is None or s.provider.plugin != "heavyball"}
    return sorted(set(NAMES) & others)


@pytest.mark.parametrize("name", _clashing_names())
def test_a_clashing_name_resumes_through_the_default_registry(name: str, tmp_path: Path) -> None:
    """Saved as ``heavyball:NAME`` among every installed plugin, it loads back and resumes.

    The checkpoint records the plugin that saved it; checking it against
    the plain name's provider (optiplug's own adamw, say) refused what save
    had written.
    """
    _limited(name, "checkpoint")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 64))
    named = list(model.named_parameters())
    params = [p for _, p in named]
    original = optiplug.create(f"heavyball:{name}", named, lr=1e-3)
    _steps(original, params, 0, 3)
    set_training(original, False)
    checkpoint.save(tmp_path / "ckpt", original)
    saved = [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named]
    torch.manual_seed(1)
    _steps(original, params, 3, 2)
    restored = optiplug.create(f"heavyball:{name}", saved, lr=1e-3)
    checkpoint.load(tmp_path / "ckpt", restored)
    torch.manual_seed(1)
    twins = [p for _, p in saved]
    _steps(restored, twins, 3, 2)
    for mine, twin in zip(params, twins, strict=True):
        assert torch.equal(mine.detach(), twin.detach())


def test_heavyballs_own_state_dict_loads(registry: optiplug.Registry) -> None:
    """A state dict of heavyball's own class (nested per view, a "heavyball" entry) loads and resumes."""
    param, twin = _parameter(), _parameter()
    native = heavyball.SOAP([param], lr=0.01)
    for step in range(3):
        param.grad = _gradient(step)
        native.step()
    with torch.no_grad():
        twin.copy_(param)
    bridged: Any = registry.create("soap", [twin], lr=0.01)
    bridged.load_state_dict(native.state_dict())
    assert bridged.inner_group == native.inner_group
    param.grad, twin.grad = _gradient(3), _gradient(3)
    native.step()
    bridged.step()
    assert torch.equal(param.detach(), twin.detach())


def test_bad_saved_state_is_refused_naming_it(registry: optiplug.Registry) -> None:
    """A saved out-of-range hyperparameter or a NaN moment refuses the load; nothing changes."""
    param = _parameter()
    optimizer = registry.create("soap", [param], lr=0.01)
    _steps(optimizer, param, 0, 2)
    good = optimizer.state_dict()
    bad_group = copy.deepcopy(good)
    bad_group["param_groups"][0]["shampoo_beta"] = 1.5
    bad_slot = copy.deepcopy(good)
    bad_slot["state"][0]["scale_by_soap_exp_avg_2"].fill_(float("nan"))
    fresh = registry.create("soap", [_parameter()], lr=0.01)
    for bad, slot in ((bad_group, "shampoo_beta"), (bad_slot, "scale_by_soap_exp_avg_2")):
        with pytest.raises(StateDictError) as caught:
            fresh.load_state_dict(bad)
        assert any(problem.slot == slot for problem in caught.value.problems)
        assert not fresh.state


def test_a_non_default_configuration_resumes(registry: optiplug.Registry, tmp_path: Path) -> None:
    """``mars=True`` adds its slot (declared ``when="mars"``); the checkpoint still loads exactly."""
    param, twin = _parameter(), _parameter()
    original = registry.create("psgd_kron", [param], lr=0.01, mars=True)
    _steps(original, param, 0, 2)
    checkpoint.save(tmp_path / "ckpt", original)
    with torch.no_grad():
        twin.copy_(param)
    restored = registry.create("psgd_kron", [twin], lr=0.01, mars=True)
    checkpoint.load(tmp_path / "ckpt", restored)
    _steps(original, param, 2, 2)
    _steps(restored, twin, 2, 2)
    assert torch.equal(param.detach(), twin.detach())


def test_flat_state_dict_survives_weights_only_torch_load(
    registry: optiplug.Registry, tmp_path: Path
) -> None:
    param = _parameter()
    optimizer = registry.create("psgd_kron", [param], lr=0.01)
    _steps(optimizer, param, 0, 2)
    checkpoint.export_torch(tmp_path / "opt.pt", optimizer)
    loaded = torch.load(tmp_path / "opt.pt", weights_only=True)
    entry = loaded["state"][0]
    assert all(isinstance(key, str) for key in entry)
    assert isinstance(entry["is_initialized"], tuple)
    assert state.RNG_STEP in loaded["param_groups"][0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["soap", "psgd_kron"])
def test_hugging_face_trainer_resume_is_bit_equal(name: str, tmp_path: Path) -> None:
    """A Trainer resumed from its step-4 checkpoint ends bit-equal to an uninterrupted run.

    The Trainer saves ``optimizer.state_dict()`` with ``torch.save`` and loads
    it back with ``torch.load``; its model is rebuilt from the same seed.
    """
    transformers = pytest.importorskip("transformers")
    from optiplug_integrations.transformers import optimizer_cls_and_kwargs

    def run(where: Path, resume: str | None = None) -> torch.nn.Module:
        torch.manual_seed(0)
        config = transformers.GPT2Config(
            n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0
        )
        args = transformers.TrainingArguments(
            output_dir=str(where),
            max_steps=8,
            per_device_train_batch_size=4,
            save_strategy="steps",
            save_steps=4,
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        )
        data = torch.randint(0, 32, (32, 8), generator=torch.Generator().manual_seed(0))
        examples = [{"input_ids": row, "labels": row} for row in data]
        trainer = transformers.Trainer(
            model=transformers.GPT2LMHeadModel(config),
            args=args,
            train_dataset=examples,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs(name, provider="heavyball", lr=1e-3),
        )
        trainer.train(resume_from_checkpoint=resume)
        model: torch.nn.Module = trainer.model
        return model

    whole = run(tmp_path / "whole")
    resumed = run(tmp_path / "resumed", str(tmp_path / "whole" / "checkpoint-4"))
    expected = dict(whole.named_parameters())
    for key, value in resumed.named_parameters():
        assert torch.equal(value, expected[key]), key


# ------------------------------------------------------------------ (c) memory
def _real_bytes(optimizer: Any) -> int:
    """heavyball's own count of its state (``state_size``), plus the tensors only its groups hold.

    heavyball keeps one step counter as both ``state[...]["step"]`` and the
    group's ``step_count`` (one tensor): it counts once.
    """
    in_state = {id(t) for t in _tensors(optimizer.state)}
    in_groups = {
        id(value): value.numel() * value.element_size()
        for group in optimizer.param_groups
        for key, value in group.items()
        if key != "params" and isinstance(value, torch.Tensor) and id(value) not in in_state
    }
    return int(optimizer.state_size()) + sum(in_groups.values())


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from _tensors(item)


@pytest.mark.parametrize("name", NAMES)
def test_memory_is_exact(registry: optiplug.Registry, name: str) -> None:
    _limited(name, "memory")
    param = _parameter()
    optimizer = registry.create(name, [param], lr=0.01)
    _steps(optimizer, param, 0, 2)
    assert optiplug.memory(optimizer).total == _real_bytes(optimizer)


# ------------------------------------------------------------------ parity with heavyball
@pytest.mark.parametrize("name", NAMES)
def test_same_updates_as_heavyball(registry: optiplug.Registry, name: str) -> None:
    """Three steps of the bridged class equal heavyball's own class, bit for bit.

    heavyball's class runs each step after seeding the global generator as
    the bridge seeds its own (``SEED + step``), so random draws agree.
    """
    entry = ENTRIES[name]
    native_class = getattr(heavyball, entry.target.split(":")[1])
    keywords = {"lr": 0.01, **entry.example_hparams}
    if name == "psgd_lra":  # the bridge resolves rank=None with heavyball's formula
        keywords["rank"] = 4  # round(log2(20 elements))
    mine, theirs = [p for _, p in _model()], [p for _, p in _model()]
    bridged = registry.create(name, mine, **keywords)
    native = native_class(theirs, **keywords)
    for step in range(3):
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            a.grad, b.grad = _gradient(step, a, index), _gradient(step, b, index)
        bridged.step()
        with torch.random.fork_rng():
            torch.manual_seed(SEED + step)
            native.step()
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a.detach(), b.detach())


# ------------------------------------------------------------------ (d) the catalogue
def _library_classes() -> dict[str, type]:
    return {
        name: value
        for name, value in vars(heavyball).items()
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer)
    }


def test_every_heavyball_optimizer_is_registered_or_excluded_with_a_reason() -> None:
    registered = {entry.target.split(":")[1] for entry in CATALOG}
    assert set(_library_classes()) == registered | set(EXCLUDED)
    assert not registered & set(EXCLUDED)
    assert all(len(reason) > 20 for reason in EXCLUDED.values())
    assert heavyball_version() == VERSION


def heavyball_version() -> str:
    from importlib.metadata import version

    return version("heavyball")


@pytest.mark.parametrize("name", NAMES)
def test_catalogue_matches_the_class_signature(name: str) -> None:
    entry = ENTRIES[name]
    cls = getattr(heavyball, entry.target.split(":")[1])
    expected = [
        (p.name, LIBRARY_DEFAULT if p.default is heavyball.chainable.use_default else p.default)
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name not in ("self", "params") and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    assert [(p.name, p.default) for p in entry.params] == expected
    fields = attrs.fields(CONFIGS[name])
    assert [(f.name, f.default) for f in fields] == expected
    assert all(p.rule in RULES for p in entry.params)


@pytest.mark.parametrize("name", NAMES)
def test_spec_records_provenance(registry: optiplug.Registry, name: str) -> None:
    spec = registry.spec(f"heavyball:{name}")
    entry: Entry = ENTRIES[name]
    assert spec.origin is not None
    assert (spec.origin.library, spec.origin.version) == ("heavyball", VERSION)
    assert spec.origin.target == entry.target and spec.origin.paper == entry.paper
    assert spec.train_eval == (name in {"sf_adamw", "msam_laprop"})
    assert spec.example_dtype == "float32"


def test_state_slots_match_the_state_heavyball_keeps(registry: optiplug.Registry) -> None:
    """Declared slots equal the flat state after two steps (mars adds its slot)."""
    for name in ("soap", "psgd_kron", "adamw"):
        for mars in (False, True):
            param = _parameter()
            optimizer = registry.create(name, [param], lr=0.01, mars=mars)
            _steps(optimizer, param, 0, 2)
            group = optimizer.param_groups[0]
            declared = {
                s.name for s in registry.spec(name).state_slots or () if s.present_for(group)
            }
            assert set(optimizer.state_dict()["state"][0]) == declared


# ------------------------------------------------------------------ hyperparameters
@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("soap", "shampoo_beta", 1.0),
        ("soap", "precondition_frequency", 0),
        ("soap", "storage_dtype", "int8"),
        ("soap", "merge_dims", 1),
        ("soap", "palm", "yes"),
        ("psgd_kron", "memory_save_mode", "some_diag"),
        ("psgd_kron", "beta", 1.5),
        ("psgd_kron", "max_size_triangular", 2.5),
        ("ademamix", "betas", (0.9, 0.999)),
        ("adamc", "max_lr", -1.0),
        ("psgd_lra", "rank", 0),
        ("sgd", "warmup_steps", -1),
    ],
)
def test_bad_values_name_field_and_value(
    registry: optiplug.Registry, name: str, field: str, value: Any
) -> None:
    with pytest.raises(HyperparameterError) as caught:
        registry.create(name, [_parameter()], **{field: value})
    assert caught.value.field == field
    assert field in str(caught.value) and name in str(caught.value)


@settings(max_examples=40, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_shampoo_beta_range(value: float) -> None:
    """``shampoo_beta`` is accepted exactly in [0, 1) (heavyball's EMA decay)."""
    config = CONFIGS["soap"]
    if 0.0 <= value < 1.0:
        assert config(shampoo_beta=value).shampoo_beta == value
    else:
        with pytest.raises(HyperparameterError):
            config(shampoo_beta=value)


def test_library_default_keywords_are_left_to_heavyball(registry: optiplug.Registry) -> None:
    """``palm`` and ``compile_step`` keep heavyball's class defaults unless set."""
    optimizer: Any = registry.create("soap", [_parameter()])
    assert optimizer.compile_step is heavyball.SOAP.compile_step
    assert "palm" not in optimizer._bridge_keywords
    forced: Any = registry.create("soap", [_parameter()], palm=True)
    assert forced._bridge_keywords["palm"] is True


def test_unknown_keyword_is_refused_with_a_suggestion(registry: optiplug.Registry) -> None:
    with pytest.raises(HyperparameterError) as caught:
        registry.create("psgd_kron", [_parameter()], precond_lrr=0.1)
    assert caught.value.suggestion == "precond_lr"


def test_psgd_lra_takes_named_parameters(registry: optiplug.Registry) -> None:
    """heavyball's own PSGDLRA fails on (name, tensor) pairs when it picks the rank itself."""
    with pytest.raises(AttributeError):
        heavyball.PSGDLRA([("w", _parameter())])
    optimizer = registry.create("psgd_lra", [("w", _parameter())])
    assert optimizer.param_groups[0]["rank"] == 4  # round(log2(16))


def test_copies_can_step(registry: optiplug.Registry) -> None:
    """A deep copy steps like the original (torch's __getstate__ drops heavyball's chain)."""
    param = _parameter()
    optimizer = registry.create("psgd_kron", [param], lr=0.01)
    _steps(optimizer, param, 0, 2)
    duplicate = copy.deepcopy(optimizer)
    twin = duplicate.param_groups[0]["params"][0]
    _steps(optimizer, param, 2, 2)
    _steps(duplicate, twin, 2, 2)
    assert torch.equal(param.detach(), twin.detach())


# ------------------------------------------------------------------ names and laziness
def test_qualified_names_reach_the_bridge() -> None:
    """In the default registry, the qualified names build heavyball's classes."""
    default = optiplug.default_registry()
    for name in ("heavyball:soap", "heavyball:psgd_kron", "heavyball:lather"):
        optimizer = default.create(name, [_parameter()])
        assert type(optimizer).__module__ == "optiplug_heavyball.optimizers"
    assert default.spec("heavyball:adamw").origin is not None


def test_qualified_name_of_a_clashing_algorithm_builds_the_bridged_class() -> None:
    """``heavyball:adamw`` must be heavyball's AdamW, not the first-party one of the plain name."""
    default = optiplug.default_registry()
    optimizer = default.create("heavyball:adamw", [_parameter()])
    if type(optimizer).__module__ != "optiplug_heavyball.optimizers":
        pytest.xfail(
            "the registry matches implementation records by plain algorithm name, so "
            "heavyball:adamw gets the first-party adamw's implementations (a core fix)"
        )
    assert type(optimizer).__name__ == "AdamW"


def test_docs_page_lists_every_optimizer_with_its_status() -> None:
    page = Path(__file__).parents[1] / "docs" / "bridges" / "heavyball.md"
    text = page.read_text(encoding="utf-8")
    for entry in CATALOG:
        status = "limited" if entry.limitation else "passes"
        row = f"| `{entry.name}` | `heavyball.{entry.target.split(':')[1]}` |"
        line = next((line for line in text.splitlines() if line.startswith(row)), "")
        assert line, f"{entry.name} missing from {page.name}"
        assert f"| {status}" in line, f"{entry.name}: status should be {status}"
    for name in EXCLUDED:
        assert f"`{name}`" in text


def test_listing_imports_neither_torch_nor_heavyball() -> None:
    code = (
        "import sys, optiplug; names = optiplug.optimizers(); "
        "assert 'heavyball:soap' in names or 'soap' in names, names; "
        "assert 'torch' not in sys.modules and 'heavyball' not in sys.modules, "
        "[m for m in ('torch', 'heavyball') if m in sys.modules]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


_COMPILED_KL_SOAP = """
import torch, heavyball, optiplug
assert heavyball.utils.compile_mode == "max-autotune-no-cudagraphs"  # heavyball's default
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 64))
optimizer = optiplug.create("heavyball:kl_soap", model.named_parameters(), lr=1e-3)
for step in range(2):
    for index, param in enumerate(model.parameters()):
        generator = torch.Generator().manual_seed(1000 + 100 * index + step)
        param.grad = torch.randn(param.shape, generator=generator)
    optimizer.step()
assert all(torch.isfinite(p).all() for p in model.parameters())
print("stepped")
"""


@pytest.mark.slow
def test_kl_soap_compiles_on_cpu_with_heavyballs_default_mode() -> None:
    """kl_soap's second step (its first preconditioned one) compiles on CPU in a fresh process.

    It raised InductorError (an AssertionError rendering the epilogue of
    Inductor's C++ batched-GEMM template, which max-autotune offers on CPU);
    the bridge offers the GEMM autotuning ATen's kernels only on CPU.
    """
    done = subprocess.run(
        [sys.executable, "-c", _COMPILED_KL_SOAP],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0 and "stepped" in done.stdout, done.stderr[-3000:]

"""The pytorch-optimizer bridge: every bridged optimizer, table-driven over the catalogue.

Each optimizer of ``pytorch_optimizer.optimizer.OPTIMIZERS`` is checked on CPU:
optiplug's conformance suite, a checkpoint round trip through
:mod:`optiplug.checkpoint` whose resume is bit-equal to an uninterrupted run,
an exact memory report, and its schema against the installed class. One
that cannot pass says why in its ``origin.limitation`` and is skipped with
that reason. The checks run against a registry holding only the bridge, so
every optimizer is reachable by its plain name (``adam``, ``sgd`` and
``lion`` are first-party names in the default registry).
"""

from __future__ import annotations

import copy
import importlib.metadata
import inspect
import math
import pickle
import subprocess
import sys
import textwrap
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytorch_optimizer")

import torch
from pytorch_optimizer.base.exception import NegativeLRError, NegativeStepError
from pytorch_optimizer.optimizer import OPTIMIZERS

import optiplug
from optiplug import checkpoint, testing
from optiplug.base import set_training, training_step
from optiplug.errors import HyperparameterError
from optiplug_pytorch_optimizer import plugin as bridge
from optiplug_pytorch_optimizer.catalog import ENTRIES, VERSION
from optiplug_pytorch_optimizer.optimizers import pack_value, unpack_value
from optiplug_pytorch_optimizer.table import REQUIRED, Entry, LibraryDefault, Param

PRIORITY = ("adan", "lamb", "soap")
"""Checked in full (200-step convergence too) in the default run; the rest's is slow."""

BY_NAME = {entry.name: entry for entry in ENTRIES}

LIBRARY_ERRORS = (ValueError, NegativeLRError, NegativeStepError)
"""What the library's ``validate_*`` checks raise."""


PASSING_FLOOR = 123
"""Optimizers that pass every check; a change that lowers it is a regression.

(123 since SpectralSphere is limited: this file's checks gave it one matrix,
the catalogue's network also gives it biases, which it refuses upstream.)"""


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    """A registry holding only the bridge (plain names are unambiguous there)."""
    registry = optiplug.Registry(autoload=False)
    info = registry.register(bridge, bridge.PLUGIN, distribution="optiplug-pytorch-optimizer")
    assert info.status == "active", info.error
    return registry


def _skip_limited(entry: Entry) -> None:
    if entry.limitation:
        pytest.skip(f"{entry.name}: {entry.limitation}")


def _ids(entries: Any) -> list[str]:
    return [entry.name for entry in entries]


# ------------------------------------------------------------------ catalogue vs library
def test_catalogue_lists_every_library_optimizer() -> None:
    assert sorted(BY_NAME) == sorted(OPTIMIZERS)
    for name, cls in OPTIMIZERS.items():
        assert BY_NAME[name].target == f"{cls.__module__}:{cls.__qualname__}", name
    assert importlib.metadata.version("pytorch-optimizer") == VERSION
    names = [bridge.class_name(entry) for entry in ENTRIES]
    assert len(set(names)) == len(names), "wrapper class names must be unique"


def _library_default(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return LibraryDefault(str(value))
    literal = value is None or type(value) in (bool, int, float, str, tuple)
    return value if literal else LibraryDefault(getattr(value, "__qualname__", None) or repr(value))


@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_schema_matches_the_class_signature(entry: Entry) -> None:
    cls = OPTIMIZERS[entry.name]
    skipped = {"self", "params", "foreach", "fused"} | ({"model"} if entry.takes_model else set())
    signature = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name not in skipped and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert [p.name for p in signature] == [p.name for p in entry.params]
    for parameter, param in zip(signature, entry.params, strict=True):
        if parameter.default is inspect.Parameter.empty:
            assert param.default is REQUIRED, param.name
        else:
            expected = _library_default(parameter.default)
            same = expected == param.default or (
                isinstance(expected, float) and math.isnan(expected) and math.isnan(param.default)
            )
            assert same, f"{entry.name}.{param.name}: {param.default!r} != {expected!r}"
    flags = {p.name for p in inspect.signature(cls.__init__).parameters.values()}
    assert set(entry.flags) == flags & {"foreach", "fused"}


@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_schema_rejects_what_the_library_rejects(entry: Entry, registry: optiplug.Registry) -> None:
    """A value out of a declared range is refused by the schema, naming the field.

    Where the range is the library's own (read from its checks), the class
    refuses the value too: the catalogue made none of them up.
    """
    _skip_limited(entry)
    for param in entry.params:
        value = _out_of_range(param)
        if value is _NONE:
            continue
        keywords = {**entry.example_hparams, param.name: value}
        with pytest.raises(HyperparameterError) as raised:
            registry.create(entry.name, [_param(entry)], **keywords)
        assert raised.value.field == param.name and param.name in str(raised.value)
        if param.source == "library":
            with pytest.raises(LIBRARY_ERRORS):  # the library's own check
                OPTIMIZERS[entry.name](_library_params(entry), **keywords)


_NONE = object()


def _out_of_range(param: Param) -> Any:
    """A value ``param``'s constraint refuses (``_NONE`` when it has none to test)."""
    head = param.constraint[0] if param.constraint else ""
    integral = param.kind.startswith("int")
    if head == "range":
        return param.constraint[2] + 1.0
    if head in ("lr", "non_negative"):
        return -1 if integral else -1.0
    if head in ("positive", "step"):
        return 0 if integral else -1.0
    if head == "options":
        return "no-such-option"
    return _NONE


def _library_params(entry: Entry) -> list[Any]:
    _, param = _param(entry)
    return [{"params": [param], "use_muon": True}] if entry.muon_groups else [param]


# ------------------------------------------------------------------ conformance
FAST_CHECKS = [c for c in testing.CHECKS if c is not testing.check_quadratic_converges]


@pytest.mark.parametrize("check", FAST_CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_conformance(entry: Entry, check: Any, registry: optiplug.Registry) -> None:
    _skip_limited(entry)
    reason = dict(entry.deviations).get(check.__name__)
    if reason:
        pytest.skip(f"{entry.name}: {reason}")
    check(entry.name, registry=registry)


@pytest.mark.parametrize("name", PRIORITY)
def test_priority_optimizers_converge(name: str, registry: optiplug.Registry) -> None:
    testing.check_quadratic_converges(name, registry=registry)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_converges(entry: Entry, registry: optiplug.Registry) -> None:
    _skip_limited(entry)
    reason = dict(entry.deviations).get("check_quadratic_converges")
    if reason:
        pytest.skip(f"{entry.name}: {reason}")
    testing.check_quadratic_converges(entry.name, registry=registry)


# ------------------------------------------------------------------ checkpoint and memory
def _param(entry: Entry, seed: int = 0) -> tuple[str, torch.nn.Parameter]:
    dtype = getattr(torch, entry.example_dtype or "float64")
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(4, 4, generator=generator, dtype=torch.float64).to(dtype)
    return ("layer.weight", torch.nn.Parameter(weight))


def _steps(optimizer: Any, param: torch.nn.Parameter, count: int) -> None:
    """``count`` steps on ``||W - T||^2`` (train mode for schedule-free, as its docs say).

    Each is :func:`optiplug.base.training_step`'s: with a closure, or a kept
    graph, where the spec asks for one.
    """
    set_training(optimizer, True)
    target = torch.linspace(-1.0, 1.0, param.numel(), dtype=param.dtype).view_as(param)
    for _ in range(count):
        training_step(optimizer, lambda: ((param - target) ** 2).sum())
    set_training(optimizer, False)


@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_checkpoint_resume_is_bit_equal(
    entry: Entry, registry: optiplug.Registry, tmp_path: Path
) -> None:
    _skip_limited(entry)
    name, param = _param(entry)
    original = registry.create(entry.name, [(name, param)], **entry.example_hparams)
    _steps(original, param, 2)
    checkpoint.save(tmp_path / "ckpt", original)
    twin = torch.nn.Parameter(param.detach().clone())
    _steps(original, param, 2)  # the uninterrupted run

    resumed = registry.create(entry.name, [(name, twin)], **entry.example_hparams)
    checkpoint.load(tmp_path / "ckpt", resumed)
    _steps(resumed, twin, 2)
    assert torch.equal(param.detach(), twin.detach()), f"{entry.name}: resume diverged"
    assert testing.same_state_value(
        original.state_dict()["state"], resumed.state_dict()["state"]
    ), f"{entry.name}: resumed state differs"


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
    """Bytes of every distinct storage the state and the groups' tensor values hold."""
    params = {p.untyped_storage().data_ptr() for g in optimizer.param_groups for p in g["params"]}
    seen: dict[int, int] = {}
    values = list(optimizer.state.values())
    values += [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    for tensor in _storages(values):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("entry", ENTRIES, ids=_ids(ENTRIES))
def test_memory_report_is_exact(entry: Entry, registry: optiplug.Registry) -> None:
    _skip_limited(entry)
    reason = dict(entry.deviations).get("memory")
    if reason:
        pytest.skip(f"{entry.name}: {reason}")
    name, param = _param(entry)
    optimizer = registry.create(entry.name, [(name, param)], **entry.example_hparams)
    _steps(optimizer, param, 2)
    assert optiplug.memory(optimizer).total == _real_bytes(optimizer)


# ------------------------------------------------------------------ registry and listing
def test_every_optimizer_is_listed_with_its_origin() -> None:
    registry = optiplug.default_registry()
    for entry in ENTRIES:
        spec = registry.spec(f"{bridge.PLUGIN}:{entry.name}")
        assert spec.origin is not None and spec.origin.library == "pytorch-optimizer"
        assert spec.origin.version == VERSION and spec.origin.limitation == entry.limitation
        assert spec.origin.target == entry.target


def test_a_limited_optimizer_says_why() -> None:
    limited = [entry for entry in ENTRIES if entry.limitation]
    assert all(not entry.limitation.startswith("UNREVIEWED") for entry in limited)
    assert len(ENTRIES) - len(limited) >= PASSING_FLOOR


def test_adan_takes_three_betas_and_names_a_bad_one(registry: optiplug.Registry) -> None:
    _, param = _param(BY_NAME["adan"])
    optimizer = registry.create("adan", [param], betas=(0.9, 0.9, 0.9))
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.9, 0.9)
    with pytest.raises(HyperparameterError, match="beta3"):
        registry.create("adan", [param], betas=(0.9, 0.9, 1.5))
    with pytest.raises(HyperparameterError, match="betas"):
        registry.create("adan", [param], betas=(0.9, 0.99))


def test_the_implementation_is_reported_honestly(registry: optiplug.Registry) -> None:
    """Adan names ``foreach``: the wrapper offers loop/foreach; SOAP names neither: ``default``."""
    _, param = _param(BY_NAME["adan"])
    assert registry.create("adan", [param], impl="loop").param_groups[0]["foreach"] is False
    assert registry.create("soap", [param]).impl == "default"
    with pytest.raises(HyperparameterError, match="impl"):
        registry.create("soap", [param], impl="fused")


# ------------------------------------------------------------------ the wrapper's adaptations
def _resume(
    name: str, registry: optiplug.Registry, tmp_path: Path, before: int, after: int, **hparams: Any
) -> tuple[Any, Any, torch.nn.Parameter, torch.nn.Parameter]:
    """``before`` steps, a checkpoint, ``after`` more; a fresh optimizer resumed for ``after``.

    Returns:
        ``(original, resumed, its parameter, the resumed one's)``.
    """
    label, param = _param(BY_NAME[name])
    hparams = {**BY_NAME[name].example_hparams, **hparams}
    original = registry.create(name, [(label, param)], **hparams)
    _steps(original, param, before)
    checkpoint.save(tmp_path / "ckpt", original)
    twin = torch.nn.Parameter(param.detach().clone())
    _steps(original, param, after)
    resumed = registry.create(name, [(label, twin)], **hparams)
    checkpoint.load(tmp_path / "ckpt", resumed)
    _steps(resumed, twin, after)
    return original, resumed, param, twin


def _assert_same_run(original: Any, resumed: Any, param: Any, twin: Any) -> None:
    assert torch.equal(param.detach(), twin.detach())
    assert testing.same_state_value(original.state_dict(), resumed.state_dict())


@pytest.mark.parametrize(
    ("name", "hparams"),
    [
        # a momentum reset at steps 2, 5, 8 (a new cosine warmup, stepped after it) and new
        # masks of half the entries, drawn from the wrapper's own stream
        ("spam", {"update_proj_gap": 3, "warmup_epoch": 4, "density": 0.5, "grad_accu_steps": 1}),
        ("stablespam", {"update_proj_gap": 3, "t_max": 6}),  # its warmup decays over 6 steps
        ("ranger21", {"lookahead_merge_time": 3, "num_iterations": 12}),  # merges, warm-down
    ],
)
def test_optimizer_wide_state_resumes_bit_equal(
    name: str, hparams: dict[str, Any], registry: optiplug.Registry, tmp_path: Path
) -> None:
    """State kept outside ``optimizer.state[param]`` (counters, attributes, a nested warmup).

    It travels in the first param group (``global:``/``attr:`` keys), so a run
    resumed across momentum resets, warmups and lookahead merges matches.
    """
    original, resumed, param, twin = _resume(name, registry, tmp_path, 2, 7, **hparams)
    _assert_same_run(original, resumed, param, twin)
    saved = original.state_dict()
    assert set(saved) == {"state", "param_groups"}  # the class's own top-level keys left out
    carried = {k for k in saved["param_groups"][0] if k.startswith(("global:", "attr:"))}
    assert carried == {k for k in BY_NAME[name].group_state if ":" in k}
    assert not any(":" in key for key in resumed.param_groups[0])  # put back when loaded
    if name != "ranger21":
        assert original.warmup.state_dict() == resumed.warmup.state_dict()


def test_the_own_random_stream_resumes_and_leaves_the_global_one_alone(
    registry: optiplug.Registry, tmp_path: Path
) -> None:
    """Kron's preconditioner updates draw from the wrapper's stream, saved with the state."""
    original, resumed, param, twin = _resume("kron", registry, tmp_path, 3, 6)
    _assert_same_run(original, resumed, param, twin)
    before = torch.get_rng_state()
    _steps(resumed, twin, 2)
    assert torch.equal(torch.get_rng_state(), before)
    assert resumed.bridge_rng_step == original.bridge_rng_step + 2


@pytest.mark.parametrize(
    ("name", "slot", "head"),
    [
        ("aggmo", "momentum_buffer", "dict"),
        ("adashift", "grad_queue", "deque"),
        ("dash", "blocks", "list"),
        ("conda", "projector", "object"),
        ("scalableshampoo", "pre_conditioner", "object"),
    ],
)
def test_nested_state_is_kept_packed_between_steps(
    name: str, slot: str, head: str, registry: optiplug.Registry, tmp_path: Path
) -> None:
    """A slot holding containers or helper objects is a list of tensors plus a layout tuple."""
    original, resumed, param, twin = _resume(name, registry, tmp_path, 2, 3)
    _assert_same_run(original, resumed, param, twin)
    state = original.state[param]
    assert all(isinstance(t, torch.Tensor) for t in state[slot])
    assert state[f"{slot}:layout"][0] == head
    rebuilt = unpack_value(state[f"{slot}:layout"], state[slot])
    tensors, layout = pack_value(rebuilt)
    assert layout == state[f"{slot}:layout"] and all(map(torch.equal, tensors, state[slot]))


def test_aggmo_keys_its_buffers_by_beta(registry: optiplug.Registry) -> None:
    _, param = _param(BY_NAME["aggmo"])
    optimizer = registry.create("aggmo", [param], betas=(0.0, 0.5, 0.9))
    _steps(optimizer, param, 2)
    state = optimizer.state[param]
    buffers = unpack_value(state["momentum_buffer:layout"], state["momentum_buffer"])
    assert list(buffers) == [0.0, 0.5, 0.9]
    assert torch.equal(buffers[0.0], param.grad)  # beta 0: the last gradient itself


def test_pack_value_round_trips_nested_values() -> None:
    value = {
        "queue": deque([torch.ones(2), torch.zeros(2)], maxlen=3),
        "size": torch.Size([2, 3]),
        "pairs": [(1, "a"), (2.5, None)],
        "view": torch.arange(6.0).view(2, 3).t(),
    }
    tensors, layout = pack_value(value)
    assert all(isinstance(item, (str, int, float, type(None))) for item in layout)
    back = unpack_value(layout, tensors)
    assert back["queue"].maxlen == 3 and isinstance(back["size"], torch.Size)
    assert back["pairs"] == [(1, "a"), (2.5, None)]
    assert torch.equal(back["view"], value["view"]) and back["view"].is_contiguous()
    with pytest.raises(KeyError):
        unpack_value(("object", "os.system", 0), [])  # only the library's helper classes


@pytest.mark.parametrize("name", ["flashadamw", "ranger21", "adopt"])
def test_copies_keep_the_attributes_the_class_set(name: str, registry: optiplug.Registry) -> None:
    """Deep and pickled copies carry the class's settings and counters, and step identically.

    torch's ``Optimizer.__getstate__`` keeps only defaults, state and groups;
    FlashAdamW's ``state_dict`` reads ``compress_state_dict``, Ranger21 counts
    ``lookahead_step``, ADOPT keeps its default ``clip_lambda`` (a lambda,
    pickled as a reference to the default).
    """
    label, param = _param(BY_NAME[name])
    optimizer = registry.create(name, [(label, param)], **BY_NAME[name].example_hparams)
    _steps(optimizer, param, 2)
    for copy_ in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        twin = copy_.param_groups[0]["params"][0]
        _steps(copy_, twin, 3)
        _steps(optimizer, param, 3)
        assert torch.equal(param.detach(), twin.detach()), name
        param.data.copy_(twin.detach())  # the next copy starts where this one ended
        optimizer = copy_


def test_adammini_partitions_the_given_parameters_by_name(registry: optiplug.Registry) -> None:
    """AdamMini takes a model: the wrapper gives it a module holding the named parameters."""
    generator = torch.Generator().manual_seed(0)
    named = [
        (name, torch.nn.Parameter(torch.randn(4, 4, generator=generator, dtype=torch.float64)))
        for name in ("model.embed.weight", "model.mlp.weight")
    ]
    optimizer = registry.create("adammini", named, lr=0.01)
    assert [group["name"] for group in optimizer.param_groups] == [n for n, _ in named]

    def loss() -> torch.Tensor:
        return sum((((p - 1.0) ** 2).sum() for _, p in named), torch.tensor(0.0))

    before = float(loss().detach())
    training_step(optimizer, loss)
    assert float(loss().detach()) < before
    embed, other = (optimizer.state[p] for _, p in named)
    assert "v" in embed and "v_mean" not in embed  # an embedding block: per-entry v
    assert "v_mean" in other and "v" not in other  # the rest: one mean
    with pytest.raises(TypeError, match="own param groups"):
        registry.create("adammini", [{"params": [named[0][1]]}])


def test_alig_with_momentum_resumes_bit_equal(registry: optiplug.Registry, tmp_path: Path) -> None:
    """AliG takes a closure; with momentum it keeps a buffer (declared ``when="momentum"``)."""
    original, resumed, param, twin = _resume("alig", registry, tmp_path, 2, 3, momentum=0.9)
    _assert_same_run(original, resumed, param, twin)
    assert set(original.state[param]) == {"momentum_buffer"}


def test_closure_and_second_order_optimizers_say_so(registry: optiplug.Registry) -> None:
    """The spec says how a step is taken; :func:`optiplug.base.training_step` follows it."""
    for name in ("alig", "bsam", "lbfgs"):
        assert registry.spec(name).step_closure and not registry.spec(name).create_graph
    for name in ("adahessian", "sophiah"):
        assert registry.spec(name).create_graph and not registry.spec(name).step_closure
    assert not registry.spec("adan").step_closure and not registry.spec("adan").create_graph


def test_listing_imports_neither_torch_nor_the_library() -> None:
    code = textwrap.dedent(
        """
        import sys, optiplug
        names = optiplug.optimizers()
        assert "pytorch_optimizer:adan" in names or "adan" in names, names
        assert "torch" not in sys.modules and "pytorch_optimizer" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_docs_page_lists_every_optimizer_with_its_status() -> None:
    page = Path(__file__).parents[1] / "docs" / "bridges" / "pytorch_optimizer.md"
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `")
    }
    assert sorted(rows) == sorted(BY_NAME)
    for entry in ENTRIES:
        expected = f"limited: {entry.limitation}" if entry.limitation else "| passes"
        assert expected in rows[entry.name], entry.name
        assert entry.target in rows[entry.name]


@pytest.mark.slow
@pytest.mark.parametrize("name", PRIORITY)
def test_hf_trainer_resume_is_bit_equal(name: str, tmp_path: Path) -> None:
    """A Trainer resumed from its step-10 checkpoint ends bit-equal to the uninterrupted run."""
    pytest.importorskip("transformers")
    from test_integration_transformers import STEPS, Tokens, arguments, tiny_gpt2
    from transformers import Trainer

    from optiplug_integrations.transformers import optimizer_cls_and_kwargs

    def trainer(output_dir: Path) -> Trainer:
        # provider= rather than "pytorch_optimizer:soap": the qualified name loses its
        # qualifier in the recipe, and heavyball provides a soap too
        cls_and_kwargs = optimizer_cls_and_kwargs(name, provider=bridge.PLUGIN, lr=1e-3)
        return Trainer(
            model=tiny_gpt2(),
            args=arguments(output_dir),
            train_dataset=Tokens(),
            optimizer_cls_and_kwargs=cls_and_kwargs,
        )

    whole = trainer(tmp_path / "whole")
    whole.train()
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-10"))
    assert resumed.state.global_step == whole.state.global_step == STEPS
    expected = dict(whole.model.named_parameters())
    for key, value in resumed.model.named_parameters():  # CPU, fp32, same data and kernels
        assert torch.equal(value, expected[key]), key
    assert not torch.equal(tiny_gpt2().lm_head.weight, resumed.model.lm_head.weight)

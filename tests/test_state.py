"""State dict validation and loading: every problem reported, nothing half-applied."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from state_helpers import (
    ALGORITHMS,
    IMPLEMENTATIONS,
    Named,
    clone_named,
    named_params,
    train,
)

import optiplug
from optiplug.errors import StateDictError


def stepped(name: str = "adam", steps: int = 2, impl: str = "loop", **hparams: Any):
    named = named_params()
    optimizer = optiplug.create(name, named, impl=impl, **hparams)
    train(optimizer, named, 0, steps)
    return optimizer, named


@attrs.frozen
class Snapshot:
    params: list[torch.Tensor]
    state: dict[int, dict[str, Any]]
    groups: list[dict[str, Any]]


def snapshot(optimizer: torch.optim.Optimizer) -> Snapshot:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.state[p].items()}
        for i, p in enumerate(params)
        if p in optimizer.state
    }
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return Snapshot([p.detach().clone() for p in params], state, copy.deepcopy(groups))


def assert_unchanged(optimizer: torch.optim.Optimizer, before: Snapshot) -> None:
    after = snapshot(optimizer)
    for old, new in zip(before.params, after.params, strict=True):
        assert torch.equal(old, new)
    assert after.state.keys() == before.state.keys()
    for index, entry in before.state.items():
        assert after.state[index].keys() == entry.keys()
        for key, value in entry.items():
            found = after.state[index][key]
            assert torch.equal(found, value) and found.dtype == value.dtype
    assert after.groups == before.groups


def param_state(sd: dict[str, Any], name: str) -> dict[str, Any]:
    group = sd["param_groups"][0]
    return sd["state"][group["params"][group["param_names"].index(name)]]


def group0(sd: dict[str, Any]) -> dict[str, Any]:
    return sd["param_groups"][0]


# ------------------------------------------------------------------ mutations
def _pop(key: str) -> Callable[[dict], dict]:
    def mutate(sd: dict) -> dict:
        del sd[key]
        return sd

    return mutate


def _set_group(key: str, value: Any) -> Callable[[dict], dict]:
    def mutate(sd: dict) -> dict:
        group0(sd)[key] = value
        return sd

    return mutate


def _del_group(key: str) -> Callable[[dict], dict]:
    def mutate(sd: dict) -> dict:
        del group0(sd)[key]
        return sd

    return mutate


def _set_slot(name: str, slot: str, make: Callable[[Any], Any]) -> Callable[[dict], dict]:
    def mutate(sd: dict) -> dict:
        entry = param_state(sd, name)
        entry[slot] = make(entry.get(slot))
        return sd

    return mutate


def _del_slot(name: str, slot: str) -> Callable[[dict], dict]:
    def mutate(sd: dict) -> dict:
        del param_state(sd, name)[slot]
        return sd

    return mutate


def _poke(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def make(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        tensor.view(-1)[0] = value
        return tensor

    return make


def _extra_group(sd: dict) -> dict:
    sd["param_groups"].append({**group0(sd), "params": [], "param_names": []})
    return sd


def _shrunk_unnamed_group(sd: dict) -> dict:
    del group0(sd)["param_names"]
    group0(sd)["params"] = group0(sd)["params"][:-1]
    return sd


def _rename(sd: dict) -> dict:
    group0(sd)["param_names"] = ["w", "bias", "v"]
    return sd


def _duplicate_names(sd: dict) -> dict:
    group0(sd)["param_names"] = ["w", "w", "v"]
    return sd


def _duplicate_ids(sd: dict) -> dict:
    group0(sd)["params"] = [0, 0, 2]
    return sd


def _float_ids(sd: dict) -> dict:
    group0(sd)["params"] = [0.0, 1, 2]
    return sd


def _orphan(sd: dict) -> dict:
    sd["state"][99] = copy.deepcopy(param_state(sd, "v"))
    return sd


def _extra_top(sd: dict) -> dict:
    sd["extra"] = 1
    return sd


def _entry_tensor(sd: dict) -> dict:
    group = group0(sd)
    sd["state"][group["params"][1]] = torch.zeros(3)
    return sd


def _sparse(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_sparse()


@attrs.frozen
class Case:
    """One bad state dict: how to make it, the problem kind, and the culprit it names."""

    id: str
    mutate: Callable[[dict], Any]
    kind: str
    culprit: str
    target: tuple[str, dict[str, Any]] = ("adam", {"amsgrad": True})


BAD_CASES = [
    Case("not-a-mapping", lambda sd: [sd], "type", "state dict"),
    Case("missing-state", _pop("state"), "missing-key", "slot 'state'"),
    Case("missing-param-groups", _pop("param_groups"), "missing-key", "slot 'param_groups'"),
    Case("extra-top-level-key", _extra_top, "unexpected-key", "'extra'"),
    Case("extra-group", _extra_group, "group-count", "param_groups"),
    Case("unnamed-group-too-small", _shrunk_unnamed_group, "group-size", "group 0"),
    Case("renamed-parameter", _rename, "missing-parameter", "parameter b"),
    Case("duplicate-parameter-names", _duplicate_names, "duplicate-name", "'w'"),
    Case("duplicate-parameter-ids", _duplicate_ids, "duplicate-id", "slot 'params'"),
    Case("float-parameter-ids", _float_ids, "type", "slot 'params'"),
    Case("state-of-unknown-parameter", _orphan, "orphan-state", "parameter #99"),
    Case("state-entry-not-a-dict", _entry_tensor, "type", "parameter b"),
    Case(
        "missing-slot",
        _del_slot("b", "exp_avg_sq"),
        "missing-slot",
        "parameter b, slot 'exp_avg_sq'",
    ),
    Case(
        "unexpected-slot",
        _set_slot("b", "momentum_buffer", lambda _: torch.zeros(3)),
        "unexpected-slot",
        "parameter b, slot 'momentum_buffer'",
    ),
    Case(
        "transposed-moment",
        _set_slot("w", "exp_avg", lambda t: t.t()),
        "shape",
        "parameter w, slot 'exp_avg'",
    ),
    Case(
        "broadcastable-moment",
        _set_slot("v", "exp_avg", lambda t: t[:1].clone()),
        "shape",
        "parameter v, slot 'exp_avg'",
    ),
    Case(
        "step-with-shape-1",
        _set_slot("v", "step", lambda t: t.reshape(1)),
        "shape",
        "parameter v, slot 'step'",
    ),
    Case(
        "int64-moment",
        _set_slot("w", "exp_avg", lambda t: t.long()),
        "dtype",
        "parameter w, slot 'exp_avg'",
    ),
    Case(
        "fp16-moment-for-fp32-param",
        _set_slot("w", "exp_avg_sq", lambda t: t.half()),
        "dtype",
        "slot 'exp_avg_sq'",
    ),
    Case(
        "fp64-moment-for-fp32-param",
        _set_slot("b", "exp_avg", lambda t: t.double()),
        "dtype",
        "parameter b",
    ),
    Case(
        "int-tensor-step",
        _set_slot("b", "step", lambda t: t.long()),
        "dtype",
        "parameter b, slot 'step'",
    ),
    Case(
        "python-int-step", _set_slot("b", "step", lambda t: 2), "type", "parameter b, slot 'step'"
    ),
    Case(
        "nan-moment",
        _set_slot("w", "exp_avg", _poke(math.nan)),
        "non-finite",
        "parameter w, slot 'exp_avg'",
    ),
    Case(
        "inf-max-moment",
        _set_slot("v", "max_exp_avg_sq", _poke(math.inf)),
        "non-finite",
        "slot 'max_exp_avg_sq'",
    ),
    Case(
        "negative-second-moment",
        _set_slot("v", "exp_avg_sq", _poke(-1.0)),
        "negative",
        "parameter v, slot 'exp_avg_sq'",
    ),
    Case(
        "negative-step",
        _set_slot("w", "step", lambda t: torch.tensor(-1.0)),
        "negative",
        "parameter w, slot 'step'",
    ),
    Case(
        "fractional-step",
        _set_slot("w", "step", lambda t: torch.tensor(2.5)),
        "non-integral",
        "parameter w, slot 'step'",
    ),
    Case(
        "moment-as-list",
        _set_slot("w", "exp_avg", lambda t: t.tolist()),
        "type",
        "parameter w, slot 'exp_avg'",
    ),
    Case(
        "sparse-moment", _set_slot("b", "exp_avg", _sparse), "layout", "parameter b, slot 'exp_avg'"
    ),
    Case("negative-lr", _set_group("lr", -1.0), "hyperparameter", "slot 'lr'"),
    Case("beta-of-one", _set_group("betas", (1.0, 0.9)), "hyperparameter", "slot 'betas'"),
    Case("zero-eps", _set_group("eps", 0.0), "hyperparameter", "slot 'eps'"),
    Case(
        "string-weight-decay",
        _set_group("weight_decay", "0.1"),
        "hyperparameter",
        "slot 'weight_decay'",
    ),
    Case("unknown-group-key", _set_group("nesterov", True), "unexpected-key", "slot 'nesterov'"),
    # (a key left at its default may be absent: a checkpoint older than the key; see below)
    Case(
        "missing-group-key",
        _del_group("lr"),
        "missing-key",
        "slot 'lr'",
        target=("adam", {"amsgrad": True, "lr": 0.05}),
    ),
    Case(
        "amsgrad-on-at-save-off-at-load",
        lambda sd: sd,
        "hyperparameter-mismatch",
        "slot 'amsgrad'",
        target=("adam", {"amsgrad": False}),
    ),
    Case(
        "amsgrad-flipped-in-saved-group",
        _set_group("amsgrad", False),
        "hyperparameter-mismatch",
        "slot 'amsgrad'",
    ),
    Case(
        "adam-state-into-sgd",
        lambda sd: sd,
        "foreign-state",
        "state of adam",
        target=("sgd", {"momentum": 0.9}),
    ),
    Case(
        "adam-state-into-adamw",
        lambda sd: sd,
        "hyperparameter-mismatch",
        "slot 'decoupled_weight_decay'",
        target=("adamw", {"amsgrad": True}),
    ),
]


def test_the_table_has_at_least_thirty_distinct_cases() -> None:
    assert len({case.id for case in BAD_CASES}) == len(BAD_CASES) >= 30


@pytest.fixture(scope="module")
def saved_adam() -> dict[str, Any]:
    optimizer, _ = stepped("adam", amsgrad=True)
    return copy.deepcopy(optimizer.state_dict())


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda case: case.id)
def test_bad_state_dict_is_rejected_and_changes_nothing(case: Case, saved_adam: dict) -> None:
    name, hparams = case.target
    target, _ = stepped(name, steps=1, **hparams)
    before = snapshot(target)
    bad = case.mutate(copy.deepcopy(saved_adam))
    with pytest.raises(StateDictError) as raised:
        target.load_state_dict(bad)
    matching = [p for p in raised.value.problems if p.kind == case.kind and case.culprit in str(p)]
    assert matching, str(raised.value)
    assert case.culprit in str(raised.value)
    assert_unchanged(target, before)
    with pytest.raises(StateDictError) as again:
        optiplug.load_state_dict(target, bad)
    assert again.value.problems == raised.value.problems
    assert optiplug.validate_state_dict(target, bad) == list(raised.value.problems)
    assert_unchanged(target, before)


def test_adam_into_sgd_names_both_algorithms(saved_adam: dict) -> None:
    target, _ = stepped("sgd", momentum=0.9)
    problems = optiplug.validate_state_dict(target, saved_adam)
    foreign = [p for p in problems if p.kind == "foreign-state"]
    assert len(foreign) == 1
    assert "sgd" in foreign[0].expected and "adam" in foreign[0].found
    assert "momentum_buffer" in foreign[0].expected and "exp_avg" in foreign[0].found


def test_every_problem_is_reported_at_once_and_sorted(saved_adam: dict) -> None:
    target, _ = stepped("adam", amsgrad=True)
    bad = copy.deepcopy(saved_adam)
    group0(bad)["lr"] = -1.0
    param_state(bad, "w")["exp_avg"] = param_state(bad, "w")["exp_avg"].half()
    param_state(bad, "v")["exp_avg_sq"] = _poke(math.nan)(param_state(bad, "v")["exp_avg_sq"])
    del param_state(bad, "b")["step"]
    problems = optiplug.validate_state_dict(target, bad)
    assert [(p.parameter, p.slot, p.kind) for p in problems] == [
        ("", "lr", "hyperparameter"),
        ("b", "step", "missing-slot"),
        ("v", "exp_avg_sq", "non-finite"),
        ("w", "exp_avg", "dtype"),
    ]
    assert problems == sorted(problems)
    dtype = problems[-1]
    assert (dtype.group, dtype.expected, dtype.found) == (
        0,
        "float32 (the parameter's dtype)",
        "float16",
    )


@pytest.mark.parametrize("name, hparams", ALGORITHMS, ids=[a for a, _ in ALGORITHMS])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_valid_state_dicts_have_no_problems(name: str, hparams: dict, impl: str) -> None:
    optimizer, _ = stepped(name, impl=impl, **hparams)
    assert optiplug.validate_state_dict(optimizer, optimizer.state_dict()) == []
    fresh = optiplug.create(name, named_params(), impl=impl, **hparams)
    assert optiplug.validate_state_dict(fresh, fresh.state_dict()) == []
    assert optiplug.validate_state_dict(fresh, optimizer.state_dict()) == []


# ------------------------------------------------------------------ loading rules
def test_state_follows_parameter_names_not_positions() -> None:
    """Saved over [a, b, c], loaded over [c, a, b] of one shape: steps match the unpermuted run."""
    shapes = {"a": (4,), "b": (4,), "c": (4,)}
    generator = torch.Generator().manual_seed(3)
    start = {n: torch.randn(shapes[n], generator=generator) for n in shapes}

    def make(order: str) -> Named:
        return [(n, torch.nn.Parameter(start[n].clone())) for n in order]

    def run(optimizer, named: Named, steps: range) -> None:
        for step in steps:
            for name, param in named:
                param.grad = param.detach() * (step + 1) + ord(name)
            optimizer.step()

    original = make("abc")
    reference = optiplug.create("adam", original, impl="loop", lr=0.1)
    run(reference, original, range(3))
    saved = copy.deepcopy(reference.state_dict())
    permuted = [(n, torch.nn.Parameter(dict(original)[n].detach().clone())) for n in "cab"]
    resumed = optiplug.create("adam", permuted, impl="loop", lr=0.1)
    resumed.load_state_dict(saved)
    run(reference, original, range(3, 6))
    run(resumed, permuted, range(3, 6))
    for name, param in permuted:
        assert torch.equal(param, dict(original)[name]), name
    positional = [(n, torch.nn.Parameter(start[n].clone())) for n in "cab"]
    plain = torch.optim.Adam([p for _, p in positional], lr=0.1)
    torch.optim.Optimizer.load_state_dict(plain, saved)  # torch matches by position
    run(plain, positional, range(3, 6))
    assert not torch.equal(dict(positional)["a"], dict(original)["a"])


def test_unnamed_state_loads_by_position() -> None:
    source, _ = stepped("adam", amsgrad=True)
    saved = copy.deepcopy(source.state_dict())
    del group0(saved)["param_names"]
    target = optiplug.create("adam", [p for _, p in clone_named(named_params())], amsgrad=True)
    assert optiplug.load_state_dict(target, saved) == []
    for index, param in enumerate(target.param_groups[0]["params"]):
        assert torch.equal(target.state[param]["exp_avg"], saved["state"][index]["exp_avg"])


def test_state_keyed_by_parameter_names_loads_as_torch_distributed_passes_it() -> None:
    source, _ = stepped("adam", amsgrad=True)
    saved = copy.deepcopy(source.state_dict())
    names = group0(saved).pop("param_names")
    saved["state"] = {names[i]: saved["state"][i] for i in group0(saved)["params"]}
    group0(saved)["params"] = list(names)
    target, _ = stepped("adam", steps=0, amsgrad=True)
    assert optiplug.load_state_dict(target, saved) == []
    for name, param in target_named(target):
        assert torch.equal(target.state[param]["exp_avg_sq"], saved["state"][name]["exp_avg_sq"])


@pytest.mark.parametrize("name, hparams", ALGORITHMS, ids=[a for a, _ in ALGORITHMS])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_resume_through_load_state_dict_is_bit_exact(name: str, hparams: dict, impl: str) -> None:
    straight = named_params()
    uninterrupted = optiplug.create(name, straight, impl=impl, **hparams)
    train(uninterrupted, straight, 0, 6)
    first = named_params()
    before = optiplug.create(name, first, impl=impl, **hparams)
    train(before, first, 0, 3)
    saved = before.state_dict()
    second = clone_named(first)
    after = optiplug.create(name, second, impl=impl, **hparams)
    after.load_state_dict(saved)
    train(after, second, 3, 6)
    for (n, p), (_, q) in zip(straight, second, strict=True):
        assert torch.equal(p, q), n


def test_loaded_state_is_copied_not_aliased() -> None:
    source, source_named = stepped("adam", amsgrad=True)
    saved = source.state_dict()
    kept = copy.deepcopy(saved)
    target, _ = stepped("adam", steps=0, amsgrad=True)
    target.load_state_dict(saved)
    for param in target.param_groups[0]["params"]:
        for value in target.state[param].values():
            value.add_(1.0)
    for index, entry in kept["state"].items():
        for key, value in entry.items():
            assert torch.equal(saved["state"][index][key], value), key
    train(source, source_named, 2, 3)
    for index, param in enumerate(target.param_groups[0]["params"]):
        assert torch.equal(target.state[param]["exp_avg"], kept["state"][index]["exp_avg"] + 1)


def test_implementation_flags_stay_the_loading_optimizers() -> None:
    fused, _ = stepped("adamw", impl="fused")
    loop = optiplug.create("adamw", named_params(), impl="loop")
    loop.load_state_dict(fused.state_dict())
    assert loop.impl == "loop"
    assert loop.param_groups[0]["fused"] is False
    assert loop.state[loop.param_groups[0]["params"][0]]["step"].device.type == "cpu"


def test_checkpoint_hyperparameters_win_and_the_change_is_reported() -> None:
    source, _ = stepped("adam", amsgrad=True, lr=0.05)
    target = optiplug.create("adam", named_params(), amsgrad=True, lr=0.001)
    problems = optiplug.load_state_dict(target, source.state_dict())
    assert [(p.kind, p.slot) for p in problems] == [("hyperparameter-changed", "lr")]
    assert "0.001" in problems[0].expected and "0.05" in problems[0].found
    assert target.param_groups[0]["lr"] == 0.05


def test_strict_false_loads_the_valid_part_and_returns_the_rest(saved_adam: dict) -> None:
    target, _ = stepped("adam", steps=1, amsgrad=True)
    b_before = {k: v.clone() for k, v in target.state[dict(target_named(target))["b"]].items()}
    bad = copy.deepcopy(saved_adam)
    param_state(bad, "b")["exp_avg"] = _poke(math.nan)(param_state(bad, "b")["exp_avg"])
    group0(bad)["eps"] = -1.0
    problems = optiplug.load_state_dict(target, bad, strict=False)
    assert {(p.parameter, p.slot, p.kind) for p in problems} == {
        ("b", "exp_avg", "non-finite"),
        ("", "eps", "hyperparameter"),
    }
    params = dict(target_named(target))
    for key, value in b_before.items():
        assert torch.equal(target.state[params["b"]][key], value)
    for name in ("w", "v"):
        for key, value in param_state(saved_adam, name).items():
            assert torch.equal(target.state[params[name]][key], value)
    assert target.param_groups[0]["eps"] == 1e-8


def target_named(optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    group = optimizer.param_groups[0]
    return list(zip(group["param_names"], group["params"], strict=True))


def test_strict_false_still_refuses_a_broken_structure(saved_adam: dict) -> None:
    target, _ = stepped("adam", steps=1, amsgrad=True)
    before = snapshot(target)
    with pytest.raises(StateDictError, match="group-count"):
        optiplug.load_state_dict(target, _extra_group(copy.deepcopy(saved_adam)), strict=False)
    assert_unchanged(target, before)


def test_torch_adamw_state_loads_and_the_next_steps_match_torch() -> None:
    named = named_params()
    reference = torch.optim.AdamW([p for _, p in named], lr=0.01, foreach=False)
    train(reference, named, 0, 3)
    twin = clone_named(named)
    mine = optiplug.create("adamw", twin, impl="loop", lr=0.01)
    mine.load_state_dict(reference.state_dict())
    train(reference, named, 3, 6)
    train(mine, twin, 3, 6)
    for (_, p), (_, q) in zip(named, twin, strict=True):
        assert torch.equal(p, q)


# ------------------------------------------------------------------ schema-less and plugin checks
class _PlainAdamPlugin:
    """A third party registering torch's Adam without a state schema, plus a validation hook."""

    @optiplug.hookimpl
    def optiplug_optimizers(self):
        return [optiplug.OptimizerSpec(name="plainadam", factory=torch.optim.Adam)]

    @optiplug.hookimpl
    def optiplug_validate_state_dict(self, spec, optimizer, state_dict):
        lr = state_dict["param_groups"][0].get("lr", 0)
        if spec.name == "plainadam" and lr > 0.5:
            return [optiplug.Problem(0, "", "lr", "too-fast", "lr <= 0.5", repr(lr))]
        return []


@pytest.fixture
def plain_registry() -> optiplug.Registry:
    registry = optiplug.Registry(autoload=False)
    registry.register(_PlainAdamPlugin(), "plainadam")
    return registry


def _plain(registry: optiplug.Registry, lr: float = 0.01):
    named = named_params()
    optimizer = registry.create("plainadam", [p for _, p in named], lr=lr)
    train(optimizer, named, 0, 2)
    return optimizer


@pytest.mark.parametrize(
    "mutate, kind",
    [
        (
            lambda sd: sd["state"][0].update(exp_avg=_poke(math.inf)(sd["state"][0]["exp_avg"])),
            "non-finite",
        ),
        (lambda sd: sd["state"][0].update(exp_avg=torch.zeros(2, 3)), "shape"),
        (lambda sd: sd["state"][1].update(exp_avg=torch.zeros(3, dtype=torch.int32)), "dtype"),
        (lambda sd: sd["state"][1].update(exp_avg=torch.zeros(3, dtype=torch.float64)), "dtype"),
        (lambda sd: sd["state"][1].update(exp_avg="zeros"), "type"),
        (lambda sd: sd["param_groups"][0].update(lr=math.nan), "hyperparameter"),
    ],
)
def test_schema_less_optimizers_get_generic_checks(plain_registry, mutate, kind) -> None:
    optimizer = _plain(plain_registry)
    before = snapshot(optimizer)
    saved = copy.deepcopy(optimizer.state_dict())
    assert optiplug.validate_state_dict(optimizer, saved) == []
    mutate(saved)
    with pytest.raises(StateDictError) as raised:
        optiplug.load_state_dict(optimizer, saved)
    assert kind in {p.kind for p in raised.value.problems}
    assert_unchanged(optimizer, before)


def test_plugin_validation_hooks_add_problems(plain_registry) -> None:
    fast = _plain(plain_registry, lr=0.9)
    slow = _plain(plain_registry, lr=0.01)
    before = snapshot(slow)
    with pytest.raises(StateDictError, match="too-fast") as raised:
        optiplug.load_state_dict(slow, fast.state_dict())
    assert [p.kind for p in raised.value.problems] == ["too-fast"]
    assert_unchanged(slow, before)


def test_a_crashing_validation_hook_blocks_the_load(plain_registry) -> None:
    class Broken:
        @optiplug.hookimpl
        def optiplug_validate_state_dict(self, spec, optimizer, state_dict):
            raise RuntimeError("validator bug")

    plain_registry.register(Broken(), "broken")
    optimizer = _plain(plain_registry)
    with pytest.raises(StateDictError, match="validator bug"):
        optiplug.load_state_dict(optimizer, optimizer.state_dict())


# ------------------------------------------------------------------ random mutations
def _containers(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every dict or list inside a state dict (tensors and tuples are leaves)."""
    found = [path]
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in list(items):
        if isinstance(item, (dict, list)):
            found += _containers(item, (*path, key))
    return found


def _at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


_FILLS = [0.0, 1.0, -1.0, 2.5, math.nan, math.inf, 1e30]
_TENSORS = st.builds(
    lambda shape, dtype, fill: torch.full(shape, fill).to(dtype),
    st.sampled_from([(), (1,), (2,), (3,), (3, 2), (2, 3)]),
    st.sampled_from(
        [torch.float32, torch.float16, torch.float64, torch.int64, torch.bool, torch.complex64]
    ),
    st.sampled_from(_FILLS),
)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 100),
    st.sampled_from(_FILLS),
    st.text(max_size=4),
    st.tuples(st.floats(allow_nan=True), st.floats(allow_nan=True)),
    st.lists(st.integers(-1, 3), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    _TENSORS,
)


def _mutate(data: st.DataObject, sd: dict) -> None:
    container = _at(sd, data.draw(st.sampled_from(_containers(sd))))
    keys = list(container.keys()) if isinstance(container, dict) else list(range(len(container)))
    tensors = [k for k in keys if torch.is_tensor(container[k])]
    actions = ["set", "delete", "add"] if keys else ["add"]
    action = data.draw(st.sampled_from(actions + (["tensor"] * 3 if tensors else [])))
    if action == "tensor":
        key = data.draw(st.sampled_from(tensors))
        changed = container[key].clone()
        if changed.numel() and changed.is_floating_point() and changed.layout == torch.strided:
            changed.view(-1)[0] = data.draw(st.sampled_from(_FILLS))
        others = [] if changed.is_complex() else [torch.float16, torch.int64]
        dtype = data.draw(st.sampled_from([changed.dtype, *others]))
        container[key] = changed.to(dtype)
        return
    if action == "add":
        if isinstance(container, dict):
            key = data.draw(st.one_of(st.text(max_size=6), st.integers(-2, 5)))
            container[key] = data.draw(_VALUES)
        else:
            container.append(data.draw(_VALUES))
        return
    key = data.draw(st.sampled_from(keys))
    if action == "delete":
        del container[key]
    else:
        container[key] = data.draw(_VALUES)


@pytest.fixture(scope="module")
def random_targets() -> dict[str, tuple]:
    found = {}
    for name, hparams in [("adam", {"amsgrad": True}), ("sgd", {"momentum": 0.9})]:
        optimizer, _ = stepped(name, **hparams)
        found[name] = (optimizer, copy.deepcopy(optimizer.state_dict()))
    return found


@pytest.mark.parametrize("name", ["adam", "sgd"])
@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_mutations_raise_state_dict_error_or_load(name: str, data, random_targets) -> None:
    optimizer, valid = random_targets[name]
    candidate = copy.deepcopy(valid)
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(data, candidate)
    before = snapshot(optimizer)
    try:
        optiplug.load_state_dict(optimizer, candidate)
    except StateDictError as error:
        assert error.problems
        assert_unchanged(optimizer, before)
    finally:
        optimizer.load_state_dict(copy.deepcopy(valid))


# ------------------------------------------------ richer state: numbers, lists, opaque tensors
class _Opaque(torch.Tensor):
    """A tensor subclass implementing no operator (and no ``__tensor_flatten__``)."""

    @staticmethod
    def __new__(cls, like: torch.Tensor) -> _Opaque:
        return torch.Tensor._make_wrapper_subclass(cls, like.shape, dtype=like.dtype)

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        raise NotImplementedError(f"_Opaque implements no {func}")


def _rich_registry() -> optiplug.Registry:
    slots = (
        optiplug.StateSlot("momentum_buffer", when="momentum"),
        optiplug.StateSlot("count", kind="number", constraints=("finite", "integral")),
        optiplug.StateSlot("factors", kind="tensors", dtype="float"),
        optiplug.StateSlot("notes", kind="any"),
    )

    class Plugin:
        @optiplug.hookimpl
        def optiplug_optimizers(self) -> list[optiplug.OptimizerSpec]:
            return [optiplug.OptimizerSpec(name="rich", factory=torch.optim.SGD, state_slots=slots)]

    registry = optiplug.Registry(autoload=False)
    registry.register(Plugin(), "rich")
    return registry


def _rich_state(**changes: Any) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    param = torch.nn.Parameter(torch.ones(2, 3))
    optimizer = _rich_registry().create("rich", [param], lr=0.1, momentum=0.9)
    entry = {
        "momentum_buffer": torch.zeros(2, 3),
        "count": 3,
        "factors": [torch.eye(2), torch.eye(3)],
        "notes": {"any": object},
    }
    groups = [
        {k: v for k, v in g.items() if k != "params"} | {"params": [0]}
        for g in optimizer.param_groups
    ]
    return optimizer, {"state": {0: {**entry, **changes}}, "param_groups": groups}


def test_number_list_and_any_slots_validate_and_load_copied() -> None:
    optimizer, state = _rich_state()
    assert optiplug.load_state_dict(optimizer, state) == []
    loaded = next(iter(optimizer.state.values()))
    assert loaded["count"] == 3 and loaded["notes"] == {"any": object}
    saved = state["state"][0]["factors"]
    assert all(torch.equal(a, b) for a, b in zip(loaded["factors"], saved, strict=True))
    assert loaded["factors"][0].data_ptr() != state["state"][0]["factors"][0].data_ptr()


@pytest.mark.parametrize(
    ("slot", "value", "kind"),
    [
        ("count", 2.5, "non-integral"),
        ("count", torch.tensor(3), "type"),
        ("factors", torch.eye(2), "type"),
        ("factors", [torch.eye(2), torch.tensor([1, 2])], "dtype"),
        ("factors", [torch.tensor([math.nan])], "non-finite"),
        ("momentum_buffer", _Opaque(torch.zeros(2, 3)), "uninspectable"),
    ],
)
def test_each_richer_slot_reports_a_typed_problem(slot: str, value: Any, kind: str) -> None:
    optimizer, state = _rich_state(**{slot: value})
    problems = optiplug.validate_state_dict(optimizer, state)
    assert [(p.slot, p.kind) for p in problems] == [(slot, kind)]
    with pytest.raises(StateDictError):
        optiplug.load_state_dict(optimizer, state)


def test_a_schema_less_optimizer_reports_an_opaque_tensor_instead_of_raising() -> None:
    param = torch.nn.Parameter(torch.ones(2, 3))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    state = {
        "state": {0: {"momentum_buffer": _Opaque(torch.zeros(2, 3))}},
        "param_groups": [{**optimizer.state_dict()["param_groups"][0]}],
    }
    problems = optiplug.validate_state_dict(optimizer, state)
    assert [p.kind for p in problems] == ["uninspectable"]


def test_a_group_key_newer_than_the_checkpoint_loads_at_its_default_only() -> None:
    # muon's weight_decay_mode came after checkpoints that lack it; they ran as its default
    def made(**hparams: Any) -> torch.optim.Optimizer:
        torch.manual_seed(0)
        param = torch.nn.Parameter(torch.randn(8, 8))
        param.grad = torch.randn(8, 8)
        return optiplug.create("muon", [("layer.weight", param)], lr=0.02, **hparams)

    saved = made()
    saved.step()
    old = saved.state_dict()
    for group in old["param_groups"]:
        del group["weight_decay_mode"]
    at_default = made()
    at_default.load_state_dict(old)
    assert at_default.param_groups[0]["weight_decay_mode"] == "decoupled"
    with pytest.raises(StateDictError, match="weight_decay_mode"):
        made(weight_decay_mode="cautious").load_state_dict(old)  # the saved run differed

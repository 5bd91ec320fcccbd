"""Regression tests for the fault campaign's state-dict and hyperparameter defects 3, 4, 12, 15, 16.

Each test is named after what it proves; the defect number is in its docstring.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optiplug
from optiplug import Problem
from optiplug.errors import HyperparameterError, StateDictError

Named = list[tuple[str, torch.nn.Parameter]]
Mutation = Callable[[dict[str, Any]], Any]
ROUTES = [{"algorithm": "adam", "match": "0.*"}, {"algorithm": "adamw", "match": "*"}]
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# ------------------------------------------------------------------ helpers
def _named(shapes: tuple[tuple[int, ...], ...] = ((3, 2), (3, 2))) -> Named:
    generator = torch.Generator().manual_seed(0)
    return [
        (f"{i}.weight", torch.nn.Parameter(torch.randn(shape, generator=generator)))
        for i, shape in enumerate(shapes)
    ]


def _stepped(optimizer: torch.optim.Optimizer, steps: int = 1) -> torch.optim.Optimizer:
    for step in range(steps):
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = torch.full_like(param, 0.5 + step)
        optimizer.step()
    return optimizer


def _multi(routes: list[dict[str, Any]] | None = None) -> Any:
    """A stepped ``multi``: adam on ``0.weight``, adamw on ``1.weight``."""
    return _stepped(optiplug.create("multi", _named(), routes=routes or ROUTES))


def _same(a: Any, b: Any) -> bool:
    """Bit-identical: tensors by bytes (NaN equals itself) and dtype, others by ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bytes(a), _bytes(b))
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8)


@attrs.frozen
class Snapshot:
    """Every sub-optimizer's state tensors and group values, cloned."""

    routes: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]


def _snapshot(multi: Any) -> Snapshot:
    routes = {}
    for route, optimizer in multi.optimizers.items():
        params = [p for g in optimizer.param_groups for p in g["params"]]
        state = [
            {
                k: v.clone() if torch.is_tensor(v) else v
                for k, v in optimizer.state.get(p, {}).items()
            }
            for p in params
        ]
        groups = [copy.copy(g) for g in optimizer.param_groups]
        routes[route] = (state, groups)
    return Snapshot(routes)


def _assert_unchanged(multi: Any, before: Snapshot) -> None:
    after = _snapshot(multi)
    assert after.routes.keys() == before.routes.keys()
    for route, (state, groups) in before.routes.items():
        new_state, new_groups = after.routes[route]
        for old, new in zip(state, new_state, strict=True):
            assert old.keys() == new.keys(), route
            assert all(_same(old[k], new[k]) for k in old), route
        for old_group, new_group in zip(groups, new_groups, strict=True):
            assert old_group.keys() == new_group.keys(), route
            assert all(_same(old_group[k], new_group[k]) for k in old_group), (route, old_group)


def _kinds(problems: Any) -> set[str]:
    return {p.kind for p in problems}


def _refused(multi: Any, state_dict: Any) -> tuple[StateDictError, list[Problem]]:
    """Validate and load ``state_dict``; the load must raise and change nothing."""
    problems = optiplug.validate_state_dict(multi, state_dict)
    before = _snapshot(multi)
    with pytest.raises(StateDictError) as caught:
        multi.load_state_dict(state_dict)
    _assert_unchanged(multi, before)
    return caught.value, problems


# ------------------------------------------------------------------ defect 3
def _duplicate_across_routes(sd: dict[str, Any]) -> None:
    sd["param_groups"][1]["params"] = list(sd["param_groups"][0]["params"])


def _orphans(sd: dict[str, Any]) -> None:
    sd["state"].update({i: {"exp_avg": torch.zeros(1)} for i in range(100, 120)})


def _extra_top_key(sd: dict[str, Any]) -> None:
    sd["extra"] = {"anything": 1}


def _float_ids(sd: dict[str, Any]) -> None:
    sd["param_groups"][1]["params"] = [1.0]
    sd["state"][1.0] = sd["state"].pop(1)


MULTI_WHOLE_DICT_CASES: list[tuple[str, Mutation, str]] = [
    ("duplicate-id-across-routes", _duplicate_across_routes, "duplicate-id"),
    ("orphan-state", _orphans, "orphan-state"),
    ("extra-top-level-key", _extra_top_key, "unexpected-key"),
    ("float-ids", _float_ids, "type"),
]


@pytest.mark.parametrize(
    ("mutate", "kind"),
    [case[1:] for case in MULTI_WHOLE_DICT_CASES],
    ids=[case[0] for case in MULTI_WHOLE_DICT_CASES],
)
def test_multi_checks_the_whole_dict_like_every_optimizer(mutate: Mutation, kind: str) -> None:
    """Defect 3: ids across routes, orphan state, extra keys and float ids are problems."""
    multi = _multi()
    sd = copy.deepcopy(multi.state_dict())
    mutate(sd)
    error, problems = _refused(multi, sd)
    assert kind in _kinds(problems)
    assert kind in _kinds(error.problems)
    assert list(error.problems) == sorted(error.problems)


@SETTINGS
@given(
    orphans=st.sets(st.integers(2, 10**6), max_size=30),
    extra=st.sets(
        st.text(min_size=1, max_size=8).filter(lambda k: k not in {"state", "param_groups"}),
        max_size=3,
    ),
)
def test_multi_reports_every_orphan_and_unexpected_top_key(
    orphans: set[int], extra: set[str]
) -> None:
    """Defect 3: each orphan id and each extra top-level key is its own problem."""
    multi = _multi()
    sd = copy.deepcopy(multi.state_dict())
    sd["state"].update({i: {} for i in orphans})
    sd.update({key: 0 for key in extra})
    problems = optiplug.validate_state_dict(multi, sd)
    assert sorted(p.parameter for p in problems if p.kind == "orphan-state") == sorted(
        f"#{i}" for i in orphans
    )
    assert len([p for p in problems if p.kind == "unexpected-key"]) == len(extra)


# ------------------------------------------------------------------ defect 4
def _raise_hook(*_: Any) -> None:
    raise RuntimeError("injected failure after validation")


FAILURES = ["pre-hook-of-last-route", "post-hook-of-first-route", "post-hook-of-last-route"]


def _inject(multi: Any, failure: str) -> None:
    routes = list(multi.optimizers.values())
    first, last = routes[0], routes[-1]
    if failure == "pre-hook-of-last-route":
        last.register_load_state_dict_pre_hook(_raise_hook)
    elif failure == "post-hook-of-first-route":
        first.register_load_state_dict_post_hook(_raise_hook)
    else:
        last.register_load_state_dict_post_hook(_raise_hook)


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("first_route_non_finite", [False, True], ids=["finite", "non-finite"])
def test_multi_rolls_every_route_back_bit_for_bit(
    failure: str, first_route_non_finite: bool
) -> None:
    """Defect 4: a route failing after validation leaves every route bit-identical."""
    source, multi = _stepped(_multi(), 3), _multi()
    saved = source.state_dict()
    if first_route_non_finite:
        first = multi.optimizers["adam"]
        for entry in first.state.values():
            entry["exp_avg"].fill_(math.nan)
    _inject(multi, failure)
    before = _snapshot(multi)
    with pytest.raises(Exception) as caught:
        multi.load_state_dict(saved)
    assert "injected failure" in str(caught.value) or "injected" in repr(caught.value.__cause__)
    _assert_unchanged(multi, before)


@SETTINGS
@given(data=st.data())
def test_multi_failed_loads_change_nothing(data: st.DataObject) -> None:
    """Defect 4: any refused load (random corruptions) leaves every route bit-identical."""
    multi = _multi()
    sd = copy.deepcopy(_stepped(_multi(), 2).state_dict())
    entry = data.draw(st.sampled_from(sorted(sd["state"])))
    slot = data.draw(st.sampled_from(sorted(sd["state"][entry])))
    negative = [-1.0] if slot in ("step", "exp_avg_sq") else []
    bad = data.draw(st.sampled_from([math.nan, "x", None, *negative]))
    if isinstance(bad, float) and slot != "step":
        sd["state"][entry][slot] = torch.full_like(sd["state"][entry][slot], bad)
    else:
        sd["state"][entry][slot] = bad
    _refused(multi, sd)


# ------------------------------------------------------------------ defect 12
ALGORITHMS: dict[str, dict[str, Any]] = {
    "sgd": {"momentum": 0.9},
    "adam": {"amsgrad": True},
    "adamw": {},
    "lion": {},
    "muon": {},
}


def _meta_cases() -> Iterator[tuple[str, dict[str, Any], str]]:
    for algorithm, hparams in ALGORITHMS.items():
        optimizer = _stepped(optiplug.create(algorithm, _named(((3, 2), (3,))), **hparams))
        slots = {slot for entry in optimizer.state_dict()["state"].values() for slot in entry}
        for slot in sorted(slots):
            yield algorithm, hparams, slot
        yield "multi", {"routes": [{"algorithm": algorithm, "match": "*", **hparams}]}, "*"


META_CASES = list(_meta_cases())


@pytest.mark.parametrize(("algorithm", "hparams", "slot"), META_CASES, ids=str)
def test_a_meta_tensor_in_any_slot_is_a_device_problem(
    algorithm: str, hparams: dict[str, Any], slot: str
) -> None:
    """Defect 12: a meta tensor (no data) is a StateDictError naming parameter and slot."""
    optimizer = _stepped(optiplug.create(algorithm, _named(((3, 2), (3,))), **hparams))
    sd = copy.deepcopy(optimizer.state_dict())
    for entry in sd["state"].values():
        for key, value in entry.items():
            if slot in ("*", key) and isinstance(value, torch.Tensor):
                entry[key] = torch.empty(value.shape, dtype=value.dtype, device="meta")
    before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(StateDictError) as caught:
        optiplug.load_state_dict(optimizer, sd)
    device = [p for p in caught.value.problems if p.kind == "device"]
    assert device and all(p.parameter and p.found == "meta" for p in device)
    assert all(slot in ("*", p.slot) or p.slot.endswith("/" + slot) for p in device)
    assert all(
        _same(a, b) for a, b in zip(_flatten(before), _flatten(optimizer.state_dict()), strict=True)
    )


def _flatten(sd: dict[str, Any]) -> list[Any]:
    values = [v for _, entry in sorted(sd["state"].items()) for _, v in sorted(entry.items())]
    return values + [v for g in sd["param_groups"] for _, v in sorted(g.items())]


@pytest.mark.parametrize("bad_id", [[1], {"id": 1}, None, 1.5, True], ids=repr)
def test_multi_with_an_odd_id_raises_state_dict_error_naming_the_parameter(bad_id: Any) -> None:
    """Defect 12: an unhashable (or non-int) id in multi is a StateDictError, not TypeError."""
    multi = _multi()
    sd = copy.deepcopy(multi.state_dict())
    sd["param_groups"][1]["params"] = [bad_id]
    error, problems = _refused(multi, sd)
    named = [p for p in error.problems if p.kind == "type" and p.slot == "params"]
    assert [p.parameter for p in named] == ["1.weight"]
    assert named[0] in problems


# ------------------------------------------------------------------ defect 15
def _adam_dict() -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    named = _named(((3, 2), (3,), (2,)))
    optimizer = _stepped(optiplug.create("adam", named, amsgrad=True))
    return optimizer, copy.deepcopy(optimizer.state_dict())


SLOT_DAMAGE: dict[str, tuple[str, Callable[[torch.Tensor], Any]]] = {
    "negative": ("exp_avg_sq", lambda t: torch.full_like(t, -1.0)),
    "dtype": ("exp_avg", lambda t: t.double()),
    "non-finite": ("max_exp_avg_sq", lambda t: torch.full_like(t, math.inf)),
    "shape": ("exp_avg", lambda t: t.reshape(-1)[:1].clone()),
}


def _subgroup(group: dict[str, Any], ids: list[Any], names: list[str]) -> dict[str, Any]:
    """A copy of ``group`` listing ``ids`` (named ``names`` if the group is named)."""
    new = {**group, "params": ids}
    if "param_names" in group:
        new["param_names"] = names
    return new


def _structural(sd: dict[str, Any], which: str) -> str:
    """Break ``sd``'s structure; returns the problem kind expected for it."""
    group = sd["param_groups"][0]
    ids, names = group["params"], group.get("param_names", [])
    if which == "extra-group":
        sd["param_groups"].append(_subgroup(group, [], []))
        return "group-count"
    if which == "split-group":
        sd["param_groups"] = [
            _subgroup(group, ids[:1], names[:1]),
            _subgroup(group, ids[1:], names[1:]),
        ]
        return "group-count"
    if which == "duplicate-id":
        sd["param_groups"].append(_subgroup(group, ids[:1], ["w2"]))
        return "duplicate-id"
    group["params"] = [*ids[:-1], [ids[-1]]]
    return "type"


@SETTINGS
@given(
    structural=st.sampled_from(["extra-group", "split-group", "duplicate-id", "unhashable-id"]),
    damage=st.dictionaries(st.integers(0, 1), st.sampled_from(sorted(SLOT_DAMAGE)), min_size=1),
    named=st.booleans(),
)
def test_structural_problems_do_not_hide_per_slot_problems(
    structural: str, damage: dict[int, str], named: bool
) -> None:
    """Defect 15: with a structural problem, per-slot problems of mappable entries still show."""
    optimizer, sd = _adam_dict()
    if not named:
        for group in sd["param_groups"]:
            del group["param_names"]
    for position, kind in damage.items():
        slot, make = SLOT_DAMAGE[kind]
        entry = sd["state"][sd["param_groups"][0]["params"][position]]
        entry[slot] = make(entry[slot])
    structure = _structural(
        sd, structural if named or structural != "duplicate-id" else "extra-group"
    )
    problems = optiplug.validate_state_dict(optimizer, sd)
    assert structure in _kinds(problems)
    found = {(p.parameter, p.slot, p.kind) for p in problems}
    labels = ["0.weight", "1.weight"]
    for position, kind in damage.items():
        assert (labels[position], SLOT_DAMAGE[kind][0], kind) in found, (found, damage)


def test_a_wrong_group_count_still_reports_moment_and_dtype_problems() -> None:
    """Defect 15, the campaign's example: group-count + negative moment + wrong dtype."""
    optimizer, sd = _adam_dict()
    sd["param_groups"].append({**sd["param_groups"][0], "params": [], "param_names": []})
    entry = sd["state"][0]
    entry["exp_avg_sq"] = -entry["exp_avg_sq"].abs() - 1
    entry["exp_avg"] = entry["exp_avg"].double()
    kinds = _kinds(optiplug.validate_state_dict(optimizer, sd))
    assert {"group-count", "negative", "dtype"} <= kinds


def _duplicated_group_dict(named: bool, grouped: bool) -> tuple[torch.optim.Optimizer, Any]:
    """A stepped Adam whose state dict lists its first group twice and has damaged slots.

    The first parameter's ``exp_avg_sq`` is negative and its ``exp_avg`` is half precision.
    """
    params = _named(((3, 2), (3,), (2,)))
    listed: Any = params if named else [p for _, p in params]
    if grouped:
        listed = [{"params": listed[:2]}, {"params": listed[2:]}]
    optimizer = _stepped(optiplug.create("adam", listed, amsgrad=True))
    sd = copy.deepcopy(optimizer.state_dict())
    sd["param_groups"].append(copy.deepcopy(sd["param_groups"][0]))
    entry = sd["state"][0]
    entry["exp_avg_sq"] = torch.full_like(entry["exp_avg_sq"], -1.0)
    entry["exp_avg"] = entry["exp_avg"].half()
    return optimizer, sd


@pytest.mark.parametrize("grouped", [False, True], ids=["one-group", "two-groups"])
@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_duplicated_param_group_still_reports_every_slot_problem(
    named: bool, grouped: bool
) -> None:
    """A repeated group is reported with the damaged slots of the parameters it lists."""
    optimizer, sd = _duplicated_group_dict(named, grouped)
    label = "0.weight" if named else "#0"
    problems = optiplug.validate_state_dict(optimizer, sd)
    found = {(p.parameter, p.slot, p.kind) for p in problems}
    assert {"group-count", "duplicate-id"} <= _kinds(problems)
    assert (label, "exp_avg_sq", "negative") in found, found
    assert (label, "exp_avg", "dtype") in found, found
    assert len(problems) == len(set(problems)), problems
    before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(StateDictError) as raised:
        optimizer.load_state_dict(sd)
    assert sorted(raised.value.problems) == sorted(problems)
    assert "exp_avg_sq" in str(raised.value) and "dtype" in str(raised.value)
    assert _same(_flatten(optimizer.state_dict()), _flatten(before))


def test_a_duplicated_route_group_reports_each_slot_problem_once() -> None:
    """In ``multi``, a repeated group of a route still shows its damaged slots, each once."""
    multi = _multi()
    sd = copy.deepcopy(multi.state_dict())
    sd["param_groups"].append(copy.deepcopy(sd["param_groups"][0]))
    entry = sd["state"][0]
    entry["exp_avg_sq"] = torch.full_like(entry["exp_avg_sq"], -1.0)
    entry["exp_avg"] = entry["exp_avg"].half()
    error, problems = _refused(multi, sd)
    found = [(p.parameter, p.slot, p.kind) for p in problems]
    assert ("0.weight", "adam/exp_avg_sq", "negative") in found, found
    assert ("0.weight", "adam/exp_avg", "dtype") in found, found
    assert "duplicate-id" in _kinds(problems)
    assert len(found) == len(set(found)), found
    assert list(error.problems) == problems


# ------------------------------------------------------------------ defect 16
class _BadFloat:
    def __float__(self) -> float:
        raise ZeroDivisionError("no float here")

    def __repr__(self) -> str:
        return "<BadFloat>"


EXOTIC: list[tuple[str, Callable[[], Any]]] = [
    ("10**400", lambda: 10**400),
    ("-10**400", lambda: -(10**400)),
    ("complex", lambda: complex(0.5, 0.5)),
    ("complex-0d-tensor", lambda: torch.tensor(0.5 + 0.5j)),
    ("meta-0d-tensor", lambda: torch.tensor(0.5, device="meta")),
    ("bool-0d-tensor", lambda: torch.tensor(True)),
    ("int-0d-tensor", lambda: torch.tensor(1)),
    ("float-0d-tensor", lambda: torch.tensor(0.5)),
    ("1d-tensor", lambda: torch.tensor([0.5])),
    ("np.float64", lambda: np.float64(0.5)),
    ("np.float32", lambda: np.float32(0.5)),
    ("np.int64", lambda: np.int64(1)),
    ("np.bool_", lambda: np.bool_(True)),
    ("np-0d-array", lambda: np.array(0.5)),
    ("np-1d-array", lambda: np.array([0.5])),
    ("np-str-array", lambda: np.array(["auto"])),
    ("string", lambda: "0.5"),
    ("None", lambda: None),
    ("nan", lambda: math.nan),
    ("inf", lambda: math.inf),
    ("-inf", lambda: -math.inf),
    ("-0.0", lambda: -0.0),
    ("bad-__float__", _BadFloat),
    ("Decimal", lambda: Decimal("0.5")),
    ("Fraction", lambda: Fraction(1, 2)),
    ("bytes", lambda: b"auto"),
]

TUPLE_FIELDS = {"betas", "aux_betas", "ns_coefficients"}


def _fields() -> list[tuple[str, str]]:
    found = []
    for algorithm in ALGORITHMS:
        for field in optiplug.spec(algorithm).hyperparameters:
            found.append((algorithm, field.name))
            if field.name in TUPLE_FIELDS:
                found.append((algorithm, f"{field.name}[0]"))
    return found


def _hparams(algorithm: str, field: str, value: Any) -> dict[str, Any]:
    if not field.endswith("[0]"):
        return {field: value}
    name = field[:-3]
    default = optiplug.spec(algorithm).hyperparameters
    current = next(h.default for h in default if h.name == name)
    return {name: (value, *current[1:])}


HP_CASES = [
    (host, algorithm, field, label)
    for host in ("direct", "multi")
    for algorithm, field in _fields()
    for label, _ in EXOTIC
]
_MAKERS = dict(EXOTIC)


def _build(host: str, algorithm: str, hparams: dict[str, Any]) -> torch.optim.Optimizer:
    named = [
        ("hidden.weight", torch.nn.Parameter(torch.ones(4, 3))),
        ("hidden.bias", torch.nn.Parameter(torch.ones(4))),
    ]
    if host == "direct":
        return optiplug.create(algorithm, named, **hparams)
    return optiplug.create(
        "multi", named, routes=[{"algorithm": algorithm, "match": "*", **hparams}]
    )


@pytest.mark.parametrize(("host", "algorithm", "field", "label"), HP_CASES)
def test_exotic_hyperparameters_are_accepted_or_rejected_by_name(
    host: str, algorithm: str, field: str, label: str
) -> None:
    """Defect 16: a value either works (finite step) or raises HyperparameterError naming it."""
    hparams = _hparams(algorithm, field, _MAKERS[label]())
    try:
        optimizer = _build(host, algorithm, hparams)
    except HyperparameterError as error:
        assert error.field.split("[")[0] == field.split("[")[0], error
        return
    _stepped(optimizer)
    for group in optimizer.param_groups:
        assert all(bool(torch.isfinite(p).all()) for p in group["params"]), group

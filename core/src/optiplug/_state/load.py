"""Validating and loading optimizer state dicts: every problem at once, all-or-nothing.

The optimizer's algorithm is found from, in order: the spec the registry
recorded on it when it created it (:func:`optiplug.record_of`), the ``algorithm`` class attribute of a
:class:`~optiplug.base.TorchBackedOptimizer` looked up in the registry, and
otherwise a schema-less spec named after the class (generic checks only,
with the class's ``group_state`` keys, as
:func:`~optiplug.base.external_optimizer` sets them).

Loading validates first, builds the new state and groups aside (copying every
tensor), and only then swaps them in, so a failure leaves the optimizer
exactly as it was. An optimizer composed of sub-optimizers validates and
loads its own state dicts through two methods (:data:`COMPOSITE_VALIDATE`,
:data:`COMPOSITE_LOAD`), typically by splitting the dict and calling these
functions per sub-optimizer. The checks that need no target run here first,
on the whole dict (:func:`~optiplug._state.check.check_whole`: top-level
keys, id types, duplicate ids across all groups, orphan state): their
problems are added to the composite's, and a fatal one (broken structure,
an ill-typed or duplicated id) refuses the load before the composite is
called, so it only ever loads a dict whose ids are distinct ints (or str).
"""

from __future__ import annotations

import copy
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .._core.params import GROUP_META_KEYS
from .._core.record import record_of
from .._core.registry import Registry, bound_registry
from .._core.specs import OptimizerSpec, Problem
from ..errors import OptiplugError, StateDictError
from .check import Report, Target, TargetGroup, check, check_whole, kept_keys
from .codec import NO_SLOTS, SECOND_MOMENTS, forget_precisions, state_in_precision
from .values import ParamInfo, copied_tensor, describe, is_subclass_tensor, truthy

__all__ = [
    "load_state_dict",
    "registry_of",
    "spec_of",
    "target_of",
    "validate_state_dict",
]

_log = logging.getLogger("optiplug.state")

COMPOSITE_VALIDATE = "optiplug_validate_state_dict"
COMPOSITE_LOAD = "optiplug_load_state_dict"
"""Methods an optimizer made of sub-optimizers (``multi``) defines to validate
and load its own state dicts; :func:`validate_state_dict` and
:func:`load_state_dict` delegate to them."""


def registry_of(optimizer: Any) -> Registry:
    """The registry that created ``optimizer``, else the default registry."""
    record = record_of(optimizer)
    tagged = record.registry if record is not None else None
    return bound_registry(tagged if isinstance(tagged, Registry) else None)


def spec_of(optimizer: Any, registry: Registry) -> OptimizerSpec:
    """The spec describing ``optimizer``'s algorithm (see the module docstring).

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        registry: where to look the algorithm up.

    Returns:
        The registered spec, or a schema-less one named after the class.
    """
    record = record_of(optimizer)
    if record is not None:
        return record.spec
    cls = type(optimizer)
    name = getattr(cls, "algorithm", None)
    if isinstance(name, str) and name:
        try:
            return registry.spec(name)
        except OptiplugError:
            pass
    config = getattr(cls, "config_class", None)
    running = getattr(cls, "group_state", ())
    return OptimizerSpec(
        name=name or cls.__name__,
        factory=cls,
        config=config,
        group_state=tuple(running) if isinstance(running, (tuple, list)) else (),
    )


def target_of(optimizer: Any, spec: OptimizerSpec, registry: Registry) -> Target:
    """Describe ``optimizer``'s groups for :func:`~optiplug._state_check.check`."""
    groups = tuple(
        TargetGroup(
            tuple(ParamInfo.of(p) for p in group["params"]),
            _names(group),
            {k: v for k, v in group.items() if k not in GROUP_META_KEYS},
        )
        for group in optimizer.param_groups
    )
    moments = getattr(optimizer, "second_moments", None)
    second_moments = moments if isinstance(moments, frozenset) else None
    return Target(spec, groups, tuple(registry.optimizer_specs()), second_moments)


def _names(group: Mapping[str, Any]) -> tuple[str, ...] | None:
    names = group.get("param_names")
    return tuple(names) if names is not None else None


def validate_state_dict(
    optimizer: Any, state_dict: Any, *, registry: Registry | None = None
) -> list[Problem]:
    """Every problem loading ``state_dict`` into ``optimizer`` would hit, sorted.

    Args:
        optimizer: the optimizer it would be loaded into (not modified).
        state_dict: the candidate state dict (not modified).
        registry: where to find specs and validation hooks; defaults to the
            one that created the optimizer, else the default registry.

    Returns:
        The problems, sorted; empty when the state dict is valid.
    """
    own = getattr(optimizer, COMPOSITE_VALIDATE, None)
    if callable(own):
        return sorted(_composite_problems(own, state_dict)[0])
    registry = registry if registry is not None else registry_of(optimizer)
    spec = spec_of(optimizer, registry)
    state_dict = _pre_hooks(optimizer, state_dict)  # as load_state_dict sees it
    return sorted(_report(optimizer, spec, registry, state_dict).problems)


def _composite_problems(own: Any, state_dict: Any) -> tuple[list[Problem], bool]:
    """The whole-dict problems plus the composite's own; whether the structure is broken.

    The composite is not asked when the dict is not even a mapping of
    ``state`` and ``param_groups`` (nothing in it could be checked).
    """
    whole = check_whole(state_dict)
    if whole.fatal and not _has_top_structure(state_dict):
        return whole.problems, True
    return whole.problems + list(own(state_dict)), whole.fatal


def _has_top_structure(state_dict: Any) -> bool:
    return (
        isinstance(state_dict, Mapping)
        and isinstance(state_dict.get("state"), Mapping)
        and isinstance(state_dict.get("param_groups"), (list, tuple))
    )


def _report(optimizer: Any, spec: OptimizerSpec, registry: Registry, state_dict: Any) -> Report:
    report = check(target_of(optimizer, spec, registry), state_dict)
    if not report.fatal:
        for problem in _hook_problems(registry, spec, optimizer, state_dict):
            report.problems.append(problem)
            _attribute(report, problem)
    return report


def _hook_problems(
    registry: Registry, spec: OptimizerSpec, optimizer: Any, state_dict: Any
) -> list[Problem]:
    try:
        found = list(registry.extra_state_problems(spec, optimizer, state_dict))
    except Exception as error:
        found = [_plugin_problem(f"{type(error).__name__}: {error}")]
    return [p if isinstance(p, Problem) else _plugin_problem(describe(p)) for p in found]


def _plugin_problem(found: str) -> Problem:
    return Problem(kind="validator-error", expected="a list of optiplug.Problem", found=found)


def _attribute(report: Report, problem: Problem) -> None:
    """Decide what a partial load skips for a plugin's problem (unknown: nothing loads)."""
    positions = {(m.group, m.label): m.position for m in report.matches}
    if (problem.group, problem.parameter) in positions:
        report.skipped_params.add(positions[problem.group, problem.parameter])
    elif problem.group >= 0 and problem.slot and not problem.parameter:
        report.skipped_keys.setdefault(problem.group, set()).add(problem.slot)
    else:
        report.fatal = True


def load_state_dict(
    optimizer: Any,
    state_dict: Any,
    *,
    strict: bool = True,
    registry: Registry | None = None,
    extra_problems: Iterable[Problem] = (),
) -> list[Problem]:
    """Validate, then load ``state_dict`` into ``optimizer`` all-or-nothing.

    Args:
        optimizer: the optimizer to load into.
        state_dict: as returned by ``Optimizer.state_dict()`` (not modified,
            never aliased: tensors are copied).
        strict: raise on any problem; False loads what is valid.
        registry: see :func:`validate_state_dict`.
        extra_problems: problems the caller found (e.g. a checkpoint of
            another algorithm); they count like the others.

    Every group keeps its own ``state_precision``: the loaded slots are
    converted to it (:func:`optiplug.base.convert_state`), so a
    full-precision state dict loads into an int8 optimizer and back.

    Returns:
        The problems skipped (``strict=False``) and ``hyperparameter-changed``
        notes (saved values that differ from the optimizer's; saved ones win).

    Raises:
        StateDictError: a problem with ``strict=True``, or a structure that
            cannot be loaded even partially; the optimizer is unchanged.
    """
    own = getattr(optimizer, COMPOSITE_LOAD, None)
    if callable(own):
        return _load_composite(optimizer, own, state_dict, strict, list(extra_problems))
    registry = registry if registry is not None else registry_of(optimizer)
    state_dict = _pre_hooks(optimizer, state_dict)
    spec = spec_of(optimizer, registry)
    report = _report(optimizer, spec, registry, state_dict)
    report.problems += list(extra_problems)
    if report.fatal or (strict and report.problems):
        raise StateDictError(sorted(report.problems), header=_header(spec, strict, report))
    state, groups = _build(optimizer, spec, state_dict, report)
    _in_precision(optimizer, state, groups, spec)
    _commit(optimizer, state, groups, spec)
    forget_precisions(optimizer)  # the next step looks for codes in fp32 groups again
    for change in report.changed:
        _log.info("%s: loaded a changed hyperparameter: %s", spec.name, change)
    return sorted(([] if strict else report.problems) + report.changed)


def _load_composite(
    optimizer: Any, own: Any, state_dict: Any, strict: bool, extra: list[Problem]
) -> list[Problem]:
    """Refuse a dict whose whole-dict structure is broken, else let the composite load it."""
    whole = check_whole(state_dict)
    if whole.fatal:
        validate = getattr(optimizer, COMPOSITE_VALIDATE, None)
        problems = _composite_problems(validate, state_dict)[0] if callable(validate) else []
        name = getattr(type(optimizer), "algorithm", type(optimizer).__name__)
        header = (
            f"cannot load this state dict into {name} (its structure is wrong); nothing was changed"
        )
        raise StateDictError(sorted(problems + extra), header=header)
    skipped: list[Problem] = own(
        state_dict, strict=strict, extra_problems=tuple(whole.problems + extra)
    )
    return skipped


def _header(spec: OptimizerSpec, strict: bool, report: Report) -> str:
    partial = "" if strict or not report.fatal else " (not even partially: its structure is wrong)"
    return f"cannot load this state dict into {spec.name}{partial}; nothing was changed"


def _pre_hooks(optimizer: Any, state_dict: Any) -> Any:
    """Run torch's load-state-dict pre-hooks on a shallow copy, as torch does."""
    hooks = getattr(optimizer, "_optimizer_load_state_dict_pre_hooks", None)
    if not hooks or not isinstance(state_dict, Mapping):
        return state_dict
    state_dict = dict(state_dict)
    for hook in hooks.values():
        result = hook(optimizer, state_dict)
        if result is not None:
            state_dict = result
    return state_dict


def _build(
    optimizer: Any, spec: OptimizerSpec, state_dict: Mapping[str, Any], report: Report
) -> tuple[defaultdict[Any, dict[str, Any]], list[dict[str, Any]]]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: defaultdict[Any, dict[str, Any]] = defaultdict(dict, optimizer.state)
    saved = state_dict["state"]
    generic = spec.state_slots is None
    for match in report.matches:
        if match.position in report.skipped_params:
            continue
        param, group = params[match.position], optimizer.param_groups[match.group]
        entry = saved.get(match.saved_id)
        if entry:
            state[param] = {k: _copy(k, v, param, group, generic) for k, v in entry.items()}
        else:
            state.pop(param, None)
    groups = [
        _merged(spec, current, loaded, report.skipped_keys.get(index, set()))
        for index, (current, loaded) in enumerate(
            zip(optimizer.param_groups, state_dict["param_groups"], strict=True)
        )
    ]
    return state, groups


def _copy(
    key: str, value: Any, param: torch.Tensor, group: Mapping[str, Any], generic: bool
) -> Any:
    """Copy one state value onto the parameter's device (dtypes were validated).

    ``step`` stays a CPU scalar unless the group is fused or capturable, as in
    torch; schema-less optimizers get torch's casting rule for the rest.
    Lists and tuples are copied item by item; a tensor subclass (a
    quantized state) is rebuilt from copies of its inner tensors, never cast.
    """
    if isinstance(value, (list, tuple)):
        items = [_copy(key, item, param, group, generic=False) for item in value]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    if not isinstance(value, torch.Tensor):
        return copy.deepcopy(value)
    if is_subclass_tensor(value):
        return copied_tensor(value, param.device)
    value = value.detach()
    if key == "step" and value.ndim == 0:
        on_device = truthy(group.get("fused")) or truthy(group.get("capturable"))
        if on_device:
            return value.to(device=param.device, dtype=torch.float32, copy=True)
        return value.to(device="cpu", copy=True)
    if generic and param.is_floating_point():
        return value.to(device=param.device, dtype=param.dtype, copy=True)
    return value.to(device=param.device, copy=True)


def _merged(
    spec: OptimizerSpec,
    current: dict[str, Any],
    loaded: Mapping[str, Any],
    skipped: set[str],
) -> dict[str, Any]:
    """The group after loading: saved hyperparameters over this optimizer's own.

    The optimizer keeps its params, names, implementation flags and
    class-fixed keys; saved keys that had problems are skipped. A
    ``group_state`` key the saved group lacks is dropped (the saved
    optimizer had not created it yet).
    """
    kept = kept_keys(spec, {k: v for k, v in current.items() if k not in GROUP_META_KEYS})
    merged = {k: v for k, v in current.items() if k not in spec.group_state or k in loaded}
    for key, value in loaded.items():
        if isinstance(key, str) and key not in GROUP_META_KEYS and key not in kept | skipped:
            merged[key] = (
                value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            )
    return merged


def _in_precision(
    optimizer: Any,
    state: defaultdict[Any, dict[str, Any]],
    groups: list[dict[str, Any]],
    spec: OptimizerSpec,
) -> None:
    """Store the new state's slots in each group's ``state_precision``, before it is swapped in.

    Each group keeps its own precision: a full-precision state dict loads
    into an int8 optimizer and back. A slot that cannot be converted refuses
    the load with the optimizer untouched (the entries are replaced aside).
    """
    try:
        state_in_precision(
            state,
            groups,
            second_moments=getattr(optimizer, "second_moments", SECOND_MOMENTS),
            linear_slots=getattr(optimizer, "linear_slots", NO_SLOTS),
            low_rank_slots=getattr(optimizer, "low_rank_slots", NO_SLOTS),
        )
    except Exception as error:  # a slot the codec cannot store: refuse, as a failed swap does
        found = f"{type(error).__name__}: {error}"[:300]
        expected = "slots the group's state_precision can store"
        problem = Problem(kind="load-failed", expected=expected, found=found)
        raise StateDictError([problem], header=_header(spec, True, Report())) from error


def _commit(
    optimizer: Any,
    state: defaultdict[Any, dict[str, Any]],
    groups: list[dict[str, Any]],
    spec: OptimizerSpec,
) -> None:
    """Swap the new state in; if the optimizer's ``__setstate__`` fails, restore it."""
    before = dict(optimizer.__dict__)
    try:
        optimizer.__setstate__({"state": state, "param_groups": groups})
    except Exception as error:
        optimizer.__dict__.clear()
        optimizer.__dict__.update(before)
        found = f"{type(error).__name__}: {error}"
        problem = Problem(
            kind="load-failed", expected="the optimizer accepts the state", found=found
        )
        raise StateDictError([problem], header=_header(spec, True, Report())) from error
    for hook in getattr(optimizer, "_optimizer_load_state_dict_post_hooks", {}).values():
        hook(optimizer)

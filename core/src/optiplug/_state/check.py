"""Validation of an optimizer state dict against a target optimizer description.

:func:`check` never raises on odd input and never touches an optimizer: it
compares a candidate state dict with a :class:`Target` (the parameters,
names and hyperparameters of each group, and the algorithm's spec) and
returns a :class:`Report` of every problem, plus what a partial
(``strict=False``) load must skip.

A structural problem (wrong group count or size, duplicate or ill-typed ids,
duplicate names) makes the report fatal but does not end the check: every
state entry whose id still maps to one parameter is checked too. An id maps
to a parameter when it is a hashable int (or str) id and

1. the groups pair up by index (same count) and the id's group has the
   target's size (or is matched by name, as in a valid dict); or, when the
   group count differs,
2. the target and every saved group carry ``param_names``: by name; else
3. the saved groups list as many ids as the target has parameters: the k-th
   id over all groups is the k-th parameter (torch's own pairing); else
4. groups pair by index as far as both go, and each paired group of the
   target's size pairs by position.

A duplicated id is checked for each parameter it is listed for, and a name
listed more than once (rule 2: a repeated group, say) with each id listed
under it, so a structural problem never hides a damaged slot. Entries no
rule maps are reported as ``orphan-state`` when their id is in no group,
else left unchecked. Group hyperparameters are checked only for groups that
pair by index (rule 1). Only a dict that is not a mapping with ``state`` (a
mapping) and ``param_groups`` (a list of mappings) stops the check at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._core.params import GROUP_META_KEYS
from .._core.specs import OptimizerSpec, Problem
from .codec import QuantizedState, local_of
from .quantized_check import role_finding, structure_findings
from .values import (
    IMPLEMENTATION_FLAGS,
    OPTIONAL_GROUP_KEYS,
    ParamInfo,
    class_keys,
    config_fields,
    describe,
    generic_findings,
    hyperparameter_findings,
    plain_value_error,
    same_value,
    slot_findings,
    truthy,
)

__all__ = ["Match", "Report", "Target", "TargetGroup", "check", "kept_keys"]

_TOP_KEYS = ("param_groups", "state")


@attrs.frozen
class TargetGroup:
    """One param group of the optimizer a state dict would be loaded into.

    Attributes:
        params: each parameter's shape, dtype and layout, in order.
        names: parameter names (``param_names``), or None when unnamed.
        hyperparameters: the group's current keys other than params/names.
    """

    params: tuple[ParamInfo, ...]
    names: tuple[str, ...] | None
    hyperparameters: Mapping[str, Any] = attrs.field(eq=False)


@attrs.frozen
class Target:
    """The optimizer side of a validation.

    Attributes:
        spec: the optimizer's algorithm (``state_slots`` None: generic checks).
        groups: its param groups.
        others: every registered spec, to name the owner of foreign state.
        second_moments: the slot names the optimizer stores with the unsigned
            table (its ``second_moments``); a quantized slot in the other
            table is a problem. None: unknown, not checked.
    """

    spec: OptimizerSpec
    groups: tuple[TargetGroup, ...]
    others: tuple[OptimizerSpec, ...] = ()
    second_moments: frozenset[str] | None = None


@attrs.frozen
class Match:
    """A saved parameter matched to one of the target's.

    Attributes:
        group: param-group index.
        saved_id: its id in the state dict (``params`` entry, ``state`` key).
        position: index of the target parameter over all groups.
        label: name, or ``"#index"`` when unnamed.
    """

    group: int
    saved_id: Any
    position: int
    label: str


@attrs.define
class Report:
    """The result of :func:`check`.

    Attributes:
        problems: every problem found (unsorted).
        changed: ``hyperparameter-changed`` notes: valid saved values that
            differ from the target's (the saved value wins on load).
        matches: saved parameters matched to target parameters.
        fatal: the structure prevents loading anything.
        skipped_params: target positions whose saved state must not be loaded.
        skipped_keys: per group, saved keys that must not be loaded.
    """

    problems: list[Problem] = attrs.Factory(list)
    changed: list[Problem] = attrs.Factory(list)
    matches: list[Match] = attrs.Factory(list)
    fatal: bool = False
    skipped_params: set[int] = attrs.Factory(set)
    skipped_keys: dict[int, set[str]] = attrs.Factory(dict)

    def top(self, kind: str, expected: str, found: str, *, slot: str = "", fatal: bool) -> None:
        """Record a problem not tied to one parameter."""
        self.problems.append(Problem(slot=slot, kind=kind, expected=expected, found=found))
        self.fatal = self.fatal or fatal

    def key(self, group: int, key: str, kind: str, expected: str, found: str) -> None:
        """Record a problem with a group key; a partial load skips that key."""
        self.problems.append(Problem(group, "", key, kind, expected, found))
        self.skipped_keys.setdefault(group, set()).add(key)

    def param(self, match: Match, slot: str, kind: str, expected: str, found: str) -> None:
        """Record a problem with a parameter's state; a partial load skips that parameter."""
        self.problems.append(Problem(match.group, match.label, slot, kind, expected, found))
        self.skipped_params.add(match.position)


def kept_keys(spec: OptimizerSpec, current: Mapping[str, Any]) -> frozenset[str]:
    """Group keys the loading optimizer keeps: implementation flags and class-fixed keys.

    The spec's ``group_state`` keys are never kept: the saved running state wins.
    """
    kept = (IMPLEMENTATION_FLAGS & current.keys()) | class_keys(spec, current)
    return kept - frozenset(spec.group_state)


def check(target: Target, state_dict: Any) -> Report:
    """Validate ``state_dict`` against ``target``; see the module docstring.

    Args:
        target: the optimizer side.
        state_dict: the candidate, as ``Optimizer.state_dict()`` returns it.

    Returns:
        The :class:`Report`.
    """
    report = Report()
    parts = _top(state_dict, report)
    if parts is None:
        return report
    state, groups = parts
    ids = _group_ids(groups, report)
    if len(groups) == len(target.groups):
        _paired_groups(target, groups, ids, report)
    else:
        expected = f"{len(target.groups)} param group(s)"
        report.top("group-count", expected, f"{len(groups)}", slot="param_groups", fatal=True)
        report.matches += _unpaired_matches(target, groups, ids)
    _entries(target, state, report)
    _orphans(state, ids, report)
    report.problems = list(dict.fromkeys(report.problems))  # an entry listed twice: once
    return report


def check_whole(state_dict: Any) -> Report:
    """The checks of :func:`check` that need no target, over a whole state dict.

    For an optimizer made of sub-optimizers, which checks its parts itself:
    top-level keys and types, id types, duplicate ids and names across all
    groups, and state entries of no listed id (``orphan-state``).

    Args:
        state_dict: the candidate.

    Returns:
        The report (no matches); ``fatal`` when the structure is broken.
    """
    report = Report()
    parts = _top(state_dict, report)
    if parts is not None:
        state, groups = parts
        _orphans(state, _group_ids(groups, report), report)
    return report


def _paired_groups(
    target: Target, groups: Sequence[Mapping[str, Any]], ids: list[list[Any]], report: Report
) -> None:
    """Rule 1 of the module docstring: group i of the dict is group i of the target."""
    offset = 0
    for index, (tgroup, sgroup) in enumerate(zip(target.groups, groups, strict=True)):
        report.matches += _match_group(index, tgroup, sgroup, ids[index], offset, report)
        _group_keys(target, index, tgroup, sgroup, report)
        offset += len(tgroup.params)


def _unpaired_matches(
    target: Target, groups: Sequence[Mapping[str, Any]], ids: list[list[Any]]
) -> list[Match]:
    """Rules 2-4 of the module docstring, for a dict with the wrong number of groups."""
    places = _places(target)
    flat = [i for group_ids in ids for i in group_ids]
    saved_names = [_valid_names(_saved_names(g), len(i)) for g, i in zip(groups, ids, strict=True)]
    if all(t.names is not None for t in target.groups) and all(n is not None for n in saved_names):
        by_name = _name_pairs([n for names in saved_names for n in names or ()], flat)
        return [
            Match(g, saved_id, position, label)
            for position, (g, label) in enumerate(places)
            for saved_id in by_name.get(label, ())
        ]
    if len(flat) == len(places):
        return [Match(g, flat[k], k, label) for k, (g, label) in enumerate(places)]
    return _index_pairs(target, ids, places)


def _places(target: Target) -> list[tuple[int, str]]:
    """``(group, label)`` of every target parameter in order; label: name, else ``#position``."""
    places: list[tuple[int, str]] = []
    for index, tgroup in enumerate(target.groups):
        names = tgroup.names or [f"#{len(places) + k}" for k in range(len(tgroup.params))]
        places += [(index, name) for name in names]
    return places


def _name_pairs(names: list[Any], ids: list[Any]) -> dict[str, list[Any]]:
    """``{name: [id, ...]}``: every distinct valid id listed under each name, in order.

    A name listed more than once (a repeated group) maps to each id it is
    listed with, once per id, so every entry saved under it is checked.
    """
    pairs: dict[str, list[Any]] = {}
    for name, saved_id in zip(names, ids, strict=True):
        listed = pairs.setdefault(name, []) if isinstance(name, str) else None
        if listed is not None and _is_id(saved_id) and saved_id not in listed:
            listed.append(saved_id)
    return pairs


def _index_pairs(
    target: Target, ids: list[list[Any]], places: list[tuple[int, str]]
) -> list[Match]:
    matches, offset = [], 0
    for index, (tgroup, group_ids) in enumerate(zip(target.groups, ids, strict=False)):
        if len(group_ids) == len(tgroup.params):
            for k, saved_id in enumerate(group_ids):
                matches.append(Match(index, saved_id, offset + k, places[offset + k][1]))
        offset += len(tgroup.params)
    return matches


def _top(state_dict: Any, report: Report) -> tuple[Mapping[Any, Any], Sequence[Any]] | None:
    if not isinstance(state_dict, Mapping):
        expected = "a mapping with 'state' and 'param_groups'"
        report.top("type", expected, type(state_dict).__name__, fatal=True)
        return None
    for key in _TOP_KEYS:
        if key not in state_dict:
            report.top("missing-key", "present", "absent", slot=key, fatal=True)
    for key in state_dict:
        if key not in _TOP_KEYS:
            found = f"{key!r}: {describe(state_dict[key])}"
            report.top("unexpected-key", "only 'state' and 'param_groups'", found, fatal=False)
    if report.fatal:
        return None
    state, groups = state_dict["state"], state_dict["param_groups"]
    if not isinstance(state, Mapping):
        report.top("type", "a mapping", type(state).__name__, slot="state", fatal=True)
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) for g in groups):
        found = describe(groups)
        report.top("type", "a list of group dicts", found, slot="param_groups", fatal=True)
    return None if report.fatal else (state, groups)


def _group_ids(groups: Sequence[Mapping[str, Any]], report: Report) -> list[list[Any]]:
    """Each group's ids (ill-typed ones kept, in place, and reported); duplicates reported."""
    ids: list[list[Any]] = []
    for index, group in enumerate(groups):
        ids.append(_ids_of(index, group, sum(map(len, ids)), report))
    _duplicates(
        [i for group_ids in ids for i in group_ids if _is_id(i)], "duplicate-id", "params", report
    )
    names = [
        n for index, g in enumerate(groups) for n in _names_of(index, g, len(ids[index]), report)
    ]
    _duplicates(names, "duplicate-name", "param_names", report)
    return ids


def _ids_of(index: int, group: Mapping[str, Any], offset: int, report: Report) -> list[Any]:
    params = group.get("params")
    if not isinstance(params, (list, tuple)):
        found = describe(params)
        report.problems.append(
            Problem(index, "", "params", "type", "a list of int (or str) ids", found)
        )
        report.fatal = True
        return []
    names = _saved_names(group)
    for k, value in enumerate(params):
        if not _is_id(value):
            label = _saved_label(names, k, offset)
            expected = "an int (or str) id, as in a list of int (or str) ids"
            report.problems.append(
                Problem(index, label, "params", "type", expected, describe(value))
            )
            report.fatal = True
    return list(params)


def _is_id(value: Any) -> bool:
    """Torch writes int ids; torch.distributed.checkpoint passes parameter names (str)."""
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _saved_label(names: list[Any] | None, k: int, offset: int) -> str:
    """The k-th saved parameter's name if the group names it, else ``#position``."""
    if names is not None and k < len(names) and isinstance(names[k], str):
        return str(names[k])
    return f"#{offset + k}"


def _names_of(index: int, group: Mapping[str, Any], size: int, report: Report) -> list[str]:
    names = group.get("param_names")
    if names is None:
        return []
    ok = isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)
    if ok and len(names) == size:
        return list(names)
    expected = f"a list of {size} parameter name strings"
    report.problems.append(Problem(index, "", "param_names", "type", expected, describe(names)))
    report.fatal = True
    return []


def _duplicates(values: list[Any], kind: str, slot: str, report: Report) -> None:
    seen: set[Any] = set()
    for value in values:
        if value in seen:
            report.top(kind, "each at most once", repr(value), slot=slot, fatal=True)
        seen.add(value)


def _saved_names(sgroup: Mapping[str, Any]) -> list[Any] | None:
    names = sgroup.get("param_names")
    return list(names) if isinstance(names, (list, tuple)) else None


def _match_group(
    index: int,
    tgroup: TargetGroup,
    sgroup: Mapping[str, Any],
    ids: list[Any],
    offset: int,
    report: Report,
) -> list[Match]:
    saved_names = _valid_names(_saved_names(sgroup), len(ids))
    names = tgroup.names
    if names is not None and saved_names is not None and len(set(names)) == len(names):
        return _match_by_name(
            index, names, dict(zip(saved_names, ids, strict=True)), offset, report
        )
    if len(ids) != len(tgroup.params):
        expected = f"{len(tgroup.params)} parameters"
        report.problems.append(Problem(index, "", "params", "group-size", expected, str(len(ids))))
        report.fatal = True
        return []
    labels = names or saved_names or [f"#{offset + i}" for i in range(len(ids))]
    return [Match(index, sid, offset + i, labels[i]) for i, sid in enumerate(ids)]


def _valid_names(names: list[Any] | None, size: int) -> list[str] | None:
    """Saved names usable for matching: ``size`` distinct strings, else None."""
    if names is None or len(names) != size or not all(isinstance(n, str) for n in names):
        return None
    return names if len(set(names)) == size else None


def _match_by_name(
    index: int, names: tuple[str, ...], saved: dict[str, Any], offset: int, report: Report
) -> list[Match]:
    matches = []
    for i, name in enumerate(names):
        if name in saved:
            matches.append(Match(index, saved[name], offset + i, name))
        else:
            problem = Problem(index, name, "", "missing-parameter", "saved state", "absent")
            report.problems.append(problem)
            report.skipped_params.add(offset + i)
    for name in sorted(set(saved) - set(names)):
        expected = f"a parameter of group {index}"
        problem = Problem(
            index, name, "", "unexpected-parameter", expected, "not in this optimizer"
        )
        report.problems.append(problem)
    return matches


def _group_keys(
    target: Target, index: int, tgroup: TargetGroup, sgroup: Mapping[str, Any], report: Report
) -> None:
    running = frozenset(target.spec.group_state)
    current = {k: v for k, v in tgroup.hyperparameters.items() if k not in running}
    saved = _saved_keys(index, sgroup, report)
    _running_state(index, {k: v for k, v in saved.items() if k in running}, report)
    saved = {k: v for k, v in saved.items() if k not in running}
    _presence(target.spec, index, current, saved, report)
    kept = kept_keys(target.spec, current)
    _fixed(target, index, current, saved, kept, report)
    skipped = report.skipped_keys.get(index, set())
    loaded = {k: v for k, v in saved.items() if k not in kept and k not in skipped}
    for key, finding in sorted(hyperparameter_findings(target.spec, loaded, current).items()):
        report.key(index, key, *finding)
    _changed(index, current, loaded, report)


def _running_state(index: int, saved: Mapping[str, Any], report: Report) -> None:
    """The spec's ``group_state`` keys: loaded as saved, if they are plain values."""
    for key, value in sorted(saved.items()):
        error = plain_value_error(value)
        if error is not None:
            report.key(index, key, "type", error, describe(value))


def _saved_keys(index: int, sgroup: Mapping[Any, Any], report: Report) -> dict[str, Any]:
    """The saved group's hyperparameters; non-string keys are problems."""
    saved = {}
    for key, value in sgroup.items():
        if not isinstance(key, str):
            report.key(index, describe(key), "unexpected-key", "string keys", describe(value))
        elif key not in GROUP_META_KEYS:
            saved[key] = value
    return saved


def _presence(
    spec: OptimizerSpec,
    index: int,
    current: Mapping[str, Any],
    saved: Mapping[str, Any],
    report: Report,
) -> None:
    """Keys this optimizer's groups do not have, and hyperparameters the saved group lacks."""
    for key in sorted(saved.keys() - current.keys() - OPTIONAL_GROUP_KEYS):
        found = f"{key}={describe(saved[key])}"
        report.key(index, key, "unexpected-key", "a key of this optimizer's groups", found)
    for key in sorted(_required(spec, current) - saved.keys()):
        if _at_default(spec, key, current[key]):
            continue  # a hyperparameter newer than the checkpoint, left at its default: kept
        expected = f"present (this optimizer: {describe(current[key])})"
        report.key(index, key, "missing-key", expected, "absent")


def _at_default(spec: OptimizerSpec, key: str, value: Any) -> bool:
    """Whether ``value`` is the config's default for ``key`` (a saved group may then lack it).

    A hyperparameter added to an algorithm after a checkpoint was written
    (muon's ``weight_decay_mode``) is absent from that checkpoint's groups;
    the algorithm then behaved as its default does, so a loading optimizer
    left at that default keeps it, as torch's optimizers fill in flags newer
    than a state dict. At any other value the saved run differed, and the
    key is reported missing.
    """
    field = config_fields(spec).get(key)
    if field is None or field.default is attrs.NOTHING:
        return False
    factory = getattr(field.default, "factory", None)  # an attrs.Factory
    default = factory() if callable(factory) else field.default
    converted = field.converter(default) if callable(field.converter) else default
    try:
        return bool(converted == value) and type(converted) is type(value)
    except Exception:  # values that cannot be compared (tensors) are not defaults
        return False


def _required(spec: OptimizerSpec, current: Mapping[str, Any]) -> set[str]:
    fields = config_fields(spec)
    keys = current.keys() & fields.keys() if fields else current.keys() - kept_keys(spec, current)
    return set(keys) - OPTIONAL_GROUP_KEYS - GROUP_META_KEYS


def _structural_keys(spec: OptimizerSpec) -> set[str]:
    return {slot.when for slot in spec.state_slots or () if slot.when is not None}


def _fixed(
    target: Target,
    index: int,
    current: Mapping[str, Any],
    saved: Mapping[str, Any],
    kept: frozenset[str],
    report: Report,
) -> None:
    """Keys that must agree: class-fixed ones, and those that decide which slots exist."""
    for key in sorted((kept - IMPLEMENTATION_FLAGS) & saved.keys()):
        if not same_value(saved[key], current[key]):
            expected = f"{current[key]!r} (fixed by {target.spec.name})"
            report.key(index, key, "hyperparameter-mismatch", expected, describe(saved[key]))
    for key in sorted(_structural_keys(target.spec) & saved.keys() & current.keys()):
        if truthy(saved[key]) != truthy(current[key]):
            expected = f"{current[key]!r} (as this optimizer; it decides which state exists)"
            report.key(index, key, "hyperparameter-mismatch", expected, describe(saved[key]))


def _changed(
    index: int, current: Mapping[str, Any], loaded: Mapping[str, Any], report: Report
) -> None:
    bad = report.skipped_keys.get(index, set())
    for key in sorted(k for k in loaded.keys() & current.keys() if k not in bad):
        if not same_value(loaded[key], current[key]):
            expected = f"{describe(current[key])} (this optimizer)"
            found = f"{describe(loaded[key])} (state dict; this value is loaded)"
            report.changed.append(
                Problem(index, "", key, "hyperparameter-changed", expected, found)
            )


def _entries(target: Target, state: Mapping[Any, Any], report: Report) -> None:
    params = [p for group in target.groups for p in group.params]
    found_slots: set[str] = set()
    unexpected: set[str] = set()
    for match in report.matches:
        if not _is_id(match.saved_id) or match.saved_id not in state:
            continue
        entry = state[match.saved_id]
        if not isinstance(entry, Mapping):
            report.param(match, "", "type", "a dict of state slots", describe(entry))
            continue
        found_slots |= {k for k in entry if isinstance(k, str)}
        group = target.groups[match.group].hyperparameters
        param = params[match.position]
        if target.spec.state_slots is None:
            _generic_entry(match, entry, param, report)
        else:
            unexpected |= _schema_entry(target.spec, match, entry, param, group, report)
        _table_roles(target.second_moments, match, entry, report)
    if unexpected:
        _foreign(target, found_slots, report)


def _table_roles(
    second_moments: frozenset[str] | None,
    match: Match,
    entry: Mapping[Any, Any],
    report: Report,
) -> None:
    """Report quantized slots stored in another table than their name takes."""
    if second_moments is None:
        return
    for key, value in entry.items():
        local = local_of(value)
        if isinstance(key, str) and isinstance(local, QuantizedState):
            finding = role_finding(key, local, second_moments)
            if finding is not None and not structure_findings(local):
                report.param(match, key, *finding)


def _generic_entry(
    match: Match, entry: Mapping[Any, Any], param: ParamInfo, report: Report
) -> None:
    for key, value in entry.items():
        if not isinstance(key, str):
            report.param(match, describe(key), "type", "a string slot name", describe(key))
            continue
        for kind, expected, found in generic_findings(value, param):
            report.param(match, key, kind, expected, found)


def _schema_entry(
    spec: OptimizerSpec,
    match: Match,
    entry: Mapping[Any, Any],
    param: ParamInfo,
    group: Mapping[str, Any],
    report: Report,
) -> set[str]:
    if not entry:
        return set()
    slots = {slot.name: slot for slot in spec.state_slots or ()}
    present = {name for name, slot in slots.items() if slot.present_for(group)}
    for name in sorted(present - entry.keys()):
        if not slots[name].optional:
            report.param(match, name, "missing-slot", "present", "absent")
    unexpected = set()
    for key, value in entry.items():
        if key not in present:
            unexpected.add(str(key))
            report.param(
                match, str(key), "unexpected-slot", _why_absent(slots, key), describe(value)
            )
            continue
        for kind, expected, found in slot_findings(slots[key], value, param):
            report.param(match, key, kind, expected, found)
    return unexpected


def _why_absent(slots: Mapping[str, Any], key: Any) -> str:
    slot = slots.get(key) if isinstance(key, str) else None
    if slot is not None:
        return f"absent ({slot.when} is off)"
    return f"one of {', '.join(sorted(slots))}"


def _foreign(target: Target, found: set[str], report: Report) -> None:
    owners = sorted(
        {
            spec.name
            for spec in target.others
            if spec.state_slots
            and spec.name != target.spec.name
            and found <= {slot.name for slot in spec.state_slots}
        }
    )
    if not owners:
        return
    mine = ", ".join(slot.name for slot in target.spec.state_slots or ())
    expected = f"state of {target.spec.name} ({mine or 'no slots'})"
    found_text = f"state of {' or '.join(owners)} ({', '.join(sorted(found))})"
    report.top("foreign-state", expected, found_text, fatal=False)


def _orphans(state: Mapping[Any, Any], ids: list[list[Any]], report: Report) -> None:
    known = {i for group_ids in ids for i in group_ids if _is_id(i)}
    for key in state:
        if not (_is_id(key) and key in known):
            label = f"#{key}" if _is_id(key) else describe(key)
            problem = Problem(
                -1,
                label,
                "",
                "orphan-state",
                "state only for parameters in param_groups",
                describe(state[key]),
            )
            report.problems.append(problem)

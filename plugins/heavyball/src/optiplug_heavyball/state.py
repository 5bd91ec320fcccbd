"""heavyball's state dict in the shape optiplug validates, and back (torch-free).

heavyball keeps each parameter's state per *view* (``state[param][view][key]``;
one view unless ``split``/``merge_dims`` cut the parameter), a set of
initialised transforms (``is_initialized``), running state in its param
groups (``step_count``, ``base_lr`` ...) and optimizer-wide running state in
a top-level ``"heavyball"`` entry. optiplug's checkpoint format wants string
slot names per parameter and only ``state``/``param_groups`` at the top, so
the bridge's ``state_dict()`` returns the *flat* form:

* ``state[id][key]`` for view 0 and ``state[id]["key@i"]`` for view ``i``;
  a value that is itself a small record (a dict, as Scion keeps) becomes one
  slot per field, ``"key.field"``;
* without ``step``: heavyball puts the group's step counter (the tensor
  ``step_count`` of the group) into the state of the first parameter with a
  gradient only, so it is not a per-parameter slot; the group's
  ``step_count`` is saved, and loading puts it back on the group's first
  parameter (:func:`first_parameter_step`);
* ``is_initialized`` as a sorted tuple (a set does not survive
  ``torch.load(weights_only=True)``);
* the running part of the ``"heavyball"`` entry (``inner_group``: the
  preconditioner-update schedule; ``_fallback_enabled``) as plain keys of
  param group 0 (:data:`INNER_PREFIX`, :data:`FALLBACK_KEY`), declared as
  group state. Its other fields (``compile_step``, ``hessian_approx``,
  ``precond_schedule`` ...) are constructor settings, rebuilt by the
  loading optimizer's constructor, and are dropped.

Loading accepts both the flat form and heavyball's own (converted by a
load pre-hook before validation); a load post-hook puts the loaded state
back in heavyball's nested layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "FALLBACK_KEY",
    "GROUP_STATE",
    "INNER_PREFIX",
    "RNG_STEP",
    "first_parameter_step",
    "flat_state_dict",
    "is_flat_entry",
    "nest_entry",
    "to_flat",
]

INNER_PREFIX = "heavyball_inner_"
"""Group-0 key prefix of heavyball's ``inner_group`` entries."""

FALLBACK_KEY = "heavyball_fallback_enabled"
"""Group-0 key of heavyball's ``_fallback_enabled`` (finite-difference HVP fallback taken)."""

RNG_STEP = "optiplug_rng_step"
"""Group key counting the updates of a seeded (PSGD-family) group: its generator's seed."""

_INNER_KEYS = ("cumulative_prob", "cumulative_prob_prob_step", "total_hvp_steps")

GROUP_STATE: tuple[str, ...] = (
    "param_count",
    "is_preconditioning",
    "base_lr",
    "step_count",
    "step",
    "prev_lr",
    "is_cached",
    "ema_step",
    "precond_step",
    "train_mode",
    "weight_sum",
    *(INNER_PREFIX + key for key in _INNER_KEYS),
    FALLBACK_KEY,
    RNG_STEP,
)
"""Param-group keys heavyball writes while stepping (running state, not hyperparameters)."""

_STEP = "step"
_VIEW = "@"
_FIELD = "."
_INITIALIZED = "is_initialized"


def _flat_entry(entry: Mapping[Any, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for view, slots in entry.items():
        suffix = "" if view == 0 else f"{_VIEW}{view}"
        for key, value in slots.items():
            if key == _STEP:  # the group's step_count, kept on its first parameter only
                continue
            if isinstance(value, Mapping):  # a small record (Scion's {"initialized": True})
                flat.update({f"{key}{_FIELD}{sub}{suffix}": item for sub, item in value.items()})
            else:
                flat[key + suffix] = tuple(sorted(value)) if key == _INITIALIZED else value
    return flat


def _is_nested(entry: Any) -> bool:
    """heavyball's layout: int view keys, each a mapping of slots (anything else is left alone)."""
    return (
        isinstance(entry, Mapping)
        and bool(entry)
        and all(isinstance(k, int) and isinstance(v, Mapping) for k, v in entry.items())
    )


def is_flat_entry(entry: Any) -> bool:
    """Whether a per-parameter state entry is in the flat form (string keys)."""
    return isinstance(entry, Mapping) and all(isinstance(key, str) for key in entry)


def nest_entry(entry: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """heavyball's nested layout of one flat entry.

    Args:
        entry: ``{"key": value, "key@i": value, "record.field": value}``.

    Returns:
        ``{view: {key: value}}``, ``is_initialized`` as a set, records as dicts.
    """
    nested: dict[int, dict[str, Any]] = {}
    for name, value in entry.items():
        left, _, view = name.partition(_VIEW)
        key, _, field = left.partition(_FIELD)
        slots = nested.setdefault(int(view) if view else 0, {})
        if field:
            slots.setdefault(key, {})[field] = value
        else:
            slots[key] = set(value) if key == _INITIALIZED else value
    return nested


def first_parameter_step(state: Any, groups: list[dict[str, Any]]) -> None:
    """Put each group's ``step_count`` back as the ``step`` of its first parameter with state.

    Args:
        state: the optimizer's state (parameter -> ``{view: slots}``), changed in place.
        groups: its param groups.
    """
    for group in groups:
        count = group.get("step_count")
        stateful = [p for p in group["params"] if state.get(p)]
        if count is not None and stateful:
            state[stateful[0]].setdefault(0, {})[_STEP] = count


def _running_keys(stats: Any) -> dict[str, Any]:
    if not isinstance(stats, Mapping):
        return {}
    inner = stats.get("inner_group", {})
    items = inner.items() if isinstance(inner, Mapping) else ()
    keys = {INNER_PREFIX + str(key): value for key, value in items}
    if stats.get("_fallback_enabled"):
        keys[FALLBACK_KEY] = True
    return keys


def flat_state_dict(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The flat form of a heavyball state dict (see the module docstring); a new dict.

    Args:
        state_dict: heavyball's own (``state`` entries nested by view, a
            ``"heavyball"`` entry), or one already flat.

    Returns:
        ``{"state": ..., "param_groups": ...}``; tensors are shared, not copied.
    """
    state = {
        index: _flat_entry(entry) if _is_nested(entry) else entry
        for index, entry in state_dict["state"].items()
    }
    groups = [dict(group) for group in state_dict["param_groups"]]
    if groups:
        groups[0].update(_running_keys(state_dict.get("heavyball", {})))
    return {"state": state, "param_groups": groups}


def to_flat(optimizer: Any, state_dict: Any) -> Any:
    """Load pre-hook: heavyball's own state dict becomes the flat form before validation.

    Args:
        optimizer: the loading optimizer (unused).
        state_dict: the state dict being loaded (never modified).

    Returns:
        The flat form, or None (unchanged) when it is flat already or not a state dict.
    """
    del optimizer
    if not isinstance(state_dict, Mapping) or not isinstance(state_dict.get("state"), Mapping):
        return None
    entries = state_dict["state"].values()
    if "heavyball" not in state_dict and not any(_is_nested(entry) for entry in entries):
        return None
    if not isinstance(state_dict.get("param_groups"), list):
        return None
    return flat_state_dict(state_dict)

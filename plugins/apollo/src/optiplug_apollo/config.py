"""Validated hyperparameters of the bridged APOLLO optimizer (torch-free).

The attrs config class of ``APOLLOAdamW`` built from
:data:`optiplug_apollo.catalog.PARAMS`: a bad value raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value.
The projection keys live in param groups, not in the constructor
(:func:`check_projection_groups` checks them before anything is built).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from optiplug.errors import HyperparameterError
from optiplug.validators import (
    Validator,
    betas,
    boolean,
    hyperparameter,
    learning_rate,
    non_negative,
    positive,
)

from .catalog import CLASS, NAME, PARAMS, PROJ_TYPES, PROJECTION_KEYS, PROJECTORS, SCALE_TYPES

__all__ = ["APOLLOAdamWConfig", "CHECKS", "check_projection_groups"]

CHECKS: dict[str, tuple[Validator, str]] = {
    "lr": (learning_rate, "finite, >= 0"),
    "betas": (betas, "each in [0, 1)"),
    "eps": (positive, "> 0 (0 divides 0 by 0 where a moment is 0)"),
    "non_negative": (non_negative, ">= 0"),
    "bool": (boolean, "bool"),
}
"""``Param.check`` -> (validator, constraint text shown by ``optiplug show``)."""

APOLLOAdamWConfig = attrs.make_class(
    "APOLLOAdamWConfig",
    {p.name: hyperparameter(p.default, *CHECKS[p.check]) for p in PARAMS},
    frozen=True,
)
APOLLOAdamWConfig.__module__ = __name__
APOLLOAdamWConfig.__doc__ = f"Hyperparameters of apollo_torch's {CLASS} ({NAME})."


def check_projection_groups(algorithm: str, params: Sequence[Any]) -> None:
    """Check the projection keys of every param group that carries a ``rank``.

    Such a group needs all of :data:`~optiplug_apollo.catalog.PROJECTION_KEYS`
    (the class reads the six), ``rank`` and ``update_proj_gap`` integers >= 1,
    a finite ``scale`` >= 0 (its square root scales the update), a known
    ``proj``, ``scale_type`` and ``proj_type``, and only matrices.

    Args:
        algorithm: the algorithm's name, for the message.
        params: the parameters as given: tensors, ``(name, tensor)`` pairs or groups.

    Raises:
        HyperparameterError: naming the key, the value and the group; nothing was built.
    """
    groups = [item for item in params if isinstance(item, Mapping)]
    for index, group in enumerate(groups):
        if "rank" in group:
            _check_group(algorithm, f"param group {index}", group)


def _refuse(algorithm: str, key: str, value: Any, reason: str) -> HyperparameterError:
    return HyperparameterError(key, value, reason, algorithm=algorithm)


def _check_group(algorithm: str, where: str, group: Mapping[str, Any]) -> None:
    for key in PROJECTION_KEYS:
        if key not in group:
            needed = ", ".join(PROJECTION_KEYS)
            raise _refuse(algorithm, key, "<missing>", f"{where} has a rank: it needs {needed}")
    for key in ("rank", "update_proj_gap"):
        value = group[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise _refuse(algorithm, key, value, f"must be an integer >= 1 ({where})")
    scale = group["scale"]
    real = isinstance(scale, numbers.Real) and not isinstance(scale, bool)
    if not real or not math.isfinite(scale) or scale < 0:
        raise _refuse(algorithm, "scale", scale, f"must be a finite number >= 0 ({where})")
    for key, known in (("proj", tuple(PROJECTORS)), ("scale_type", SCALE_TYPES)):
        if group[key] not in known:
            raise _refuse(
                algorithm, key, group[key], f"must be one of {', '.join(known)} ({where})"
            )
    if group["proj_type"] not in PROJ_TYPES:
        reason = f"must be one of {', '.join(PROJ_TYPES)} ({where}; APOLLO cannot step 'full')"
        raise _refuse(algorithm, "proj_type", group["proj_type"], reason)
    _check_matrices(algorithm, where, group)


def _check_matrices(algorithm: str, where: str, group: Mapping[str, Any]) -> None:
    items = group.get("params", ())
    items = [items] if hasattr(items, "ndim") else list(items)
    for item in items:
        pair = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
        name, tensor = item if pair else ("a parameter", item)
        if getattr(tensor, "ndim", 2) != 2:
            reason = (
                f"{where} holds {name} of shape {tuple(tensor.shape)}: APOLLO projects matrices"
            )
            raise _refuse(algorithm, "rank", group["rank"], reason)
        if group["scale_type"] == "channel" and not _channel_fits(group["proj_type"], tensor.shape):
            rows, cols = tuple(tensor.shape)
            reason = (
                f"{where}: scale_type='channel' needs the projection to keep the longer side of "
                f"{name} ({rows}x{cols}), as proj_type='std' does; use scale_type='tensor'"
            )
            raise _refuse(algorithm, "proj_type", group["proj_type"], reason)


def projected_side(proj_type: str, rows: int, cols: int) -> str:
    """Which side of a ``rows x cols`` gradient the projection multiplies ("left" or "right")."""
    if proj_type in ("left", "right"):
        return proj_type
    wide_first = "right" if rows >= cols else "left"  # std
    if proj_type == "std":
        return wide_first
    return "left" if wide_first == "right" else "right"  # reverse_std


def _channel_fits(proj_type: str, shape: Any) -> bool:
    """Whether channel scaling can step: it takes norms over the rows of a wide gradient and
    the columns of a tall one, so the projection must keep the other side (any side of a square)."""
    rows, cols = (int(n) for n in shape)
    if rows == cols or proj_type not in PROJ_TYPES:
        return True
    side = projected_side(proj_type, rows, cols)
    return (side == "left") == (rows < cols)

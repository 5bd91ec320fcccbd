"""Validated hyperparameters of the bridged GaLore optimizers (torch-free).

One attrs config class per catalogue entry, built from the table in
:mod:`optiplug_galore.catalog`: a bad value raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value.
The projection keys live in param groups, not in the constructor
(:func:`check_projection_groups` checks them before anything is built).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from optiplug.errors import HyperparameterError
from optiplug.validators import (
    NamedField,
    Validator,
    betas,
    boolean,
    hyperparameter,
    lazy_config,
    lazy_config_lookup,
    learning_rate,
    non_negative,
    positive,
    positive_int,
)

from .catalog import CATALOG, PROJ_TYPES, PROJECTION_KEYS, Entry

__all__ = ["CHECKS", "CONFIGS", "check_projection_groups"]


def _real(field: str, value: Any) -> float:
    """``value`` as a finite float (an int or float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise HyperparameterError(field, value, "must be a real number")
    number = float(value)
    if not math.isfinite(number):
        raise HyperparameterError(field, value, "must be finite")
    return number


def finite(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept any finite real number."""
    _real(attribute.name, value)


def optional_lr(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept None (Adafactor's relative step size) or a learning rate."""
    if value is not None:
        learning_rate(_, attribute, value)


def optional_unit(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept None (no first moment) or a number in [0, 1)."""
    if value is not None and not 0.0 <= _real(attribute.name, value) < 1.0:
        raise HyperparameterError(attribute.name, value, "must be None or in [0, 1)")


def eps_pair(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept Adafactor's ``(eps1, eps2)``: two finite numbers >= 0."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise HyperparameterError(attribute.name, value, "must be a pair (eps1, eps2)")
    if any(_real(f"{attribute.name}[{i}]", e) < 0 for i, e in enumerate(value)):
        raise HyperparameterError(attribute.name, value, "each must be >= 0")


def non_negative_int(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept an int >= 0 (not a bool)."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not integral or value < 0:
        raise HyperparameterError(attribute.name, value, "must be an integer >= 0")


def percentile(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept an int in [1, 100] (bitsandbytes' percentile clipping)."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not integral or not 1 <= value <= 100:
        raise HyperparameterError(attribute.name, value, "must be an integer in [1, 100]")


CHECKS: dict[str, tuple[Validator, str]] = {
    "lr": (learning_rate, "finite, >= 0"),
    "optional_lr": (optional_lr, "None (relative step) or finite, >= 0"),
    "betas": (betas, "each in [0, 1)"),
    "eps": (positive, "> 0 (0 divides 0 by 0 where a moment is 0)"),
    "eps_pair": (eps_pair, "(eps1, eps2), each >= 0"),
    "non_negative": (non_negative, ">= 0"),
    "non_negative_int": (non_negative_int, "an integer >= 0"),
    "positive": (positive, "> 0"),
    "finite": (finite, "finite"),
    "optional_unit": (optional_unit, "None or in [0, 1)"),
    "percentile": (percentile, "an integer in [1, 100]"),
    "bool": (boolean, "bool"),
}
"""``Param.check`` -> (validator, constraint text shown by ``optiplug show``)."""


def _adafactor_rules(config: Any) -> None:
    """The library's own cross-field rules of Adafactor, as typed errors."""
    if config.lr is not None and config.relative_step:
        raise HyperparameterError(
            "relative_step", True, "must be False when lr is given (the library refuses both)"
        )
    if config.warmup_init and not config.relative_step:
        raise HyperparameterError("warmup_init", True, "needs relative_step=True")


def _config_class(item: Entry, name: str) -> type:
    fields = {
        p.name: hyperparameter(p.default, CHECKS[p.check][0], CHECKS[p.check][1])
        for p in item.params
    }
    body = {"__attrs_post_init__": _adafactor_rules} if "relative_step" in fields else None
    return attrs.make_class(name, fields, class_body=body, frozen=True)


def _lazy_config(item: Entry) -> type:
    """The entry's config class, built on first use (``optiplug list`` builds none)."""
    name, doc = f"{item.cls}Config", f"Hyperparameters of galore_torch's {item.cls} ({item.name})."
    return lazy_config(name, partial(_config_class, item, name), module=__name__, doc=doc)


CONFIGS: dict[str, type] = {item.name: _lazy_config(item) for item in CATALOG}
"""Registered name -> its config class (an attrs class built on first use)."""

__getattr__ = lazy_config_lookup(CONFIGS.values())  # importable by name: instances pickle


def check_projection_groups(algorithm: str, params: Sequence[Any]) -> None:
    """Check the projection keys of every param group that carries a ``rank``.

    Such a group needs all of :data:`~optiplug_galore.catalog.PROJECTION_KEYS`
    (the library reads the four), ``rank`` and ``update_proj_gap`` integers
    >= 1, a finite ``scale``, a known ``proj_type``, and only matrices (the
    projector multiplies by a matrix on one side).

    Args:
        algorithm: the algorithm's name, for the message.
        params: the parameters as given: tensors, ``(name, tensor)`` pairs or groups.

    Raises:
        HyperparameterError: naming the key, the value and the group; nothing was built.
    """
    groups = [item for item in params if isinstance(item, Mapping)]
    for index, group in enumerate(groups):
        if "rank" in group:
            _check_group(algorithm, index, group)


def _check_group(algorithm: str, index: int, group: Mapping[str, Any]) -> None:
    where = f"param group {index}"
    for key in PROJECTION_KEYS:
        if key not in group:
            raise HyperparameterError(
                key, "<missing>", f"{where} has a rank: it needs {', '.join(PROJECTION_KEYS)}",
                algorithm=algorithm,
            )  # fmt: skip
    try:
        for key in ("rank", "update_proj_gap"):
            positive_int(None, _Named(key), group[key])
        finite(None, _Named("scale"), group["scale"])
    except HyperparameterError as error:
        raise HyperparameterError(
            error.field, error.value, f"{error.reason} ({where})", algorithm=algorithm
        ) from None
    if group["proj_type"] not in PROJ_TYPES:
        raise HyperparameterError(
            "proj_type", group["proj_type"], f"must be one of {', '.join(PROJ_TYPES)} ({where})",
            algorithm=algorithm,
        )  # fmt: skip
    for name, tensor in _tensors(group.get("params", ())):
        if getattr(tensor, "ndim", 2) != 2:
            raise HyperparameterError(
                "rank", group["rank"], f"{where} holds {name or 'a parameter'} of shape "
                f"{tuple(tensor.shape)}: the projection needs matrices", algorithm=algorithm,
            )  # fmt: skip


@attrs.frozen
class _Named:
    """What a validator reads of an attrs field: its name."""

    name: str


def _tensors(items: Any) -> list[tuple[str | None, Any]]:
    """``(name, tensor)`` for each item of a group's ``params`` (a bare tensor has no name)."""
    if hasattr(items, "ndim"):  # one tensor given as the group's params
        return [(None, items)]
    found: list[tuple[str | None, Any]] = []
    for item in items:
        pair = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
        found.append((item[0], item[1]) if pair else (None, item))
    return found

"""Hyperparameter schemas of the heavyball optimizers, built from the catalogue (torch-free).

Every keyword of a heavyball class is a field of its attrs config class, with
heavyball's default and a validation rule (:data:`RULES`) taken from
heavyball's own checks and documentation. A keyword whose heavyball default
is ``use_default`` (the class decides: ``palm``, ``compile_step``,
``gradient_clipping`` ...) defaults to :data:`~optiplug_heavyball.catalog.LIBRARY_DEFAULT`
and is not passed to the class unless the user sets it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import attrs

from optiplug.errors import HyperparameterError
from optiplug.validators import (
    betas,
    boolean,
    hyperparameter,
    lazy_config,
    lazy_config_lookup,
    learning_rate,
    non_negative,
    positive,
    positive_int,
    unit_interval,
)

from .catalog import CATALOG, LIBRARY_DEFAULT, Param

__all__ = ["CONFIGS", "RULES"]

Check = Callable[[Any, Any, Any], None]

MEMORY_SAVE_MODES = (None, "one_diag", "smart_one_diag", "one_triu", "all_diag")
"""The values heavyball's PSGD preconditioner setup accepts for ``memory_save_mode``."""

STORAGE_DTYPES = ("float32", "float64", "bfloat16", "float16")
"""Floating dtype names heavyball resolves with ``getattr(torch, name)`` for its state."""


def _optional(check: Check) -> Check:
    """``check`` that also accepts None."""

    def optional(instance: Any, attribute: Any, value: Any) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


def _or_library_default(check: Check) -> Check:
    """``check`` that also accepts :data:`LIBRARY_DEFAULT` (the class decides)."""

    def either(instance: Any, attribute: Any, value: Any) -> None:
        if not (isinstance(value, str) and value == LIBRARY_DEFAULT):
            check(instance, attribute, value)

    return either


def non_negative_int(_: Any, attribute: Any, value: Any) -> None:
    """Accept an int >= 0 (not a bool)."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not integral or value < 0:
        raise HyperparameterError(attribute.name, value, "must be an integer >= 0")


def finite(_: Any, attribute: Any, value: Any) -> None:
    """Accept a finite real number."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not number or not math.isfinite(value):
        raise HyperparameterError(attribute.name, value, "must be a finite number")


def _choice(options: tuple[Any, ...]) -> Check:
    def check(_: Any, attribute: Any, value: Any) -> None:
        if value not in options or isinstance(value, bool):
            raise HyperparameterError(attribute.name, value, f"must be one of {options!r}")

    return check


def optional_str(_: Any, attribute: Any, value: Any) -> None:
    """Accept None or a string (heavyball parses error-correction modes itself)."""
    if value is not None and not isinstance(value, str):
        raise HyperparameterError(attribute.name, value, "must be None or a string")


def anything(_: Any, __: Any, ___: Any) -> None:
    """Accept any value (heavyball checks it, e.g. a clipping function or its name)."""


RULES: dict[str, tuple[Check, str]] = {
    "lr": (learning_rate, "finite, >= 0"),
    "betas": (betas, "each in [0, 1), as many as the default"),
    "beta": (unit_interval, "in [0, 1)"),
    "optional_beta": (_optional(unit_interval), "None (from betas) or in [0, 1)"),
    "positive": (positive, "> 0"),
    "non_negative": (non_negative, ">= 0"),
    "finite": (finite, "finite"),
    "optional_finite": (_optional(finite), "None or finite"),
    "optional_positive": (_optional(positive), "None or > 0"),
    "bool": (boolean, "bool"),
    "positive_int": (positive_int, "integer >= 1"),
    "non_negative_int": (non_negative_int, "integer >= 0"),
    "optional_positive_int": (_optional(positive_int), "None or integer >= 1"),
    "dtype_name": (_choice(STORAGE_DTYPES), "one of " + ", ".join(STORAGE_DTYPES)),
    "memory_save_mode": (_choice(MEMORY_SAVE_MODES), "None, one_diag, smart_one_diag, ..."),
    "optional_str": (optional_str, "None or a string"),
    "any": (anything, "not checked here (heavyball checks it)"),
}
"""Rule name (the catalogue's ``Param.rule``) -> (validator, constraint shown by ``optiplug show``)."""


def _field(default: Any, rule: str) -> Any:
    check, constraint = RULES[rule]
    if isinstance(default, str) and default == LIBRARY_DEFAULT:
        return hyperparameter(
            default, _or_library_default(check), f"{constraint}, or {LIBRARY_DEFAULT!r}"
        )
    return hyperparameter(default, check, constraint)


def _config_class(name: str, params: tuple[Param, ...]) -> type:
    fields = {param.name: _field(param.default, param.rule) for param in params}
    return attrs.make_class(name, fields, frozen=True, repr=False, eq=False)


def _lazy_config(name: str, params: tuple[Param, ...]) -> type:
    """The config class of ``params``, built on first use (``optiplug list`` reads no schema)."""
    doc = f"Hyperparameters of heavyball's {name.removesuffix('Config')}."
    return lazy_config(name, lambda: _config_class(name, params), module=__name__, doc=doc)


def _configs() -> dict[str, type]:
    """One class per distinct keyword list (many heavyball classes share theirs)."""
    by_params: dict[tuple[Param, ...], type] = {}
    configs = {}
    for entry in CATALOG:
        if entry.params not in by_params:
            name = entry.target.split(":")[1] + "Config"
            by_params[entry.params] = _lazy_config(name, entry.params)
        configs[entry.name] = by_params[entry.params]
    return configs


CONFIGS: dict[str, type] = _configs()
"""Registered name -> config class (shared by the classes whose keywords are the same)."""

__getattr__ = lazy_config_lookup(CONFIGS.values())  # importable by name: instances pickle

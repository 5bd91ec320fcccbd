"""Validated hyperparameters of every bridged schedule-free optimizer (torch-free).

One attrs config class per catalogue entry, built from the table in
:mod:`optiplug_schedulefree.catalog`: a bad value raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value.
"""

from __future__ import annotations

import math
import numbers
from functools import partial
from typing import Any

import attrs

from optiplug.errors import HyperparameterError
from optiplug.validators import (
    NamedField,
    Validator,
    boolean,
    hyperparameter,
    lazy_config,
    lazy_config_lookup,
    learning_rate,
    non_negative,
    positive,
)

from .catalog import CATALOG, Entry

__all__ = ["CHECKS", "CONFIGS", "schedule_free_betas"]


def _real(field: str, value: Any) -> float:
    """``value`` as a finite float (an int or float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise HyperparameterError(field, value, "must be a real number")
    number = float(value)
    if not math.isfinite(number):
        raise HyperparameterError(field, value, "must be finite")
    return number


def schedule_free_betas(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept ``(beta1, beta2)`` with beta1 in (0, 1) and beta2 in [0, 1).

    ``eval()`` moves the parameters by ``1 - 1/beta1``: a beta1 of 0 divides by zero.
    """
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise HyperparameterError(attribute.name, value, "must be a pair (beta1, beta2)")
    beta1, beta2 = (_real(f"{attribute.name}[{i}]", b) for i, b in enumerate(value))
    if not 0.0 < beta1 < 1.0:
        raise HyperparameterError(attribute.name, value, "beta1 must be in (0, 1)")
    if not 0.0 <= beta2 < 1.0:
        raise HyperparameterError(attribute.name, value, "beta2 must be in [0, 1)")


def open_unit(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a number in (0, 1) (schedulefree's own momentum check)."""
    if not 0.0 < _real(attribute.name, value) < 1.0:
        raise HyperparameterError(attribute.name, value, "must be in (0, 1)")


def finite(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept any finite real number."""
    _real(attribute.name, value)


def non_negative_int(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept an int >= 0 (not a bool)."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not integral or value < 0:
        raise HyperparameterError(attribute.name, value, "must be an integer >= 0")


CHECKS: dict[str, tuple[Validator, str]] = {
    "lr": (learning_rate, "finite, >= 0 (schedulefree: lr >= 0)"),
    "betas": (schedule_free_betas, "beta1 in (0, 1) (eval divides by it), beta2 in [0, 1)"),
    "eps": (positive, "> 0 (0 divides 0 by 0 where a gradient element is 0)"),
    "non_negative": (non_negative, ">= 0"),
    "non_negative_int": (non_negative_int, "an integer >= 0"),
    "finite": (finite, "finite"),
    "bool": (boolean, "bool"),
    "open_unit": (open_unit, "in (0, 1) (schedulefree's check)"),
}
"""``Param.check`` -> (validator, constraint text shown by ``optiplug show``)."""


def _config_class(item: Entry, name: str) -> type:
    fields = {
        p.name: hyperparameter(p.default, CHECKS[p.check][0], CHECKS[p.check][1])
        for p in item.params
    }
    return attrs.make_class(name, fields, frozen=True)


def _lazy_config(item: Entry) -> type:
    """The entry's config class, built on first use (``optiplug list`` builds none)."""
    name, doc = f"{item.cls}Config", f"Hyperparameters of schedulefree's {item.cls} ({item.name})."
    return lazy_config(name, partial(_config_class, item, name), module=__name__, doc=doc)


CONFIGS: dict[str, type] = {item.name: _lazy_config(item) for item in CATALOG}
"""Registered name -> its config class (an attrs class built on first use)."""

__getattr__ = lazy_config_lookup(CONFIGS.values())  # importable by name: instances pickle

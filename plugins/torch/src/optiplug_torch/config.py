"""Hyperparameter schemas of the bridged torch classes, built from the catalogue (torch-free).

Every keyword of a torch class (but its kernel flags, see
:mod:`optiplug_torch.catalog`) is a field of an attrs config class with
torch's default and a rule (:data:`RULES`) taken from the class's own
checks, or optiplug's where torch has none (a finite ``lr``). A bad value
raises :class:`~optiplug.errors.HyperparameterError` naming the field and
value; an unknown keyword is refused by the registry (and by the class).
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

from .catalog import ENTRIES, Param

__all__ = ["CONFIGS", "RULES"]

Check = Callable[[Any, Any, Any], None]


def _real(field: str, value: Any) -> float:
    """``value`` as a float: a finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise HyperparameterError(field, value, "must be a number")
    if not math.isfinite(value):
        raise HyperparameterError(field, value, "must be finite")
    return float(value)


def _pair(field: str, value: Any, length: int) -> tuple[Any, ...]:
    if not isinstance(value, (tuple, list)) or len(value) != length:
        raise HyperparameterError(field, value, f"must be a tuple of {length} numbers")
    return tuple(value)


def positive_lr(_: Any, attribute: Any, value: Any) -> None:
    """Accept a finite learning rate > 0 (SparseAdam refuses 0)."""
    learning_rate(_, attribute, value)
    positive(_, attribute, float(value))


def closed_unit(_: Any, attribute: Any, value: Any) -> None:
    """Accept a number in [0, 1] (Adadelta's ``rho``)."""
    if not 0.0 <= _real(attribute.name, value) <= 1.0:
        raise HyperparameterError(attribute.name, value, "must be in [0, 1]")


def non_positive(_: Any, attribute: Any, value: Any) -> None:
    """Accept a finite number <= 0 (Adafactor's ``beta2_decay``)."""
    if _real(attribute.name, value) > 0:
        raise HyperparameterError(attribute.name, value, "must be <= 0")


def at_least_one(_: Any, attribute: Any, value: Any) -> None:
    """Accept a finite number >= 1 (Adafactor's clipping threshold ``d``)."""
    if _real(attribute.name, value) < 1:
        raise HyperparameterError(attribute.name, value, "must be >= 1")


def etas(_: Any, attribute: Any, value: Any) -> None:
    """Accept Rprop's ``(etaminus, etaplus)`` with 0 < etaminus < 1 < etaplus."""
    low, high = (_real(attribute.name, v) for v in _pair(attribute.name, value, 2))
    if not 0.0 < low < 1.0 < high:
        raise HyperparameterError(attribute.name, value, "must satisfy 0 < etaminus < 1 < etaplus")


def step_sizes(_: Any, attribute: Any, value: Any) -> None:
    """Accept Rprop's ``(min_step, max_step)``: 0 <= min_step <= max_step."""
    low, high = (_real(attribute.name, v) for v in _pair(attribute.name, value, 2))
    if not 0.0 <= low <= high:
        raise HyperparameterError(attribute.name, value, "must satisfy 0 <= min_step <= max_step")


def adafactor_eps(_: Any, attribute: Any, value: Any) -> None:
    """Accept Adafactor's ``(eps1, eps2)``: eps1 None (the dtype's eps) or >= 0, eps2 >= 0."""
    first, second = _pair(attribute.name, value, 2)
    if (first is not None and _real(attribute.name, first) < 0) or _real(
        attribute.name, second
    ) < 0:
        raise HyperparameterError(attribute.name, value, "must be (None or >= 0, >= 0)")


def ns_coefficients(_: Any, attribute: Any, value: Any) -> None:
    """Accept Muon's three Newton-Schulz coefficients ``(a, b, c)``, finite."""
    for item in _pair(attribute.name, value, 3):
        _real(attribute.name, item)


def ns_steps(_: Any, attribute: Any, value: Any) -> None:
    """Accept Muon's Newton-Schulz iteration count: an integer in [1, 100)."""
    positive_int(_, attribute, value)
    if value >= 100:
        raise HyperparameterError(
            attribute.name, value, "must be < 100 (torch's Muon refuses more)"
        )


def _options(options: tuple[Any, ...]) -> Check:
    def check(_: Any, attribute: Any, value: Any) -> None:
        if isinstance(value, bool) or value not in options:
            raise HyperparameterError(attribute.name, value, f"must be one of {options!r}")

    return check


def _optional(check: Check) -> Check:
    def optional(instance: Any, attribute: Any, value: Any) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


RULES: dict[str, tuple[Check, str]] = {
    "lr": (learning_rate, "finite, >= 0"),
    "positive_lr": (positive_lr, "finite, > 0"),
    "betas": (betas, "each in [0, 1)"),
    "non_negative": (non_negative, ">= 0"),
    "momentum": (unit_interval, "in [0, 1)"),
    "positive": (positive, "> 0"),
    "non_positive": (non_positive, "<= 0"),
    "at_least_one": (at_least_one, ">= 1"),
    "closed_unit": (closed_unit, "in [0, 1]"),
    "bool": (boolean, "bool"),
    "positive_int": (positive_int, "integer >= 1"),
    "optional_positive_int": (_optional(positive_int), "None (max_iter * 5 / 4) or integer >= 1"),
    "line_search": (_options((None, "strong_wolfe")), "None or 'strong_wolfe'"),
    "etas": (etas, "0 < etaminus < 1 < etaplus"),
    "step_sizes": (step_sizes, "0 <= min_step <= max_step"),
    "adafactor_eps": (adafactor_eps, "(None or >= 0, >= 0)"),
    "ns_coefficients": (ns_coefficients, "three finite numbers"),
    "ns_steps": (ns_steps, "integer in [1, 100)"),
    "adjust_lr_fn": (_options((None, "original", "match_rms_adamw")), "None, 'original' or "
                     "'match_rms_adamw'"),
}  # fmt: skip
"""Rule name (the catalogue's ``Param.rule``) -> (validator, constraint ``optiplug show`` prints)."""


def _config_class(name: str, params: tuple[Param, ...]) -> type:
    fields = {p.name: hyperparameter(p.default, RULES[p.rule][0], RULES[p.rule][1]) for p in params}
    return attrs.make_class(name, fields, frozen=True, kw_only=True)


def _lazy_config(name: str, params: tuple[Param, ...]) -> type:
    doc = f"Hyperparameters of torch.optim.{name.removesuffix('Config')}."
    return lazy_config(name, lambda: _config_class(name, params), module=__name__, doc=doc)


CONFIGS: dict[str, type] = {
    entry.name: _lazy_config(f"{entry.class_name}Config", entry.params) for entry in ENTRIES
}
"""Registered name -> config class (an attrs class built on first use)."""

__getattr__ = lazy_config_lookup(CONFIGS.values())  # importable by name: instances pickle

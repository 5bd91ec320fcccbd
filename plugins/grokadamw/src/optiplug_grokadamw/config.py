"""Validated hyperparameters of the bridged GrokAdamW (torch-free).

The attrs config class of ``GrokAdamW`` built from
:data:`optiplug_grokadamw.catalog.PARAMS`: a bad value raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import attrs

from optiplug.errors import HyperparameterError
from optiplug.validators import (
    NamedField,
    Validator,
    betas,
    hyperparameter,
    learning_rate,
    non_negative,
    positive,
)

from .catalog import CLASS, NAME, PARAMS

__all__ = ["CHECKS", "GrokAdamWConfig"]


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


def closed_unit(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a number in [0, 1] (an EMA decay, or gamma: beta1 * (1 - gamma) ** i stays in [0, 1))."""
    if not 0.0 <= _real(attribute.name, value) <= 1.0:
        raise HyperparameterError(attribute.name, value, "must be in [0, 1]")


def signal_fns(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept None or a list of callables returning a float (or None)."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not all(callable(fn) for fn in value):
        raise HyperparameterError(attribute.name, value, "must be None or a list of callables")


CHECKS: dict[str, tuple[Validator, str]] = {
    "lr": (learning_rate, "finite, >= 0"),
    "betas": (betas, "each in [0, 1)"),
    "eps": (positive, "> 0 (0 divides 0 by 0 where a moment is 0)"),
    "non_negative": (non_negative, ">= 0"),
    "closed_unit": (closed_unit, "in [0, 1]"),
    "finite": (finite, "finite"),
    "signal_fns": (signal_fns, "None or a list of callables"),
}
"""``Param.check`` -> (validator, constraint text shown by ``optiplug show``)."""

GrokAdamWConfig = attrs.make_class(
    "GrokAdamWConfig",
    {p.name: hyperparameter(p.default, *CHECKS[p.check]) for p in PARAMS},
    frozen=True,
)
GrokAdamWConfig.__module__ = __name__
GrokAdamWConfig.__doc__ = f"Hyperparameters of grokadamw's {CLASS} ({NAME})."

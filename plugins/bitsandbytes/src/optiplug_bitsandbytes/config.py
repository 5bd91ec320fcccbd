"""Validated hyperparameters of every bridged bitsandbytes optimizer (torch-free).

One attrs config class per catalogue entry, built from the table in
:mod:`optiplug_bitsandbytes.catalog`: a bad value raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value.
"""

from __future__ import annotations

import numbers
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
    unit_interval,
)

from .catalog import CATALOG, REQUIRED, Entry, Param

__all__ = ["CHECKS", "CONFIGS", "config_of", "momentum_required"]


def optim_bits(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept 8 or 32 (the state bits bitsandbytes implements)."""
    if isinstance(value, bool) or value not in (8, 32):
        raise HyperparameterError(attribute.name, value, "must be 8 or 32")


def element_count(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept an int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise HyperparameterError(attribute.name, value, "must be an integer >= 0")


def optional_steps(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept None or an int >= 1."""
    if value is not None:
        positive_int(_, attribute, value)


MOMENTUM_REQUIRED = "must be > 0: bitsandbytes implements this optimizer with momentum only"


def momentum_required(value: Any, algorithm: str) -> None:
    """Refuse a zero momentum where bitsandbytes' step needs one (SGD, LARS).

    The config field keeps the library's default of 0 (so a saved param
    group, which holds no momentum, validates); the optimizer refuses it
    when built (:mod:`optiplug_bitsandbytes.optimizers`).

    Raises:
        HyperparameterError: ``value`` is 0.
    """
    if value == 0:
        raise HyperparameterError("momentum", value, MOMENTUM_REQUIRED, algorithm=algorithm)


def smoothing(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a smoothing constant in (0, 1) (bitsandbytes refuses 0)."""
    unit_interval(_, attribute, value)
    if value == 0:
        raise HyperparameterError(attribute.name, value, "must be in (0, 1)")


def required_learning_rate(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a learning rate, refusing a missing one (the class has no default)."""
    if value is REQUIRED:
        reason = "is required: the bitsandbytes class has no default learning rate"
        raise HyperparameterError(attribute.name, value, reason)
    learning_rate(_, attribute, value)


CHECKS: dict[str, tuple[Validator, str]] = {
    "lr": (learning_rate, "finite, >= 0 (bitsandbytes: lr >= 0)"),
    "lr_required": (required_learning_rate, "required; finite, >= 0"),
    "betas": (betas, "each in [0, 1) (bitsandbytes' check)"),
    "eps": (positive, "> 0 (0 divides 0 by 0 where a gradient element is 0)"),
    "non_negative": (non_negative, ">= 0"),
    "momentum": (unit_interval, "in [0, 1)"),
    "momentum_required": (unit_interval, "in (0, 1), > 0 when built: no momentum-free variant"),
    "smoothing": (smoothing, "in (0, 1)"),
    "bool": (boolean, "bool"),
    "optim_bits": (optim_bits, "8 or 32"),
    "size": (element_count, "an integer >= 0"),
    "optional_steps": (optional_steps, "None or an integer >= 1"),
}
"""``Param.check`` -> (validator, constraint text shown by ``optiplug show``)."""


def only_default(param: Param) -> Validator:
    """A validator accepting ``param``'s default only, saying why.

    Args:
        param: a keyword whose check is ``"fixed"``.

    Returns:
        An attrs validator raising :class:`HyperparameterError`.
    """

    def check(_: Any, attribute: NamedField, value: Any) -> None:
        if type(value) is not type(param.default) or value != param.default:
            reason = f"must be {param.default!r}: {param.reason}"
            raise HyperparameterError(attribute.name, value, reason)

    return check


def _field(param: Param) -> Any:
    if param.check == "fixed":
        return hyperparameter(param.default, only_default(param), f"only {param.default!r}")
    validator, constraint = CHECKS[param.check]
    return hyperparameter(param.default, validator, constraint)


def _config_class(item: Entry, name: str) -> type:
    fields = {p.name: _field(p) for p in item.params}
    return attrs.make_class(name, fields, frozen=True)


def _lazy_config(item: Entry) -> type:
    """The entry's config class, built on first use (``optiplug list`` builds none)."""
    name, doc = f"{item.cls}Config", f"Hyperparameters of bitsandbytes' {item.cls} ({item.name})."
    return lazy_config(name, partial(_config_class, item, name), module=__name__, doc=doc)


CONFIGS: dict[str, type] = {item.name: _lazy_config(item) for item in CATALOG}
"""Registered name -> its config class (limited entries too: their keywords are checked)."""

__getattr__ = lazy_config_lookup(CONFIGS.values())  # importable by name: instances pickle


def config_of(name: str) -> type:
    """The config class of the entry registered as ``name``.

    Raises:
        KeyError: no such entry.
    """
    return CONFIGS[name]

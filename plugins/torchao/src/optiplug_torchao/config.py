"""Validated hyperparameters of every bridged torchao optimizer (torch-free).

One attrs config class per catalogue entry, built from the table in
:mod:`optiplug_torchao.catalog`: a bad value raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value.
"""

from __future__ import annotations

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

from .catalog import CATALOG, Entry

__all__ = ["CHECKS", "CONFIGS", "config_of"]


def optimizer_class(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a class (an optimizer class to run on the CPU copies)."""
    if not isinstance(value, (type, str)):
        raise HyperparameterError(attribute.name, value, "must be an optimizer class")


CHECKS: dict[str, tuple[Validator, str]] = {
    "lr": (learning_rate, "finite, >= 0 (torchao: lr >= 0)"),
    "betas": (betas, "a pair, each in [0, 1) (torchao's check)"),
    "eps": (positive, "> 0 (0 divides 0 by 0 where a gradient element is 0)"),
    "non_negative": (non_negative, ">= 0"),
    "bool": (boolean, "bool"),
    "positive_int": (positive_int, "an integer >= 1"),
    "optimizer_class": (optimizer_class, "a torch.optim.Optimizer subclass"),
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
    name = f"{item.cls.lstrip('_')}Config"
    doc = f"Hyperparameters of torchao's {item.cls} ({item.name})."
    return lazy_config(name, partial(_config_class, item, name), module=__name__, doc=doc)


CONFIGS: dict[str, type] = {item.name: _lazy_config(item) for item in CATALOG}
"""Registered name -> its config class (an attrs class built on first use)."""

__getattr__ = lazy_config_lookup(CONFIGS.values())  # importable by name: instances pickle


def config_of(name: str) -> type:
    """The config class of the entry registered as ``name``.

    Raises:
        KeyError: no such entry.
    """
    return CONFIGS[name]

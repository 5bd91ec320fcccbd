"""Hyperparameter schemas built from the catalogue: one attrs config class per optimizer.

Torch-free: ``optiplug list`` builds them. Every value is checked for its
type (from the signature's default and annotation) and range (the library's
own ``validate_*`` checks, or optiplug's well-known rule where that is
stricter: a finite ``lr``, a positive ``eps``); a bad one raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs

from optiplug.errors import HyperparameterError
from optiplug.validators import hyperparameter, lazy_config, lazy_config_lookup

from .table import REQUIRED, Entry, LibraryDefault, Param

__all__ = ["config_class", "constraint_text"]

Check = Callable[[Any, Any, Any], None]


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _number(name: str, value: Any, integral: bool = False) -> float:
    """``value`` as a float: an int or float (a 0-d tensor too, unless ``integral``)."""
    if isinstance(value, bool):
        raise HyperparameterError(name, value, "must be a number, not a bool")
    if _is_tensor(value) and not integral:
        if value.ndim != 0 or value.dtype.is_complex:
            raise HyperparameterError(name, value, "must be a real number or a 0-d tensor")
        return float(value.item())
    wanted = numbers.Integral if integral else numbers.Real
    if not isinstance(value, wanted):
        raise HyperparameterError(
            name, value, "must be an integer" if integral else "must be a number"
        )
    return float(value)


def _in_range(name: str, value: Any, number: float, constraint: tuple[Any, ...]) -> None:
    kind = constraint[0] if constraint else ""
    if kind == "lr" and not (math.isfinite(number) and number >= 0):
        raise HyperparameterError(name, value, "must be finite and >= 0")
    if math.isnan(number):
        raise HyperparameterError(name, value, "must not be NaN")
    if kind == "non_negative" and number < 0:
        raise HyperparameterError(name, value, "must be >= 0")
    if kind == "positive" and number <= 0:
        raise HyperparameterError(name, value, "must be > 0")
    if kind == "non_positive" and number > 0:
        raise HyperparameterError(name, value, "must be <= 0")
    if kind == "step" and number < 1:
        raise HyperparameterError(name, value, "must be >= 1")
    if kind == "range" and not _inside(number, *constraint[1:]):
        raise HyperparameterError(name, value, f"must be in {_interval(*constraint[1:])}")


def _inside(number: float, low: float, high: float, kind: str) -> bool:
    above = low <= number if kind[0] == "[" else low < number
    below = number <= high if kind[1] == "]" else number < high
    return above and below


def _interval(low: float, high: float, kind: str) -> str:
    return f"{kind[0]}{low:g}, {high:g}{kind[1]}"


def _betas(name: str, value: Any, default: tuple[Any, ...], kinds: tuple[str, ...]) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != len(default):
        names = ", ".join(f"beta{i + 1}" for i in range(len(default)))
        raise HyperparameterError(name, value, f"must be a tuple of {len(default)} ({names})")
    for index, (beta, kind) in enumerate(zip(value, kinds, strict=True)):
        if beta is None and default[index] is None:
            continue
        number = _number(name, beta)
        if not _inside(number, 0.0, 1.0, kind):
            raise HyperparameterError(
                name, value, f"beta{index + 1} must be in {_interval(0, 1, kind)}"
            )


def _check_value(param: Param, value: Any) -> None:
    """Raise :class:`HyperparameterError` when ``value`` is not valid for ``param``."""
    name, kind, constraint = param.name, param.kind, param.constraint
    if isinstance(value, LibraryDefault) or value is REQUIRED:
        return  # not passed on (a required one is refused by the wrapper when still missing)
    if kind == "any" or (value is None and kind.endswith("?")):
        return
    if kind == "betas":
        _betas(name, value, param.default, constraint[1:] or ("[)",) * len(param.default))
    elif kind == "bool":
        if not isinstance(value, bool):
            raise HyperparameterError(name, value, "must be True or False")
    elif kind.startswith("str"):
        if not isinstance(value, str):
            raise HyperparameterError(name, value, "must be a string")
        if constraint and constraint[0] == "options" and value not in constraint[1]:
            raise HyperparameterError(name, value, f"must be one of {', '.join(constraint[1])}")
    elif kind.startswith(("float", "int", "required")):
        if kind == "required" and not constraint:
            return
        number = _number(name, value, integral=kind.startswith("int"))
        _in_range(name, value, number, constraint)


def constraint_text(param: Param) -> str:
    """The constraint as ``optiplug show`` prints it."""
    kind, constraint = param.kind, param.constraint
    words = {
        "lr": "finite, >= 0",
        "non_negative": ">= 0",
        "positive": "> 0",
        "non_positive": "<= 0",
        "step": ">= 1",
    }
    head = constraint[0] if constraint else ""
    if kind == "betas":
        text = ", ".join(
            f"beta{i + 1} in {_interval(0, 1, k)}" for i, k in enumerate(constraint[1:])
        )
    elif head == "range":
        text = f"in {_interval(*constraint[1:])}"
    elif head == "options":
        text = "one of " + ", ".join(constraint[1])
    else:
        text = words.get(head, "")
    base = {
        "bool": "bool",
        "int": "integer",
        "int?": "integer or None",
        "str": "string",
        "str?": "string or None",
        "float?": "number or None",
        "any": "any value",
    }.get(kind, "")
    return "; ".join(part for part in (base, text) if part)


def _validator(param: Param) -> Check:
    def check(_: Any, __: Any, value: Any) -> None:
        _check_value(param, value)

    return check


def _extra_params(entry: Entry) -> tuple[Param, ...]:
    """Group keys the bridge accepts beyond the signature: the Muon family's group roles."""
    if entry.muon_groups:
        return (Param("use_muon", None, "bool?", ()), Param("use_adamw", None, "bool?", ()))
    return ()


_CONFIGS: dict[str, type] = {}


def config_class(entry: Entry) -> type:
    """The config class validating ``entry``'s keywords (one per entry; attrs, built lazily)."""
    if entry.name not in _CONFIGS:
        name = "".join(part.capitalize() for part in entry.name.split("_")) + "Config"
        doc = f"Hyperparameters of pytorch-optimizer's {entry.target.rpartition(':')[2]}."
        build = partial(_attrs_class, entry, name)
        _CONFIGS[entry.name] = lazy_config(name, build, module=__name__, doc=doc)
    return _CONFIGS[entry.name]


def __getattr__(name: str) -> type:
    """A config class by its name, built if need be (so its instances pickle)."""
    return lazy_config_lookup(_CONFIGS.values())(name)


def _attrs_class(entry: Entry, name: str) -> type:
    """The attrs config class of ``entry`` (every field keyword-only)."""
    fields: dict[str, Any] = {}
    for param in (*entry.params, *_extra_params(entry)):
        text = constraint_text(param)
        if param.default is REQUIRED:
            text = f"required; {text}" if text else "required"
        fields[param.name] = hyperparameter(param.default, _validator(param), text)
    return attrs.make_class(name, fields, frozen=True, kw_only=True)

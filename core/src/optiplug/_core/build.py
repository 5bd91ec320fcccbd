"""Building a registered schedule by name: keyword checks, then the spec's factory."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._core.specs import ScheduleSpec
from ..errors import HyperparameterError, closest_name

__all__ = ["build_schedule"]

_MISSING = "<missing>"
_UNKNOWN = "<unknown keyword>"


# ------------------------------------------------------------------ building by name
def _signature_parameters(factory: Callable[..., Any]) -> list[inspect.Parameter] | None:
    target = factory.resolve() if hasattr(factory, "resolve") else factory
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p for p in parameters if p.kind in kinds and p.name != "self"]


def _check_keywords(name: str, factory: Callable[..., Any], kwargs: Iterable[str]) -> None:
    """Reject unknown keywords (with a did-you-mean) and missing required ones."""
    parameters = _signature_parameters(factory)
    if parameters is None:
        return
    known = {p.name for p in parameters}
    given = set(kwargs)
    for keyword in sorted(given - known):
        accepted = ", ".join(sorted(known)) or "none"
        suggestion = closest_name(keyword, known)
        hint = f"; did you mean {suggestion!r}?" if suggestion else ""
        raise HyperparameterError(
            keyword,
            _UNKNOWN,
            f"unknown parameter {keyword!r} for schedule {name}{hint} (accepted: {accepted})",
            algorithm=name,
            suggestion=suggestion,
        )
    for parameter in parameters:
        if parameter.default is inspect.Parameter.empty and parameter.name not in given:
            raise HyperparameterError(
                parameter.name,
                _MISSING,
                f"schedule {name}: missing required parameter {parameter.name!r}",
                algorithm=name,
            )


def build_schedule(spec: ScheduleSpec, kwargs: Mapping[str, Any]) -> Any:
    """Build the schedule ``spec`` describes from user keywords.

    Args:
        spec: the registered schedule.
        kwargs: its parameters.

    Returns:
        Whatever ``spec.factory`` returns (a :class:`Schedule` for built-ins).

    Raises:
        HyperparameterError: an unknown keyword (with a did-you-mean), a
            missing required one, or an invalid value; it names the schedule.
    """
    _check_keywords(spec.name, spec.factory, kwargs)
    try:
        return spec.factory(**kwargs)
    except HyperparameterError as error:
        if error.algorithm:
            raise
        raise error.for_algorithm(spec.name) from None

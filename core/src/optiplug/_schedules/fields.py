"""Schedule parameter kinds (validated attrs fields) and the shape arithmetic they share."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import attrs

from ..errors import HyperparameterError

__all__ = [
    "AT_LEAST_ONE",
    "FRACTION",
    "GAMMA",
    "Kind",
    "POSITIVE",
    "POSITIVE_STEPS",
    "RATIO",
    "STEPS",
    "blend_from",
    "check_warmup",
    "half_cosine",
    "invalid",
    "is_int",
    "is_real",
    "param",
    "progress_of",
    "schedule_name",
    "to_float",
    "to_int",
    "warmup_factor",
]


# ------------------------------------------------------------------ parameter kinds
def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite real number (not a bool)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


def to_int(value: Any) -> Any:
    """Normalise integers (numpy ints too) to ``int``; leave the rest for the validator."""
    return int(value) if is_int(value) else value


def to_float(value: Any) -> Any:
    """Normalise real numbers to ``float``; leave the rest for the validator."""
    return float(value) if is_real(value) else value


@attrs.frozen
class Kind:
    """How one kind of schedule parameter is converted, checked and described."""

    converter: Callable[[Any], Any]
    test: Callable[[Any], bool]
    constraint: str


STEPS = Kind(to_int, lambda v: is_int(v) and v >= 0, "an integer >= 0")
POSITIVE_STEPS = Kind(to_int, lambda v: is_int(v) and v >= 1, "an integer >= 1")
RATIO = Kind(to_float, lambda v: is_real(v) and 0.0 <= v <= 1.0, "a number in [0, 1]")
FRACTION = Kind(to_float, lambda v: is_real(v) and 0.0 <= v < 1.0, "a number in [0, 1)")
GAMMA = Kind(to_float, lambda v: is_real(v) and 0.0 < v <= 1.0, "a number in (0, 1]")
POSITIVE = Kind(to_float, lambda v: is_real(v) and v > 0.0, "a finite number > 0")
AT_LEAST_ONE = Kind(to_float, lambda v: is_real(v) and v >= 1.0, "a finite number >= 1")


def schedule_name(instance: Any) -> str:
    return getattr(type(instance), "name", "") or type(instance).__name__


def invalid(instance: Any, field: str, value: Any, reason: str) -> HyperparameterError:
    return HyperparameterError(field, value, reason, algorithm=schedule_name(instance))


def param(kind: Kind, default: Any = attrs.NOTHING, *, help: str) -> Any:
    """Declare one validated schedule parameter.

    Args:
        kind: its conversion, check and constraint text.
        default: the default; omitted means required.
        help: what the parameter means, shown by ``optiplug show``.

    Returns:
        An ``attrs.field`` raising :class:`HyperparameterError` on a bad value.
    """

    def validate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not kind.test(value):
            raise invalid(instance, attribute.name, value, f"must be {kind.constraint}")

    return attrs.field(
        default=default,
        converter=kind.converter,
        validator=validate,
        metadata={"constraint": kind.constraint, "help": help},
    )


def check_warmup(schedule: Any) -> None:
    """Refuse a warm-up longer than the whole schedule."""
    if schedule.warmup_steps > schedule.total_steps:
        raise invalid(
            schedule,
            "warmup_steps",
            schedule.warmup_steps,
            f"must be <= total_steps ({schedule.total_steps})",
        )


# ------------------------------------------------------------------ shared formulas
def warmup_factor(step: int, warmup_steps: int, start_factor: float = 0.0) -> float:
    """Linear warm-up factor of step ``step < warmup_steps``; never 0 at step 0."""
    return start_factor + (1.0 - start_factor) * (step + 1) / warmup_steps


def progress_of(step: int, start: int, length: int) -> float:
    """Fraction of a phase of ``length`` steps starting at ``start`` done, clamped to [0, 1]."""
    return min(1.0, max(0.0, (step - start) / max(1, length)))


def half_cosine(progress: float) -> float:
    """1 at progress 0, 0 at progress 1, along half a cosine period."""
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def blend_from(low: float, progress_factor: float) -> float:
    """``low + (1 - low) * factor``: rescale a 1 -> 0 factor to 1 -> ``low``."""
    return low + (1.0 - low) * progress_factor


# ------------------------------------------------------------------ base class

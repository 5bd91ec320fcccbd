"""The built-in schedule shapes (``constant``, ``cosine``, ``wsd``...), one frozen class each.

Their public home is :mod:`optiplug.builtin_schedules` (what their
``__module__`` says, so pickles name it); :func:`optiplug.schedule` builds them
by name.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import attrs

from ..errors import HyperparameterError, closest_name
from .base import Schedule
from .fields import (
    AT_LEAST_ONE,
    FRACTION,
    GAMMA,
    POSITIVE,
    POSITIVE_STEPS,
    RATIO,
    STEPS,
    blend_from,
    check_warmup,
    half_cosine,
    invalid,
    is_int,
    param,
    progress_of,
    to_int,
    warmup_factor,
)

__all__ = [
    "BUILTIN_SCHEDULES",
    "ConstantSchedule",
    "CosineSchedule",
    "ExponentialSchedule",
    "InverseSqrtSchedule",
    "LinearSchedule",
    "LinearWarmupSchedule",
    "MultiStepSchedule",
    "OneCycleSchedule",
    "PolynomialSchedule",
    "SequenceSchedule",
    "StepSchedule",
    "WSDSchedule",
]

# ------------------------------------------------------------------ built-ins
PUBLIC_MODULE = "optiplug.builtin_schedules"
"""Where the built-in schedule classes are public (their ``__module__``)."""


_S = TypeVar("_S", bound=Schedule)


def _public(cls: type[_S]) -> type[_S]:
    """Make the schedule class ``cls`` report its public module."""
    cls.__module__ = PUBLIC_MODULE
    return cls


_WARMUP_HELP = "linear warm-up steps; step s < W uses (s + 1) / W"


@_public
@attrs.frozen(kw_only=True, repr=False)
class ConstantSchedule(Schedule):
    """Constant multiplier 1: the base lr throughout."""

    name: ClassVar[str] = "constant"
    formula: ClassVar[str] = "1"

    def value_at(self, step: int) -> float:
        return 1.0


@_public
@attrs.frozen(kw_only=True, repr=False)
class LinearWarmupSchedule(Schedule):
    """Linear warm-up from start_factor to 1, then constant 1.

    Attributes:
        warmup_steps: W; 0 means no warm-up.
        start_factor: the factor the ramp starts from (step -1 in effect).
    """

    name: ClassVar[str] = "linear_warmup"
    formula: ClassVar[str] = """
        s < W:  start_factor + (1 - start_factor) * (s + 1) / W
        s >= W: 1
        """

    warmup_steps: int = param(STEPS, help="W, warm-up length in steps")
    start_factor: float = param(RATIO, 0.0, help="factor the ramp starts from")

    def value_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return warmup_factor(step, self.warmup_steps, self.start_factor)
        return 1.0

    def key_steps(self) -> dict[int, str]:
        return {self.warmup_steps: "warm-up done"} if self.warmup_steps else {}


@attrs.frozen(kw_only=True, repr=False)
class _WarmupThenDecay(Schedule):
    """Linear warm-up to 1 over ``warmup_steps``, then a decay reaching ``_final()`` at ``total_steps``.

    Subclasses declare ``total_steps`` and ``warmup_steps`` and give the
    decay's shape (``_decay(p)``, from 1 at p=0 to 0 at p=1) and its final
    multiplier (``_final()``).
    """

    def __attrs_post_init__(self) -> None:
        check_warmup(self)

    def _final(self) -> float:
        raise NotImplementedError

    def _decay(self, progress: float) -> float:
        raise NotImplementedError

    # ``warmup_steps`` and ``total_steps`` are fields of each subclass (declaring
    # them here would make them fields of this class too): hence the ignores.
    def value_at(self, step: int) -> float:
        warmup, total = self.warmup_steps, self.total_steps  # type: ignore[attr-defined]
        if step < warmup:
            return warmup_factor(step, warmup)
        return blend_from(self._final(), self._decay(progress_of(step, warmup, total - warmup)))

    def key_steps(self) -> dict[int, str]:
        return _warmup_and_end(self.warmup_steps, self.total_steps)  # type: ignore[attr-defined]


def _warmup_and_end(warmup_steps: int, total_steps: int) -> dict[int, str]:
    steps = {warmup_steps: "warm-up done"} if warmup_steps else {}
    return {**steps, total_steps: "end"}


@_public
@attrs.frozen(kw_only=True, repr=False)
class CosineSchedule(_WarmupThenDecay):
    """Linear warm-up, then cosine decay from 1 to min_ratio at total_steps.

    Attributes:
        total_steps: T, the step at which the decay reaches min_ratio.
        warmup_steps: W <= T.
        min_ratio: the final multiplier.
    """

    name: ClassVar[str] = "cosine"
    formula: ClassVar[str] = """
        s < W:  (s + 1) / W
        s >= W: min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2
                p = min(1, (s - W) / max(1, T - W))
        """

    total_steps: int = param(POSITIVE_STEPS, help="T, step at which min_ratio is reached")
    warmup_steps: int = param(STEPS, 0, help=_WARMUP_HELP)
    min_ratio: float = param(RATIO, 0.0, help="final multiplier")

    def _final(self) -> float:
        return self.min_ratio

    def _decay(self, progress: float) -> float:
        return half_cosine(progress)


@_public
@attrs.frozen(kw_only=True, repr=False)
class LinearSchedule(_WarmupThenDecay):
    """Linear warm-up, then linear decay from 1 to min_ratio at total_steps.

    Attributes:
        total_steps: T, the step at which the decay reaches min_ratio.
        warmup_steps: W <= T.
        min_ratio: the final multiplier.
    """

    name: ClassVar[str] = "linear"
    formula: ClassVar[str] = """
        s < W:  (s + 1) / W
        s >= W: min_ratio + (1 - min_ratio) * (1 - p)
                p = min(1, (s - W) / max(1, T - W))
        """

    total_steps: int = param(POSITIVE_STEPS, help="T, step at which min_ratio is reached")
    warmup_steps: int = param(STEPS, 0, help=_WARMUP_HELP)
    min_ratio: float = param(RATIO, 0.0, help="final multiplier")

    def _final(self) -> float:
        return self.min_ratio

    def _decay(self, progress: float) -> float:
        return 1.0 - progress


@_public
@attrs.frozen(kw_only=True, repr=False)
class StepSchedule(Schedule):
    """Multiply by gamma every step_size steps (torch's StepLR).

    Attributes:
        step_size: steps between decays.
        gamma: the decay factor.
    """

    name: ClassVar[str] = "step"
    formula: ClassVar[str] = "gamma ** floor(s / step_size)"

    step_size: int = param(POSITIVE_STEPS, help="steps between decays")
    gamma: float = param(GAMMA, 0.1, help="decay factor")

    def value_at(self, step: int) -> float:
        return self.gamma ** (step // self.step_size)

    def key_steps(self) -> dict[int, str]:
        return {self.step_size: "first decay"}


def _milestones(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(to_int(item) for item in value)
    return value


def _strictly_increasing(instance: Any, field: str, values: Any, minimum: int) -> None:
    """Check ``values`` is a sequence of integers >= minimum, strictly increasing."""
    if not isinstance(values, tuple) or not all(is_int(v) for v in values):
        raise invalid(instance, field, values, "must be a list of integers")
    if values and values[0] < minimum:
        raise invalid(instance, field, values, f"must all be >= {minimum}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise invalid(instance, field, values, "must be strictly increasing")


@_public
@attrs.frozen(kw_only=True, repr=False)
class MultiStepSchedule(Schedule):
    """Multiply by gamma at each milestone (torch's MultiStepLR).

    Attributes:
        milestones: strictly increasing steps at which to decay.
        gamma: the decay factor.
    """

    name: ClassVar[str] = "multistep"
    formula: ClassVar[str] = "gamma ** (number of milestones <= s)"

    milestones: tuple[int, ...] = attrs.field(
        converter=_milestones,
        metadata={"constraint": "increasing integers >= 0", "help": "steps at which to decay"},
    )
    gamma: float = param(GAMMA, 0.1, help="decay factor")

    @milestones.validator
    def _check_milestones(self, _: attrs.Attribute[Any], value: Any) -> None:
        _strictly_increasing(self, "milestones", value, 0)

    def value_at(self, step: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, step)

    def key_steps(self) -> dict[int, str]:
        return {m: f"decay {i + 1}" for i, m in enumerate(self.milestones)}


@_public
@attrs.frozen(kw_only=True, repr=False)
class ExponentialSchedule(Schedule):
    """Multiply by gamma every step (torch's ExponentialLR).

    Attributes:
        gamma: the per-step decay factor.
    """

    name: ClassVar[str] = "exponential"
    formula: ClassVar[str] = "gamma ** s"

    gamma: float = param(GAMMA, help="per-step decay factor")

    def value_at(self, step: int) -> float:
        return self.gamma**step


@_public
@attrs.frozen(kw_only=True, repr=False)
class PolynomialSchedule(_WarmupThenDecay):
    """Linear warm-up, then polynomial decay from 1 to end_ratio at total_steps.

    Attributes:
        total_steps: T, the step at which end_ratio is reached.
        power: the exponent (1 is linear).
        end_ratio: the final multiplier.
        warmup_steps: W <= T.
    """

    name: ClassVar[str] = "polynomial"
    formula: ClassVar[str] = """
        s < W:  (s + 1) / W
        s >= W: end_ratio + (1 - end_ratio) * (1 - p) ** power
                p = min(1, (s - W) / max(1, T - W))
        """

    total_steps: int = param(POSITIVE_STEPS, help="T, step at which end_ratio is reached")
    power: float = param(POSITIVE, 1.0, help="exponent of the decay")
    end_ratio: float = param(RATIO, 0.0, help="final multiplier")
    warmup_steps: int = param(STEPS, 0, help=_WARMUP_HELP)

    def _final(self) -> float:
        return self.end_ratio

    def _decay(self, progress: float) -> float:
        decayed: float = (1.0 - progress) ** self.power  # a real power of a number >= 0
        return decayed


@_public
@attrs.frozen(kw_only=True, repr=False)
class InverseSqrtSchedule(Schedule):
    """Linear warm-up, then decay as the inverse square root of the step.

    Attributes:
        warmup_steps: W >= 1; the multiplier is 1 at step W - 1 and W.
    """

    name: ClassVar[str] = "inverse_sqrt"
    formula: ClassVar[str] = """
        s < W:  (s + 1) / W
        s >= W: sqrt(W / s)
        """

    warmup_steps: int = param(POSITIVE_STEPS, help=_WARMUP_HELP)

    def value_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return warmup_factor(step, self.warmup_steps)
        return math.sqrt(self.warmup_steps / step)

    def key_steps(self) -> dict[int, str]:
        return {self.warmup_steps: "warm-up done"}


_DECAYS: dict[str, Callable[[float], float]] = {
    "cosine": half_cosine,
    "linear": lambda p: 1.0 - p,
    "1-sqrt": lambda p: 1.0 - math.sqrt(p),
}


@_public
@attrs.frozen(kw_only=True, repr=False)
class WSDSchedule(Schedule):
    """Warm-up, stable at 1, then decay to min_ratio (warmup-stable-decay).

    Attributes:
        warmup_steps: W.
        stable_steps: S, steps held at 1 after the warm-up.
        decay_steps: D, steps of decay after the stable phase.
        decay: the decay shape, ``"cosine"``, ``"linear"`` or ``"1-sqrt"``.
        min_ratio: the final multiplier.
    """

    name: ClassVar[str] = "wsd"
    formula: ClassVar[str] = """
        s < W:          (s + 1) / W
        s < W + S:      1
        s >= W + S:     min_ratio + (1 - min_ratio) * f(p)
                        p = min(1, (s - W - S) / max(1, D))
        f = cosine: (1 + cos(pi * p)) / 2 | linear: 1 - p | 1-sqrt: 1 - sqrt(p)
        """

    warmup_steps: int = param(STEPS, help=_WARMUP_HELP)
    stable_steps: int = param(STEPS, help="S, steps held at 1 after warm-up")
    decay_steps: int = param(STEPS, help="D, decay length in steps")
    decay: str = attrs.field(
        default="cosine",
        metadata={"constraint": "cosine | linear | 1-sqrt", "help": "shape f of the decay"},
    )
    min_ratio: float = param(RATIO, 0.0, help="final multiplier")

    @decay.validator
    def _check_decay(self, _: attrs.Attribute[Any], value: Any) -> None:
        if value not in _DECAYS:
            hint = closest_name(str(value), _DECAYS)
            reason = f"must be one of {', '.join(_DECAYS)}"
            raise HyperparameterError("decay", value, reason, algorithm=self.name, suggestion=hint)

    def value_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return warmup_factor(step, self.warmup_steps)
        decay_start = self.warmup_steps + self.stable_steps
        if step < decay_start:
            return 1.0
        p = progress_of(step, decay_start, self.decay_steps)
        return blend_from(self.min_ratio, _DECAYS[self.decay](p))

    def key_steps(self) -> dict[int, str]:
        steps = {self.warmup_steps: "stable"} if self.warmup_steps else {}
        decay_start = self.warmup_steps + self.stable_steps
        return {**steps, decay_start: "decay", decay_start + self.decay_steps: "end"}


@_public
@attrs.frozen(kw_only=True, repr=False)
class OneCycleSchedule(Schedule):
    """The one-cycle policy with cosine annealing (torch's OneCycleLR, as a multiplier).

    The base lr is the peak (torch's ``max_lr``).

    Attributes:
        total_steps: T; the final value is reached at step T - 1.
        pct_start: fraction of the cycle spent rising to the peak.
        div_factor: the cycle starts at 1 / div_factor.
        final_div_factor: it ends at 1 / (div_factor * final_div_factor).
    """

    name: ClassVar[str] = "onecycle"
    formula: ClassVar[str] = """
        a = 1 / div_factor, z = a / final_div_factor, P = pct_start * T - 1
        s <= P: 1 + (a - 1) * (1 + cos(pi * s / P)) / 2    (rise from a to 1)
        s >  P: z + (1 - z) * (1 + cos(pi * q)) / 2        (fall from 1 to z)
                q = min(1, (s - P) / (T - 1 - P))
        """

    total_steps: int = param(POSITIVE_STEPS, help="T, length of the cycle in steps")
    pct_start: float = param(FRACTION, 0.3, help="fraction of the cycle spent rising")
    div_factor: float = param(AT_LEAST_ONE, 25.0, help="start at 1 / div_factor")
    final_div_factor: float = param(
        AT_LEAST_ONE, 1e4, help="end at 1 / (div_factor * final_div_factor)"
    )

    def value_at(self, step: int) -> float:
        start = 1.0 / self.div_factor
        peak_step = self.pct_start * self.total_steps - 1
        if step <= peak_step:
            return _anneal(start, 1.0, step / peak_step if peak_step > 0 else 1.0)
        q = min(1.0, (step - peak_step) / (self.total_steps - 1 - peak_step))
        return _anneal(1.0, start / self.final_div_factor, q)

    def key_steps(self) -> dict[int, str]:
        peak = math.floor(self.pct_start * self.total_steps - 1)
        steps = {peak: "peak"} if peak > 0 else {}
        return {**steps, self.total_steps - 1: "end"}


def _anneal(start: float, end: float, progress: float) -> float:
    """Cosine interpolation from ``start`` (progress 0) to ``end`` (progress 1)."""
    return end + (start - end) * half_cosine(progress)


def _schedules(value: Any) -> Any:
    """A list of schedules as a tuple (dicts are built by name in ``Registry.schedule``)."""
    return tuple(value) if isinstance(value, list) else value


@_public
@attrs.frozen(kw_only=True, repr=False)
class SequenceSchedule(Schedule):
    """Run schedules one after another, each restarted at its boundary.

    Attributes:
        schedules: the schedules (or dicts for ``optiplug.schedule(**d)``).
        boundaries: the global steps at which schedule 1, 2... start; one
            fewer than the schedules, strictly increasing, >= 1.
    """

    name: ClassVar[str] = "sequence"
    formula: ClassVar[str] = """
        i = number of boundaries <= s,  b_0 = 0
        schedules[i](s - b_i)
        """

    schedules: tuple[Schedule, ...] = attrs.field(
        converter=_schedules,
        metadata={"constraint": "non-empty list of schedules", "help": "schedules, in turn"},
    )
    boundaries: tuple[int, ...] = attrs.field(
        converter=_milestones,
        metadata={
            "constraint": "increasing integers >= 1, one fewer than schedules",
            "help": "steps where the next schedule starts",
        },
    )

    @schedules.validator
    def _check_schedules(self, _: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, tuple) or not value:
            raise invalid(self, "schedules", value, "must be a non-empty list of schedules")
        for index, item in enumerate(value):
            if not isinstance(item, Schedule):
                reason = "must be a Schedule or a dict for optiplug.schedule(**d)"
                raise invalid(self, f"schedules[{index}]", item, reason)

    @boundaries.validator
    def _check_boundaries(self, _: attrs.Attribute[Any], value: Any) -> None:
        _strictly_increasing(self, "boundaries", value, 1)
        if len(value) != len(self.schedules) - 1:
            reason = f"must have one fewer entry than schedules ({len(self.schedules)})"
            raise invalid(self, "boundaries", value, reason)

    def value_at(self, step: int) -> float:
        index = bisect.bisect_right(self.boundaries, step)
        start = self.boundaries[index - 1] if index else 0
        return self.schedules[index](step - start)

    def key_steps(self) -> dict[int, str]:
        found: dict[int, str] = {}
        starts = (0, *self.boundaries)
        ends = (*self.boundaries, None)
        for index, (start, end, child) in enumerate(zip(starts, ends, self.schedules, strict=True)):
            for step, label in child.key_steps().items():
                if end is None or start + step < end:
                    found[start + step] = f"{child.name}: {label}"
            if index:
                found[start] = f"start {child.name}"
        return found


BUILTIN_SCHEDULES: tuple[type[Schedule], ...] = (
    ConstantSchedule,
    LinearWarmupSchedule,
    CosineSchedule,
    LinearSchedule,
    StepSchedule,
    MultiStepSchedule,
    ExponentialSchedule,
    PolynomialSchedule,
    InverseSqrtSchedule,
    WSDSchedule,
    OneCycleSchedule,
    SequenceSchedule,
)
"""Every built-in schedule class, in the design's order."""

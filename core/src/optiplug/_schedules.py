"""Learning-rate schedules: pure, picklable functions of the optimizer step.

A schedule maps the optimizer step ``s`` (an int >= 0) to a **multiplier** of
each param group's base lr::

    applied lr = base_lr(group) * schedule(s) * lr_scale

Every schedule is a frozen, slotted attrs class: it has no mutable state,
pickles, compares by value, and round-trips through a plain dict
(``optiplug.schedule(**s.to_dict()) == s``). Parameters are validated at
construction. Past its end a schedule stays at its final value.

Warm-up convention: step ``s`` of a warm-up of ``W`` steps uses
``start + (1 - start) * (s + 1) / W``, so the first update never has lr 0
(Hugging Face uses ``s / W``; ours equals theirs shifted by one step).

This module does not import torch at import time; :meth:`Schedule.as_torch`
and :meth:`Schedule.apply` import it when called.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .errors import HyperparameterError, closest_name

if TYPE_CHECKING:
    import torch

    from ._specs import ScheduleSpec

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
    "Schedule",
    "SequenceSchedule",
    "StepSchedule",
    "WSDSchedule",
    "build_schedule",
]

_MISSING = "<missing>"


# ------------------------------------------------------------------ parameter kinds
def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    """A finite real number (not a bool)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


def _to_int(value: Any) -> Any:
    """Normalise integers (numpy ints too) to ``int``; leave the rest for the validator."""
    return int(value) if _is_int(value) else value


def _to_float(value: Any) -> Any:
    """Normalise real numbers to ``float``; leave the rest for the validator."""
    return float(value) if _is_real(value) else value


@attrs.frozen
class _Kind:
    """How one kind of schedule parameter is converted, checked and described."""

    converter: Callable[[Any], Any]
    test: Callable[[Any], bool]
    constraint: str


STEPS = _Kind(_to_int, lambda v: _is_int(v) and v >= 0, "an integer >= 0")
POSITIVE_STEPS = _Kind(_to_int, lambda v: _is_int(v) and v >= 1, "an integer >= 1")
RATIO = _Kind(_to_float, lambda v: _is_real(v) and 0.0 <= v <= 1.0, "a number in [0, 1]")
FRACTION = _Kind(_to_float, lambda v: _is_real(v) and 0.0 <= v < 1.0, "a number in [0, 1)")
GAMMA = _Kind(_to_float, lambda v: _is_real(v) and 0.0 < v <= 1.0, "a number in (0, 1]")
POSITIVE = _Kind(_to_float, lambda v: _is_real(v) and v > 0.0, "a finite number > 0")
AT_LEAST_ONE = _Kind(_to_float, lambda v: _is_real(v) and v >= 1.0, "a finite number >= 1")


def _schedule_name(instance: Any) -> str:
    return getattr(type(instance), "name", "") or type(instance).__name__


def _invalid(instance: Any, field: str, value: Any, reason: str) -> HyperparameterError:
    return HyperparameterError(field, value, reason, algorithm=_schedule_name(instance))


def _param(kind: _Kind, default: Any = attrs.NOTHING, *, help: str) -> Any:
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
            raise _invalid(instance, attribute.name, value, f"must be {kind.constraint}")

    return attrs.field(
        default=default,
        converter=kind.converter,
        validator=validate,
        metadata={"constraint": kind.constraint, "help": help},
    )


def _check_warmup(schedule: Any) -> None:
    """Refuse a warm-up longer than the whole schedule."""
    if schedule.warmup_steps > schedule.total_steps:
        raise _invalid(
            schedule,
            "warmup_steps",
            schedule.warmup_steps,
            f"must be <= total_steps ({schedule.total_steps})",
        )


# ------------------------------------------------------------------ shared formulas
def _warmup(step: int, warmup_steps: int, start_factor: float = 0.0) -> float:
    """Linear warm-up factor of step ``step < warmup_steps``; never 0 at step 0."""
    return start_factor + (1.0 - start_factor) * (step + 1) / warmup_steps


def _progress(step: int, start: int, length: int) -> float:
    """Fraction of a phase of ``length`` steps starting at ``start`` done, clamped to [0, 1]."""
    return min(1.0, max(0.0, (step - start) / max(1, length)))


def _half_cosine(progress: float) -> float:
    """1 at progress 0, 0 at progress 1, along half a cosine period."""
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _between(low: float, progress_factor: float) -> float:
    """``low + (1 - low) * factor``: rescale a 1 -> 0 factor to 1 -> ``low``."""
    return low + (1.0 - low) * progress_factor


# ------------------------------------------------------------------ base class
def _plain(value: Any) -> Any:
    """Turn a field value into plain data (nested schedules into dicts, tuples into lists)."""
    if isinstance(value, Schedule):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _format_rows(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


@attrs.frozen
class Schedule:
    """Base class of learning-rate schedules: ``schedule(step) -> multiplier``.

    Subclasses are frozen attrs classes declaring their parameters as fields,
    a ``name`` (what users type), a ``formula`` (shown by ``optiplug show``)
    and :meth:`value_at`. Everything else (validation of the step,
    :meth:`to_dict`, :meth:`as_torch`, :meth:`apply`, :meth:`describe`) is
    provided here. Third-party schedules subclass it and register through the
    ``optiplug_schedules`` hook.
    """

    name: ClassVar[str] = ""
    formula: ClassVar[str] = ""

    def __call__(self, step: int) -> float:
        """Return the lr multiplier at optimizer step ``step``.

        Args:
            step: the optimizer step, an integer >= 0 (the first update is step 0).

        Returns:
            A finite float >= 0 for the built-in schedules.

        Raises:
            HyperparameterError: ``step`` is not an integer >= 0.
        """
        if not _is_int(step) or step < 0:
            raise _invalid(self, "step", step, "must be an integer >= 0")
        return float(self.value_at(int(step)))

    def value_at(self, step: int) -> float:
        """Compute the multiplier at a validated ``step``; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement value_at()")

    def key_steps(self) -> dict[int, str]:
        """Steps where a phase begins, labelled (for tables and plots); may be empty."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """Return the schedule as plain data, ``name`` included.

        Returns:
            A dict such that ``optiplug.schedule(**d) == self``; nested
            schedules become dicts and tuples become lists (JSON-friendly).
        """
        fields = {f.name: _plain(getattr(self, f.name)) for f in attrs.fields(type(self))}
        return {"name": self.name, **fields}

    def __repr__(self) -> str:
        values = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in attrs.fields(type(self)) if f.repr
        )
        return f"optiplug.schedule({self.name!r}{', ' if values else ''}{values})"

    @classmethod
    def describe(cls) -> str:
        """Return the formula and a table of the parameters (``optiplug show``)."""
        lines = ["formula (s = optimizer step, starting at 0):"]
        lines += ["  " + line for line in inspect.cleandoc(cls.formula or "-").splitlines()]
        lines += ["", "parameters:"]
        fields = attrs.fields(cls)
        if not fields:
            lines.append("  (none)")
        else:
            rows = [["name", "default", "constraint", "meaning"]]
            rows += [
                [
                    f.name,
                    "required" if f.default is attrs.NOTHING else repr(f.default),
                    f.metadata.get("constraint", "-"),
                    f.metadata.get("help", ""),
                ]
                for f in fields
            ]
            lines += _format_rows(rows)
        lines += ["", "Past its end the schedule stays at its final value."]
        return "\n".join(lines)

    def apply(
        self,
        optimizer: Any,
        step: int,
        base_lrs: Sequence[float] | None = None,
        scale: float = 1.0,
    ) -> list[float]:
        """Set each param group's lr to ``base * self(step) * scale``.

        A group whose lr is a tensor is updated in place (``lr.fill_``), so a
        ``torch.compile``-d step that reads it does not recompile.

        Args:
            optimizer: a ``torch.optim.Optimizer`` (anything with ``param_groups``).
            step: the optimizer step (int >= 0).
            base_lrs: one base lr per group; None uses each group's
                ``initial_lr``, recording the current lr there on first use
                (as torch's schedulers do).
            scale: a further factor, e.g. linear scaling with the world size.

        Returns:
            The lr set on each group, as floats.

        Raises:
            HyperparameterError: a bad step, a negative or non-finite scale,
                or a ``base_lrs`` of the wrong length.
        """
        if not _is_real(scale) or scale < 0:
            raise _invalid(self, "scale", scale, "must be a finite number >= 0")
        factor = self(step) * float(scale)
        groups = optimizer.param_groups
        bases = _initial_lrs(groups) if base_lrs is None else list(base_lrs)
        if len(bases) != len(groups):
            raise _invalid(
                self, "base_lrs", base_lrs, f"must have one lr per group ({len(groups)})"
            )
        values = [float(base) * factor for base in bases]
        for group, value in zip(groups, values, strict=True):
            _set_lr(group, value)
        return values

    def as_torch(self, optimizer: torch.optim.Optimizer, last_epoch: int = -1) -> Any:
        """Wrap this schedule as a ``torch.optim.lr_scheduler.LRScheduler``.

        The result works wherever a torch scheduler does (plain loops,
        Lightning, HF ``Trainer(optimizers=(opt, sched))``); its
        ``state_dict()`` holds only plain data and it pickles.

        Args:
            optimizer: the optimizer whose groups' lrs it drives; each group's
                base lr is its ``initial_lr`` if present, else its lr now.
            last_epoch: torch's resume index; -1 starts at step 0.

        Returns:
            A :class:`ScheduleLR` (an ``LRScheduler`` subclass).
        """
        return _schedule_lr_class()(optimizer, self, last_epoch=last_epoch)


def _initial_lrs(groups: Sequence[dict[str, Any]]) -> list[Any]:
    """Each group's ``initial_lr``, set from its current lr when missing (torch's convention)."""
    for group in groups:
        if "initial_lr" not in group:
            lr = group["lr"]
            group["initial_lr"] = lr.clone() if hasattr(lr, "clone") else lr
    return [group["initial_lr"] for group in groups]


def _set_lr(group: dict[str, Any], value: float) -> None:
    import torch

    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        lr.fill_(value)
    else:
        group["lr"] = value


# ------------------------------------------------------------------ torch adapter
def _schedule_lr_class() -> type:
    """Build (once) the ``LRScheduler`` subclass; deferred so import stays torch-free."""
    cached = globals().get("ScheduleLR")
    if cached is not None:
        return cached
    from torch.optim.lr_scheduler import LRScheduler

    class ScheduleLR(LRScheduler):
        """A torch ``LRScheduler`` driven by an optiplug :class:`Schedule`.

        ``lr = base_lr * schedule(last_epoch)``. Its state dict holds only
        plain data (the schedule is construction configuration, like
        ``LambdaLR``'s function); :meth:`load_state_dict` also re-applies the
        restored step's lrs to the optimizer, so load order does not matter.
        """

        def __init__(self, optimizer: Any, schedule: Schedule, last_epoch: int = -1) -> None:
            if not callable(schedule):
                raise TypeError(f"schedule must be callable, got {type(schedule).__name__}")
            self.schedule = schedule
            _initial_lrs(optimizer.param_groups)
            super().__init__(optimizer, last_epoch)

        def get_lr(self) -> list[Any]:
            factor = self.schedule(self.last_epoch)
            return [base * factor for base in self.base_lrs]

        _get_closed_form_lr = get_lr

        def state_dict(self) -> dict[str, Any]:
            skip = ("optimizer", "schedule")
            return {key: value for key, value in self.__dict__.items() if key not in skip}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.__dict__.update({k: v for k, v in state_dict.items() if k != "schedule"})
            groups = self.optimizer.param_groups
            for group, lr in zip(groups, self.get_lr(), strict=True):
                _set_lr(group, float(lr))

    ScheduleLR.__module__ = __name__
    ScheduleLR.__qualname__ = "ScheduleLR"
    globals()["ScheduleLR"] = ScheduleLR
    return ScheduleLR


def __getattr__(name: str) -> Any:
    """Create ``ScheduleLR`` on first access (pickle finds it by name)."""
    if name == "ScheduleLR":
        return _schedule_lr_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------ built-ins
_schedule_class = attrs.frozen(kw_only=True, repr=False)
_WARMUP_HELP = "linear warm-up steps; step s < W uses (s + 1) / W"


@_schedule_class
class ConstantSchedule(Schedule):
    """Constant multiplier 1: the base lr throughout."""

    name: ClassVar[str] = "constant"
    formula: ClassVar[str] = "1"

    def value_at(self, step: int) -> float:
        return 1.0


@_schedule_class
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

    warmup_steps: int = _param(STEPS, help="W, warm-up length in steps")
    start_factor: float = _param(RATIO, 0.0, help="factor the ramp starts from")

    def value_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup(step, self.warmup_steps, self.start_factor)
        return 1.0

    def key_steps(self) -> dict[int, str]:
        return {self.warmup_steps: "warm-up done"} if self.warmup_steps else {}


@_schedule_class
class _WarmupThenDecay(Schedule):
    """Linear warm-up to 1 over ``warmup_steps``, then a decay reaching ``_final()`` at ``total_steps``.

    Subclasses declare ``total_steps`` and ``warmup_steps`` and give the
    decay's shape (``_decay(p)``, from 1 at p=0 to 0 at p=1) and its final
    multiplier (``_final()``).
    """

    def __attrs_post_init__(self) -> None:
        _check_warmup(self)

    def _final(self) -> float:
        raise NotImplementedError

    def _decay(self, progress: float) -> float:
        raise NotImplementedError

    def value_at(self, step: int) -> float:
        warmup, total = self.warmup_steps, self.total_steps  # type: ignore[attr-defined]
        if step < warmup:
            return _warmup(step, warmup)
        return _between(self._final(), self._decay(_progress(step, warmup, total - warmup)))

    def key_steps(self) -> dict[int, str]:
        return _warmup_and_end(self.warmup_steps, self.total_steps)  # type: ignore[attr-defined]


def _warmup_and_end(warmup_steps: int, total_steps: int) -> dict[int, str]:
    steps = {warmup_steps: "warm-up done"} if warmup_steps else {}
    return {**steps, total_steps: "end"}


@_schedule_class
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

    total_steps: int = _param(POSITIVE_STEPS, help="T, step at which min_ratio is reached")
    warmup_steps: int = _param(STEPS, 0, help=_WARMUP_HELP)
    min_ratio: float = _param(RATIO, 0.0, help="final multiplier")

    def _final(self) -> float:
        return self.min_ratio

    def _decay(self, progress: float) -> float:
        return _half_cosine(progress)


@_schedule_class
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

    total_steps: int = _param(POSITIVE_STEPS, help="T, step at which min_ratio is reached")
    warmup_steps: int = _param(STEPS, 0, help=_WARMUP_HELP)
    min_ratio: float = _param(RATIO, 0.0, help="final multiplier")

    def _final(self) -> float:
        return self.min_ratio

    def _decay(self, progress: float) -> float:
        return 1.0 - progress


@_schedule_class
class StepSchedule(Schedule):
    """Multiply by gamma every step_size steps (torch's StepLR).

    Attributes:
        step_size: steps between decays.
        gamma: the decay factor.
    """

    name: ClassVar[str] = "step"
    formula: ClassVar[str] = "gamma ** floor(s / step_size)"

    step_size: int = _param(POSITIVE_STEPS, help="steps between decays")
    gamma: float = _param(GAMMA, 0.1, help="decay factor")

    def value_at(self, step: int) -> float:
        return self.gamma ** (step // self.step_size)

    def key_steps(self) -> dict[int, str]:
        return {self.step_size: "first decay"}


def _milestones(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_to_int(item) for item in value)
    return value


def _strictly_increasing(instance: Any, field: str, values: Any, minimum: int) -> None:
    """Check ``values`` is a sequence of integers >= minimum, strictly increasing."""
    if not isinstance(values, tuple) or not all(_is_int(v) for v in values):
        raise _invalid(instance, field, values, "must be a list of integers")
    if values and values[0] < minimum:
        raise _invalid(instance, field, values, f"must all be >= {minimum}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise _invalid(instance, field, values, "must be strictly increasing")


@_schedule_class
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
    gamma: float = _param(GAMMA, 0.1, help="decay factor")

    @milestones.validator
    def _check_milestones(self, _: attrs.Attribute[Any], value: Any) -> None:
        _strictly_increasing(self, "milestones", value, 0)

    def value_at(self, step: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, step)

    def key_steps(self) -> dict[int, str]:
        return {m: f"decay {i + 1}" for i, m in enumerate(self.milestones)}


@_schedule_class
class ExponentialSchedule(Schedule):
    """Multiply by gamma every step (torch's ExponentialLR).

    Attributes:
        gamma: the per-step decay factor.
    """

    name: ClassVar[str] = "exponential"
    formula: ClassVar[str] = "gamma ** s"

    gamma: float = _param(GAMMA, help="per-step decay factor")

    def value_at(self, step: int) -> float:
        return self.gamma**step


@_schedule_class
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

    total_steps: int = _param(POSITIVE_STEPS, help="T, step at which end_ratio is reached")
    power: float = _param(POSITIVE, 1.0, help="exponent of the decay")
    end_ratio: float = _param(RATIO, 0.0, help="final multiplier")
    warmup_steps: int = _param(STEPS, 0, help=_WARMUP_HELP)

    def _final(self) -> float:
        return self.end_ratio

    def _decay(self, progress: float) -> float:
        return (1.0 - progress) ** self.power


@_schedule_class
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

    warmup_steps: int = _param(POSITIVE_STEPS, help=_WARMUP_HELP)

    def value_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup(step, self.warmup_steps)
        return math.sqrt(self.warmup_steps / step)

    def key_steps(self) -> dict[int, str]:
        return {self.warmup_steps: "warm-up done"}


_DECAYS: dict[str, Callable[[float], float]] = {
    "cosine": _half_cosine,
    "linear": lambda p: 1.0 - p,
    "1-sqrt": lambda p: 1.0 - math.sqrt(p),
}


@_schedule_class
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

    warmup_steps: int = _param(STEPS, help=_WARMUP_HELP)
    stable_steps: int = _param(STEPS, help="S, steps held at 1 after warm-up")
    decay_steps: int = _param(STEPS, help="D, decay length in steps")
    decay: str = attrs.field(
        default="cosine",
        metadata={"constraint": "cosine | linear | 1-sqrt", "help": "shape f of the decay"},
    )
    min_ratio: float = _param(RATIO, 0.0, help="final multiplier")

    @decay.validator
    def _check_decay(self, _: attrs.Attribute[Any], value: Any) -> None:
        if value not in _DECAYS:
            hint = closest_name(str(value), _DECAYS)
            reason = f"must be one of {', '.join(_DECAYS)}"
            raise HyperparameterError("decay", value, reason, algorithm=self.name, suggestion=hint)

    def value_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup(step, self.warmup_steps)
        decay_start = self.warmup_steps + self.stable_steps
        if step < decay_start:
            return 1.0
        p = _progress(step, decay_start, self.decay_steps)
        return _between(self.min_ratio, _DECAYS[self.decay](p))

    def key_steps(self) -> dict[int, str]:
        steps = {self.warmup_steps: "stable"} if self.warmup_steps else {}
        decay_start = self.warmup_steps + self.stable_steps
        return {**steps, decay_start: "decay", decay_start + self.decay_steps: "end"}


@_schedule_class
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

    total_steps: int = _param(POSITIVE_STEPS, help="T, length of the cycle in steps")
    pct_start: float = _param(FRACTION, 0.3, help="fraction of the cycle spent rising")
    div_factor: float = _param(AT_LEAST_ONE, 25.0, help="start at 1 / div_factor")
    final_div_factor: float = _param(
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
    return end + (start - end) * _half_cosine(progress)


def _schedules(value: Any) -> Any:
    """Accept Schedule objects or dicts for ``optiplug.schedule(**d)``."""
    if not isinstance(value, (list, tuple)):
        return value
    from ._api import schedule

    return tuple(schedule(**item) if isinstance(item, Mapping) else item for item in value)


@_schedule_class
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
            raise _invalid(self, "schedules", value, "must be a non-empty list of schedules")
        for index, item in enumerate(value):
            if not isinstance(item, Schedule):
                reason = "must be a Schedule or a dict for optiplug.schedule(**d)"
                raise _invalid(self, f"schedules[{index}]", item, reason)

    @boundaries.validator
    def _check_boundaries(self, _: attrs.Attribute[Any], value: Any) -> None:
        _strictly_increasing(self, "boundaries", value, 1)
        if len(value) != len(self.schedules) - 1:
            reason = f"must have one fewer entry than schedules ({len(self.schedules)})"
            raise _invalid(self, "boundaries", value, reason)

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
        accepted = ", ".join(sorted(known)) or "(none)"
        raise HyperparameterError(
            keyword,
            "<unknown keyword>",
            f"not a parameter of schedule {name}; accepted: {accepted}",
            algorithm=name,
            suggestion=closest_name(keyword, known),
        )
    for parameter in parameters:
        if parameter.default is inspect.Parameter.empty and parameter.name not in given:
            raise HyperparameterError(parameter.name, _MISSING, "is required", algorithm=name)


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

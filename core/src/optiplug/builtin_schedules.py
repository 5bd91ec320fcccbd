"""The built-in schedule classes, one per name ``optiplug.schedule`` accepts.

Build them by name (``optiplug.schedule("cosine", total_steps=1000)``); this
module is their public home, so pickles and ``isinstance`` checks name a path
that stays stable. ``ScheduleLR`` (what :meth:`optiplug.Schedule.as_torch`
returns) is created on first access, since it imports torch.
"""

from __future__ import annotations

from typing import Any

from ._schedules.shapes import (
    BUILTIN_SCHEDULES,
    ConstantSchedule,
    CosineSchedule,
    ExponentialSchedule,
    InverseSqrtSchedule,
    LinearSchedule,
    LinearWarmupSchedule,
    MultiStepSchedule,
    OneCycleSchedule,
    PolynomialSchedule,
    SequenceSchedule,
    StepSchedule,
    WSDSchedule,
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


def __getattr__(name: str) -> Any:
    if name == "ScheduleLR":
        from ._schedules.torch_adapter import ScheduleLR  # deferred: imports torch

        return ScheduleLR
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

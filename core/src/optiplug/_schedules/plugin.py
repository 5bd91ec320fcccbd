"""The core's built-in schedules plugin: registers every built-in schedule.

It answers the same ``optiplug_schedules`` hook a third-party plugin does, so
the built-ins are listed, shown and looked up like anyone's (distribution
``optiplug``). Importing it does not import torch.
"""

from __future__ import annotations

import inspect

from .._core.hooks import PLUGIN_API_VERSION, hookimpl
from .._core.specs import ScheduleSpec
from .base import Schedule
from .shapes import BUILTIN_SCHEDULES

__all__ = ["OPTIPLUG_API", "optiplug_schedules"]

OPTIPLUG_API = PLUGIN_API_VERSION


def _spec(schedule: type[Schedule]) -> ScheduleSpec:
    doc = inspect.getdoc(schedule) or ""
    summary = doc.split("\n\n", 1)[0].replace("\n", " ")
    return ScheduleSpec(name=schedule.name, factory=schedule, description=summary)


@hookimpl
def optiplug_schedules() -> list[ScheduleSpec]:
    """Provide the built-in schedules (``cosine``, ``wsd``, ``onecycle``...)."""
    return [_spec(schedule) for schedule in BUILTIN_SCHEDULES]

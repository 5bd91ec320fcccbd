"""Learning-rate schedules: the :class:`~optiplug.Schedule` base and the built-in shapes.

The built-in classes are re-exported here because optiplug 0.1.0 pickled them
under this path (``optiplug._schedules.CosineSchedule``); new pickles name
:mod:`optiplug.builtin_schedules`.
"""

from __future__ import annotations

from .base import Schedule
from .shapes import *  # noqa: F403 - the 0.1.0 pickle path of every built-in class
from .shapes import __all__ as _shapes

__all__ = ["Schedule", *_shapes]

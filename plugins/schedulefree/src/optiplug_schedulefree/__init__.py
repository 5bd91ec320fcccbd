"""optiplug-schedulefree: the schedule-free optimizers (AdamW, SGD, RAdam) for optiplug.

Every optimizer class ``schedulefree`` exports is registered under the
``schedulefree`` plugin (``optiplug.create("schedulefree:adamw_schedulefree",
...)``) with a validated hyperparameter schema, its state slots, its
running group state (``k``, ``weight_sum``...), the train/eval lifecycle
and its origin. Importing this package imports neither torch nor
schedulefree; the wrapped classes live in :mod:`optiplug_schedulefree.optimizers`.
"""

from __future__ import annotations

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION, PAPER

__all__ = ["CATALOG", "LIBRARY", "LIBRARY_VERSION", "PAPER"]

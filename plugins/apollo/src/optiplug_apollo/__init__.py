"""optiplug-apollo: APOLLO's optimizer (``APOLLOAdamW``) for optiplug.

Registered under the ``apollo`` plugin (``optiplug.create("apollo:apollo_adamw",
groups, ...)``) with a validated hyperparameter schema, its state slots (the
projector stored as plain slots, so checkpoints round-trip) and its origin;
a param group carrying ``rank``, ``proj``, ``scale_type``, ``update_proj_gap``,
``scale`` and ``proj_type`` is projected. Importing this package imports
neither torch nor apollo_torch; the wrapped class lives in
:mod:`optiplug_apollo.optimizers`.
"""

from __future__ import annotations

from .catalog import LIBRARY, LIBRARY_VERSION, NAME, PAPER

__all__ = ["LIBRARY", "LIBRARY_VERSION", "NAME", "PAPER"]

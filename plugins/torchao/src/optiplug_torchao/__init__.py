"""optiplug-torchao: torchao's low-bit optimizers (8-bit, 4-bit, FP8 AdamW/Adam) for optiplug.

Every optimizer class ``torchao.optim`` exports is registered under the
``torchao`` plugin (``optiplug.create("torchao:adamw8bit", ...)``) with a
validated hyperparameter schema, its state slots, and its origin. Importing
this package imports neither torch nor torchao; the wrapped classes live in
:mod:`optiplug_torchao.optimizers`.
"""

from __future__ import annotations

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION

__all__ = ["CATALOG", "LIBRARY", "LIBRARY_VERSION"]

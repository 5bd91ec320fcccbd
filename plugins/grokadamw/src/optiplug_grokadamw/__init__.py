"""optiplug-grokadamw: GrokAdamW for optiplug.

Registered under the ``grokadamw`` plugin (``optiplug.create("grokadamw:grokadamw",
...)``) with a validated hyperparameter schema, its state slots (kept in
``optimizer.state``, so checkpoints resume it) and its origin. Importing this
package imports neither torch nor grokadamw; the wrapped class lives in
:mod:`optiplug_grokadamw.optimizers`.
"""

from __future__ import annotations

from .catalog import LIBRARY, LIBRARY_VERSION, NAME

__all__ = ["LIBRARY", "LIBRARY_VERSION", "NAME"]

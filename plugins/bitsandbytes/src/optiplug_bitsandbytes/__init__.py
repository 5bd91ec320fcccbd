"""optiplug-bitsandbytes: bitsandbytes' 8-bit and 32-bit optimizers for optiplug.

Every optimizer class ``bitsandbytes.optim`` exports is registered under the
``bitsandbytes`` plugin (``optiplug.create("bitsandbytes:adamw8bit", ...)``)
with a validated hyperparameter schema, its state slots, and its origin.
Importing this package imports neither torch nor bitsandbytes; the wrapped
classes live in :mod:`optiplug_bitsandbytes.optimizers`.
"""

from __future__ import annotations

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION

__all__ = ["CATALOG", "LIBRARY", "LIBRARY_VERSION"]

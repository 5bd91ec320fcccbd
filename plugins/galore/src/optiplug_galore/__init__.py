"""optiplug-galore: GaLore's low-rank gradient projection optimizers for optiplug.

Every optimizer class ``galore_torch`` exports (``GaLoreAdamW``,
``GaLoreAdamW8bit``, ``GaLoreAdafactor``) is registered under the
``galore`` plugin (``optiplug.create("galore:galore_adamw", groups, ...)``)
with a validated hyperparameter schema, its state slots (the projector
stored as plain slots, so checkpoints round-trip) and its origin; a param
group carrying ``rank``, ``update_proj_gap``, ``scale`` and ``proj_type`` is
projected. Importing this package imports neither torch nor galore_torch;
the wrapped classes live in :mod:`optiplug_galore.optimizers`.
"""

from __future__ import annotations

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION, PAPER

__all__ = ["CATALOG", "LIBRARY", "LIBRARY_VERSION", "PAPER"]

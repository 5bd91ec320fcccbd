"""optiplug-pytorch-optimizer: every optimizer of pytorch-optimizer under optiplug's API.

Importing this package imports neither torch nor pytorch-optimizer; the
wrapper classes live in :mod:`optiplug_pytorch_optimizer.optimizers`.
"""

from __future__ import annotations

from .catalog import ENTRIES, LIBRARY, VERSION

__all__ = ["ENTRIES", "LIBRARY", "VERSION"]

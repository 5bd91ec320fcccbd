"""optiplug-adamw: Adam with decoupled weight decay, built on optiplug-adam.

This plugin depends on the ``optiplug-adam`` distribution: it reuses Adam's
validated hyperparameters and state layout and changes only the default
weight decay and the decay rule (``p <- p * (1 - lr * wd)`` before the Adam
step, as ``torch.optim.AdamW``). Importing this package does not import
torch: ``AdamW`` is imported on first access (:mod:`.optimizer`).
"""

from __future__ import annotations

from typing import Any

from .plugin import ADAMW_STATE, AdamWConfig

__all__ = ["ADAMW_STATE", "AdamW", "AdamWConfig"]


def __getattr__(name: str) -> Any:
    if name != "AdamW":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .optimizer import AdamW  # deferred: imports torch

    return AdamW

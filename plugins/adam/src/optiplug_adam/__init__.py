"""optiplug-adam: the Adam optimizer (with AMSGrad) for optiplug.

``Adam`` is ``torch.optim.Adam`` with validated hyperparameters and a measured
choice of implementation. Importing this package does not import torch:
``Adam`` is imported on first access (:mod:`.optimizer`).
"""

from __future__ import annotations

from typing import Any

from .plugin import ADAM_STATE, AdamConfig

__all__ = ["ADAM_STATE", "Adam", "AdamConfig"]


def __getattr__(name: str) -> Any:
    if name != "Adam":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .optimizer import Adam  # deferred: imports torch

    return Adam

"""optiplug-adam: the Adam optimizer (with AMSGrad) for optiplug.

``Adam`` is ``torch.optim.Adam`` with validated hyperparameters and a measured
choice of implementation. Importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

from .config import ADAM_STATE, AdamConfig

__all__ = ["ADAM_STATE", "Adam", "AdamConfig"]


def __getattr__(name: str) -> Any:
    if name == "Adam":
        from .optimizer import Adam

        return Adam
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Hyperparameters and state layout of AdamW: Adam's, with weight_decay=1e-2."""

from __future__ import annotations

import attrs

from optiplug.validators import hyperparameter, non_negative
from optiplug_adam.config import ADAM_STATE, AdamConfig

__all__ = ["ADAMW_STATE", "AdamWConfig"]


@attrs.frozen
class AdamWConfig(AdamConfig):
    """AdamW hyperparameters, as in ``torch.optim.AdamW`` (decoupled weight decay)."""

    weight_decay: float = hyperparameter(1e-2, non_negative, ">= 0 (decoupled: p *= 1 - lr*wd)")


ADAMW_STATE = ADAM_STATE

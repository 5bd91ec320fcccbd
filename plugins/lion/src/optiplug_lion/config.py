"""Hyperparameters and state layout of Lion (torch-free)."""

from __future__ import annotations

import attrs

from optiplug import StateSlot
from optiplug.validators import betas, boolean, hyperparameter, learning_rate, non_negative

__all__ = ["LION_STATE", "LionConfig"]


@attrs.frozen
class LionConfig:
    """Lion hyperparameters (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms").

    Attributes:
        lr: learning rate; a float or a 0-d tensor. Lion's sign update has
            unit magnitude per element, so lr is typically 3-10x smaller than
            AdamW's.
        betas: (beta1, beta2): beta1 interpolates the update direction,
            beta2 is the momentum decay.
        weight_decay: decoupled: ``p *= 1 - lr * weight_decay``.
        maximize: ascend instead of descend (the gradient is negated).
    """

    lr: float = hyperparameter(1e-4, learning_rate, "finite, >= 0")
    betas: tuple[float, float] = hyperparameter((0.9, 0.99), betas, "each in [0, 1)")
    weight_decay: float = hyperparameter(0.0, non_negative, ">= 0 (decoupled: p *= 1 - lr*wd)")
    maximize: bool = hyperparameter(False, boolean, "bool")


LION_STATE = (StateSlot("exp_avg", description="momentum (EMA of gradients, decay beta2)"),)
"""Lion keeps one slot per parameter, shared by every implementation."""

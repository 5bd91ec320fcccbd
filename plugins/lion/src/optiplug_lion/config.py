"""Hyperparameters and state layout of Lion (torch-free)."""

from __future__ import annotations

from typing import Any

import attrs

from optiplug import StateSlot
from optiplug.errors import HyperparameterError
from optiplug.validators import (
    betas,
    boolean,
    hyperparameter,
    learning_rate,
    non_negative,
    state_precision_field,
)

__all__ = ["LION_STATE", "WEIGHT_DECAY_MODES", "LionConfig"]

WEIGHT_DECAY_MODES = ("decoupled", "cautious")
"""``decoupled``: every coordinate decays; ``cautious``: only those where the update and
the parameter agree in sign (Chen et al. 2025, "Cautious Weight Decay", arXiv 2510.12402)."""


def _weight_decay_mode(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or value not in WEIGHT_DECAY_MODES:
        raise HyperparameterError(
            attribute.name, value, f"must be one of {', '.join(WEIGHT_DECAY_MODES)}"
        )


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
        weight_decay_mode: ``"decoupled"`` (every coordinate) or
            ``"cautious"``: ``p -= lr * wd * p * [u * p >= 0]``, decaying only
            the coordinates whose update ``u = sign(c)`` (``p -= lr * u``)
            already moves them towards zero (Chen et al. 2025, "Cautious
            Weight Decay", arXiv 2510.12402; a zero product counts as
            agreement).
    """

    lr: float = hyperparameter(1e-4, learning_rate, "finite, >= 0")
    betas: tuple[float, float] = hyperparameter((0.9, 0.99), betas, "each in [0, 1)")
    weight_decay: float = hyperparameter(0.0, non_negative, ">= 0 (decoupled: p *= 1 - lr*wd)")
    maximize: bool = hyperparameter(False, boolean, "bool")
    weight_decay_mode: str = hyperparameter(
        "decoupled", _weight_decay_mode, " | ".join(WEIGHT_DECAY_MODES)
    )
    state_precision: str = state_precision_field()


LION_STATE = (StateSlot("exp_avg", description="momentum (EMA of gradients, decay beta2)"),)
"""Lion keeps one slot per parameter, shared by every implementation."""

"""Entry-point module of optiplug-adamw: Adam's config with weight_decay=1e-2 (no torch import)."""

from __future__ import annotations

import attrs

import optiplug
from optiplug.validators import hyperparameter, non_negative
from optiplug_adam import ADAM_STATE, AdamConfig

__all__ = ["ADAMW_STATE", "AdamWConfig"]

OPTIPLUG_API = 1

_TARGET = "optiplug_adamw:AdamW"


@attrs.frozen
class AdamWConfig(AdamConfig):
    """AdamW hyperparameters, as in ``torch.optim.AdamW`` (decoupled weight decay)."""

    weight_decay: float = hyperparameter(1e-2, non_negative, ">= 0 (decoupled: p *= 1 - lr*wd)")


ADAMW_STATE = ADAM_STATE


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``adamw``."""
    return [
        optiplug.OptimizerSpec(
            name="adamw",
            factory=optiplug.lazy(_TARGET),
            config=AdamWConfig,
            description=(
                "Adam with decoupled weight decay (p <- p*(1 - lr*wd), then Adam); same math "
                "and state names as torch.optim.AdamW."
            ),
            state_slots=ADAMW_STATE,
            implementations=optiplug.torch_implementations("adamw", _TARGET),
        )
    ]

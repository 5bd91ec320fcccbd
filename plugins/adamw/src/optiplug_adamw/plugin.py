"""Entry-point module of optiplug-adamw: hookimpls only, no torch import."""

from __future__ import annotations

import optiplug

from .config import ADAMW_STATE, AdamWConfig

OPTIPLUG_API = 1

_TARGET = "optiplug_adamw.optimizer:AdamW"


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

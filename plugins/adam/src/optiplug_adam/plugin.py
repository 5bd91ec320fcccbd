"""Entry-point module of optiplug-adam: hookimpls only, no torch import."""

from __future__ import annotations

import optiplug

from .config import ADAM_STATE, AdamConfig

OPTIPLUG_API = 1

_TARGET = "optiplug_adam.optimizer:Adam"


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``adam``."""
    return [
        optiplug.OptimizerSpec(
            name="adam",
            factory=optiplug.lazy(_TARGET),
            config=AdamConfig,
            description=(
                "Adam with optional AMSGrad and L2 weight decay; same math and state names "
                "as torch.optim.Adam."
            ),
            state_slots=ADAM_STATE,
            implementations=optiplug.torch_implementations("adam", _TARGET),
        )
    ]

"""Entry-point module of optiplug-lion: hookimpls only, no torch import."""

from __future__ import annotations

import optiplug

from .config import LION_STATE, LionConfig
from .implementations import lion_implementations

OPTIPLUG_API = 1


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``lion``."""
    return [
        optiplug.OptimizerSpec(
            name="lion",
            factory=optiplug.lazy("optiplug_lion.optimizer:Lion"),
            config=LionConfig,
            description=(
                "Lion (EvoLved Sign Momentum): p -= lr*sign(beta1*m + (1-beta1)*g), "
                "m = beta2*m + (1-beta2)*g, with decoupled weight decay."
            ),
            state_slots=LION_STATE,
            implementations=lion_implementations(),
        )
    ]

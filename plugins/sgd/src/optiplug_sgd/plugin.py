"""Entry-point module of optiplug-sgd: hookimpls only, no torch import."""

from __future__ import annotations

import optiplug

from .config import SGD_STATE, SGDConfig

OPTIPLUG_API = 1

_TARGET = "optiplug_sgd.optimizer:SGD"


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``sgd``."""
    return [
        optiplug.OptimizerSpec(
            name="sgd",
            factory=optiplug.lazy(_TARGET),
            config=SGDConfig,
            description=(
                "Stochastic gradient descent with momentum, dampening, Nesterov and weight "
                "decay; same math and state names as torch.optim.SGD."
            ),
            state_slots=SGD_STATE,
            implementations=optiplug.torch_implementations("sgd", _TARGET),
        )
    ]

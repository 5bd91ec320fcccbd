"""Entry-point module of optiplug-adam: Adam's config, state layout and record (no torch import).

The config and state layout are shared with optiplug-adamw.
"""

from __future__ import annotations

import attrs

import optiplug
from optiplug import StateSlot
from optiplug.validators import (
    betas,
    boolean,
    hyperparameter,
    learning_rate,
    non_negative,
    positive,
    state_precision_field,
)

__all__ = ["ADAM_STATE", "AdamConfig"]

OPTIPLUG_API = 1

_TARGET = "optiplug_adam:Adam"


@attrs.frozen
class AdamConfig:
    """Adam hyperparameters, as in ``torch.optim.Adam``."""

    lr: float = hyperparameter(1e-3, learning_rate, "finite, >= 0")
    betas: tuple[float, float] = hyperparameter((0.9, 0.999), betas, "each in [0, 1)")
    eps: float = hyperparameter(1e-8, positive, "> 0")
    weight_decay: float = hyperparameter(0.0, non_negative, ">= 0")
    amsgrad: bool = hyperparameter(False, boolean, "bool")
    maximize: bool = hyperparameter(False, boolean, "bool")
    state_precision: str = state_precision_field()


ADAM_STATE = (
    StateSlot(
        "step",
        shape="scalar",
        dtype="float32",
        constraints=("finite", "non_negative", "integral"),
        description="number of steps taken",
    ),
    StateSlot("exp_avg", description="first moment (EMA of gradients)"),
    StateSlot(
        "exp_avg_sq",
        constraints=("finite", "non_negative"),
        description="second moment (EMA of squared gradients)",
    ),
    StateSlot(
        "max_exp_avg_sq",
        when="amsgrad",
        constraints=("finite", "non_negative"),
        description="running maximum of the second moment (AMSGrad)",
    ),
)


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
            capabilities={"elementwise"},
        )
    ]

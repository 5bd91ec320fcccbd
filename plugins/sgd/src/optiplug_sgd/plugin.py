"""Entry-point module of optiplug-sgd: SGD's config, state layout and record (no torch import)."""

from __future__ import annotations

import attrs

import optiplug
from optiplug import StateSlot
from optiplug.errors import HyperparameterError
from optiplug.validators import (
    boolean,
    hyperparameter,
    learning_rate,
    non_negative,
    state_precision_field,
    unit_interval,
)

__all__ = ["SGD_STATE", "SGDConfig"]

OPTIPLUG_API = 1

_TARGET = "optiplug_sgd:SGD"


@attrs.frozen
class SGDConfig:
    """SGD hyperparameters, as in ``torch.optim.SGD``.

    Raises:
        HyperparameterError: a value outside its constraint, or ``nesterov``
            without ``momentum > 0`` and ``dampening == 0``.
    """

    lr: float = hyperparameter(1e-3, learning_rate, "finite, >= 0")
    momentum: float = hyperparameter(0.0, unit_interval, "in [0, 1)")
    dampening: float = hyperparameter(0.0, non_negative, ">= 0")
    weight_decay: float = hyperparameter(0.0, non_negative, ">= 0")
    nesterov: bool = hyperparameter(False, boolean, "bool; needs momentum > 0 and dampening = 0")
    maximize: bool = hyperparameter(False, boolean, "bool")
    state_precision: str = state_precision_field()

    def __attrs_post_init__(self) -> None:
        if self.nesterov and (float(self.momentum) <= 0 or float(self.dampening) != 0):
            reason = (
                f"Nesterov momentum needs momentum > 0 and dampening = 0 "
                f"(got momentum={self.momentum}, dampening={self.dampening})"
            )
            raise HyperparameterError("nesterov", self.nesterov, reason)


SGD_STATE = (
    StateSlot(
        "momentum_buffer",
        when="momentum",
        description="velocity buffer, present when momentum != 0",
    ),
)


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
            hf_names=("sgd",),
            capabilities={"elementwise"},
        )
    ]

"""Entry-point module of optiplug-adamw: Adam's config with weight_decay=1e-2 (no torch import)."""

from __future__ import annotations

from typing import Any

import attrs

import optiplug
from optiplug.errors import HyperparameterError
from optiplug.validators import hyperparameter, non_negative
from optiplug_adam import ADAM_STATE, AdamConfig

__all__ = ["ADAMW_STATE", "AdamWConfig"]

OPTIPLUG_API = 1

_TARGET = "optiplug_adamw:AdamW"


WEIGHT_DECAY_MODES = ("decoupled", "cautious")
"""``decoupled``: ``p *= 1 - lr*wd`` everywhere (torch's AdamW); ``cautious``: only where the
Adam update and the parameter agree in sign (Chen et al. 2025, arXiv 2510.12402)."""


def _weight_decay_mode(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or value not in WEIGHT_DECAY_MODES:
        raise HyperparameterError(
            attribute.name, value, f"must be one of {', '.join(WEIGHT_DECAY_MODES)}"
        )


@attrs.frozen
class AdamWConfig(AdamConfig):
    """AdamW hyperparameters, as in ``torch.optim.AdamW`` (decoupled weight decay).

    ``weight_decay_mode="cautious"`` decays only the coordinates whose Adam
    update agrees in sign with the parameter (Chen et al. 2025, "Cautious
    Weight Decay", arXiv 2510.12402); it costs a copy of the parameters
    during each step. ``"decoupled"`` (the default) is torch's AdamW exactly.
    """

    weight_decay: float = hyperparameter(1e-2, non_negative, ">= 0 (decoupled: p *= 1 - lr*wd)")
    weight_decay_mode: str = hyperparameter(
        "decoupled", _weight_decay_mode, " | ".join(WEIGHT_DECAY_MODES)
    )


ADAMW_STATE = ADAM_STATE

_STATE_32, _UNPAGED = optiplug.HFName.STATE_32, optiplug.HFName.UNPAGED

HF_NAMES = (
    optiplug.HFName("adamw_torch"),
    optiplug.HFName("adamw_torch_fused", impl="fused"),
    optiplug.HFName("paged_adamw_32bit", caveat=_UNPAGED),
    # torchdistx's AnyPrecisionAdamW: with its default float32 moments, AdamW exactly
    # (optim_args are read by optiplug_integrations.transformers)
    optiplug.HFName("adamw_anyprecision"),
    # fallbacks for the 8-bit names, below a plugin with 8-bit state
    optiplug.HFName("adamw_bnb_8bit", caveat=_STATE_32, priority=-1),
    optiplug.HFName("adamw_8bit", caveat=_STATE_32, priority=-1),
    optiplug.HFName("paged_adamw_8bit", caveat=f"{_STATE_32}; {_UNPAGED}", priority=-1),
)
"""The ``TrainingArguments(optim=...)`` names ``adamw`` serves."""


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
            hf_names=HF_NAMES,
            capabilities={"elementwise"},
        )
    ]

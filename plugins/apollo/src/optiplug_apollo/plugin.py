"""Entry-point module of optiplug-apollo: records only, no torch or apollo_torch import."""

from __future__ import annotations

import optiplug

from .catalog import CLASS, LIBRARY, LIBRARY_VERSION, NAME, PAPER, STATE
from .config import APOLLOAdamWConfig

OPTIPLUG_API = 1

DESCRIPTION = (
    "APOLLO AdamW: AdamW's moments of a low-rank (random or SVD) projection of each "
    "matrix's gradient set a per-channel or per-tensor scaling of the full-rank gradient, "
    "with Fira's norm-growth limiter. Projected where a param group carries rank, proj, "
    "scale_type, update_proj_gap, scale and proj_type (matrices only); other groups step "
    "as AdamW."
)

HF_PRIORITY = 10
"""Above any other route of ``apollo_adamw``: this is the class transformers builds."""

HF_NAME = optiplug.HFName(NAME, priority=HF_PRIORITY, adam_arguments=True, target_modules=True)
"""transformers builds ``apollo_adamw`` over ``optim_target_modules`` with only
``learning_rate`` in the constructor and the Trainer's betas and eps in the target group."""


def spec() -> optiplug.OptimizerSpec:
    """The registry record of ``apollo_adamw``, bridged (with an :class:`optiplug.Origin`)."""
    return optiplug.OptimizerSpec(
        name=NAME,
        factory=optiplug.lazy(f"optiplug_apollo.optimizers:{CLASS}"),
        config=APOLLOAdamWConfig,
        description=DESCRIPTION,
        state_slots=STATE,
        origin=optiplug.Origin(
            library=LIBRARY,
            version=LIBRARY_VERSION,
            target=f"apollo_torch:{CLASS}",
            paper=PAPER,
        ),
        hf_names=(HF_NAME,),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide APOLLO's AdamW (nothing without apollo_torch)."""
    optiplug.errors.PluginUnavailable.unless_installed("apollo_torch", provides=[NAME])
    return [spec()]

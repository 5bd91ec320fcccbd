"""Entry-point module of optiplug-grokadamw: records only, no torch or grokadamw import."""

from __future__ import annotations

import optiplug

from .catalog import CLASS, LIBRARY, LIBRARY_VERSION, NAME, STATE
from .config import GrokAdamWConfig

OPTIPLUG_API = 1

DESCRIPTION = (
    "GrokAdamW: AdamW on the gradient plus lamb times a gradient EMA whose decay a grokking "
    "signal lowers, with a per-layer first-moment decay beta1 * (1 - gamma) ** i and "
    "per-parameter gradient clipping."
)

HF_NAME = optiplug.HFName(NAME, adam_arguments=False, decay_groups=True)
"""transformers builds ``grokadamw`` with ``learning_rate``, the Trainer's two weight-decay
groups and the five GrokAdamW keys of ``optim_args``; not the Trainer's betas and eps."""


def spec() -> optiplug.OptimizerSpec:
    """The registry record of ``grokadamw``, bridged (with an :class:`optiplug.Origin`)."""
    return optiplug.OptimizerSpec(
        name=NAME,
        factory=optiplug.lazy(f"optiplug_grokadamw.optimizers:{CLASS}"),
        config=GrokAdamWConfig,
        description=DESCRIPTION,
        state_slots=STATE,
        origin=optiplug.Origin(
            library=LIBRARY, version=LIBRARY_VERSION, target=f"grokadamw:{CLASS}"
        ),
        hf_names=(HF_NAME,),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide GrokAdamW (nothing without grokadamw)."""
    optiplug.errors.PluginUnavailable.unless_installed("grokadamw", provides=[NAME])
    return [spec()]

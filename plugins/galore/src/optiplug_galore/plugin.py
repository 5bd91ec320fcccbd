"""Entry-point module of optiplug-galore: records only, no torch or galore_torch import."""

from __future__ import annotations

import optiplug

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION, PAPER, Entry
from .config import CONFIGS

OPTIPLUG_API = 1

_MODULE = "optiplug_galore.optimizers"

HF_PRIORITY = 10
"""Above pytorch_optimizer's GaLore route for ``galore_adamw`` (priority 0, no projection),
which stays a fallback: this is the class transformers itself builds."""


def hf_names(item: Entry) -> tuple[optiplug.HFName, ...]:
    """The ``TrainingArguments(optim=...)`` name an entry serves: its own, with target modules.

    transformers gives these names only ``learning_rate`` (the Trainer's betas,
    eps and weight decay are not passed: the class defaults hold) and builds
    the two param groups of ``optim_target_modules`` (see
    :attr:`optiplug.HFName.target_modules`).
    """
    return (
        optiplug.HFName(item.name, priority=HF_PRIORITY, adam_arguments=False, target_modules=True),
    )


def spec_of(item: Entry) -> optiplug.OptimizerSpec:
    """The registry record of one catalogue entry.

    Args:
        item: the entry.

    Returns:
        Its :class:`optiplug.OptimizerSpec`, bridged (with an :class:`optiplug.Origin`).
    """
    return optiplug.OptimizerSpec(
        name=item.name,
        factory=optiplug.lazy(f"{_MODULE}:{item.cls}"),
        config=CONFIGS[item.name],
        description=item.description,
        state_slots=item.state,
        origin=optiplug.Origin(
            library=LIBRARY,
            version=LIBRARY_VERSION,
            target=item.target,
            paper=PAPER,
            limitation=item.limitation,
        ),
        example_hparams=item.example_hparams,
        example_shape=item.example_shape,
        hf_names=hf_names(item),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide every optimizer of ``galore_torch`` (none without it)."""
    optiplug.errors.PluginUnavailable.unless_installed(
        "galore_torch", provides=[item.name for item in CATALOG]
    )
    return [spec_of(item) for item in CATALOG]

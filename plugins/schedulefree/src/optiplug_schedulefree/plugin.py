"""Entry-point module of optiplug-schedulefree: records only, no torch or schedulefree import."""

from __future__ import annotations

import optiplug

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION, PAPER, Entry
from .config import CONFIGS

OPTIPLUG_API = 1

_MODULE = "optiplug_schedulefree.optimizers"
_PRIORITY = {"foreach": 1, "loop": 0}
_PLUGIN = "schedulefree"  # the entry-point name: this distribution's qualified names

HF_NAMES = {
    "radam_schedulefree": "schedule_free_radam",
    "adamw_schedulefree": "schedule_free_adamw",
    "sgd_schedulefree": "schedule_free_sgd",
}
"""Catalogue name -> the ``TrainingArguments(optim=...)`` name it serves."""


def _target(item: Entry) -> str:
    if item.cls.startswith("ScheduleFreeWrapper"):
        return f"{_MODULE}:{item.name}"
    return f"{_MODULE}:{item.cls}"


def _implementations(item: Entry) -> tuple[optiplug.ImplementationSpec, ...]:
    return tuple(
        optiplug.ImplementationSpec(
            item.name,
            name,
            optiplug.lazy(_target(item), impl=name),
            priority=_PRIORITY[name],
            description=f"{item.cls} with foreach={name == 'foreach'}",
        )
        for name in item.implementations
    )


def spec_of(item: Entry) -> optiplug.OptimizerSpec:
    """The registry record of one catalogue entry.

    Args:
        item: the entry.

    Returns:
        Its :class:`optiplug.OptimizerSpec`, bridged (with an :class:`optiplug.Origin`).
    """
    wrapper = item.cls.startswith("ScheduleFreeWrapper")
    return optiplug.OptimizerSpec(
        name=item.name,
        factory=optiplug.lazy(_target(item)),
        config=None if wrapper else CONFIGS[item.name],
        description=item.description,
        state_slots=item.state,
        implementations=_implementations(item),
        origin=optiplug.Origin(
            library=LIBRARY,
            version=LIBRARY_VERSION,
            target=item.target,
            paper=PAPER,
            limitation=item.limitation,
        ),
        group_state=item.group_state,
        train_eval=item.train_eval,
        step_closure=item.step_closure,
        example_hparams=item.example_hparams,
        hf_names=(HF_NAMES[item.name],) if item.name in HF_NAMES else (),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide every optimizer of ``schedulefree`` (none without it)."""
    optiplug.errors.PluginUnavailable.unless_installed(
        "schedulefree", provides=[item.name for item in CATALOG]
    )
    return [spec_of(item) for item in CATALOG]


SCHEDULE_FREE_SCORE = 15.0
"""Below the core's pretraining AdamW (20): proposed and explained, chosen only where
no AdamW rule answers. The race in the docs decides whether it should rank higher."""

_ROAD_LESS_SCHEDULED = (
    "Defazio et al. 2024, 'The Road Less Scheduled' (arXiv 2405.15682): Schedule-Free "
    "AdamW needs no schedule length and matched or beat tuned cosine schedules in its "
    "experiments; it won the AlgoPerf 2024 self-tuning track"
)


@optiplug.hookimpl
def optiplug_select_optimizer(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
    """Propose Schedule-Free AdamW for pretraining when the run's length is unknown.

    A cosine or linear schedule needs the number of steps; without it
    (``total_steps`` None) a schedule-free method is the one that needs none.
    Its hyperparameters are the library's defaults (lr 0.0025, betas (0.9,
    0.999)), with weight decay 0.1 as the core's pretraining AdamW rule uses.
    """
    if request.stage != "pretraining" or request.total_steps is not None:
        return []
    return [
        optiplug.Candidate(
            f"{_PLUGIN}:adamw_schedulefree",
            {"lr": 0.0025, "weight_decay": 0.1},
            SCHEDULE_FREE_SCORE,
            f"pretraining with the run's length unknown (no total_steps): {_ROAD_LESS_SCHEDULED}; "
            "lr and betas are the library's defaults, weight decay 0.1 as for AdamW; "
            "call optimizer.train() before steps and optimizer.eval() before evaluating",
            rule="schedulefree:horizon-unknown",
        )
    ]

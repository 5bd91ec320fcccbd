"""Entry-point module of optiplug-pytorch-optimizer: records only, no torch or library import."""

from __future__ import annotations

import functools

import optiplug

from .catalog import ENTRIES, LIBRARY, VERSION
from .schema import config_class
from .table import Entry

OPTIPLUG_API = 1

PLUGIN = "pytorch_optimizer"
"""The entry-point name: qualified names are ``pytorch_optimizer:<name>``."""

_STATE_32, _UNPAGED = optiplug.HFName.STATE_32, optiplug.HFName.UNPAGED
_BELOW_SCHEDULEFREE = -1  # the schedulefree library's own classes serve these names first

HF_NAMES: dict[str, tuple[optiplug.HFName, ...]] = {
    "adafactor": (optiplug.HFName("adafactor"),),
    "ademamix": (
        optiplug.HFName("ademamix"),
        optiplug.HFName("ademamix_8bit", caveat=_STATE_32),
        optiplug.HFName("paged_ademamix_32bit", caveat=_UNPAGED),
        optiplug.HFName("paged_ademamix_8bit", caveat=f"{_STATE_32}; {_UNPAGED}"),
    ),
    "rmsprop": (
        optiplug.HFName("rmsprop"),
        optiplug.HFName("rmsprop_bnb"),
        optiplug.HFName("rmsprop_bnb_8bit", caveat=_STATE_32),
        optiplug.HFName("rmsprop_bnb_32bit"),
    ),
    "galore": (
        optiplug.HFName(
            "galore_adamw",
            caveat="no low-rank projection: pytorch_optimizer's GaLore projects only param "
            "groups that carry a rank, and optiplug neither reads optim_target_modules nor takes "
            "rank, so every parameter steps as AdamW",
        ),
    ),
    "lomo": (optiplug.HFName("lomo"),),
    "adalomo": (optiplug.HFName("adalomo"),),
    "schedulefreeradam": (optiplug.HFName("schedule_free_radam", priority=_BELOW_SCHEDULEFREE),),
    "schedulefreeadamw": (optiplug.HFName("schedule_free_adamw", priority=_BELOW_SCHEDULEFREE),),
    "schedulefreesgd": (optiplug.HFName("schedule_free_sgd", priority=_BELOW_SCHEDULEFREE),),
    "stableadamw": (optiplug.HFName("stable_adamw"),),
}
"""The ``TrainingArguments(optim=...)`` names each catalogue entry serves, by its name."""


def class_name(entry: Entry) -> str:
    """The wrapper's name in :mod:`optiplug_pytorch_optimizer.optimizers` (the library's class name)."""
    return entry.target.rpartition(":")[2]


def state_slots(entry: Entry) -> tuple[optiplug.StateSlot, ...] | None:
    """The catalogue's slots as :class:`optiplug.StateSlot` records (None: not described)."""
    if entry.slots is None:
        return None
    return tuple(
        optiplug.StateSlot(
            slot.name,
            shape=slot.shape,
            dtype=slot.dtype,
            when=slot.when,
            constraints=("finite",) if slot.finite else (),
            kind=slot.kind,
            optional=slot.optional,
        )
        for slot in entry.slots
    )


_PRIORITY = {"foreach": 1, "loop": 0, "default": 0, "fused": -1}
"""As :func:`optiplug.base.external_implementations` ranks them (``fused`` only when asked)."""


def implementations(entry: Entry) -> tuple[optiplug.ImplementationSpec, ...]:
    """The implementations the class's signature offers (its ``foreach``/``fused`` flags).

    The same table :func:`optiplug.base.external_implementations` derives from
    the class, written from the catalogue so that listing imports nothing.
    """
    names = ["loop", *entry.flags] if entry.flags else ["default"]
    target = f"optiplug_pytorch_optimizer.optimizers:{class_name(entry)}"
    unavailable = dict(entry.unavailable)
    return tuple(
        optiplug.ImplementationSpec(
            entry.name,
            name,
            optiplug.lazy(target, impl=name),
            priority=_PRIORITY[name],
            availability=functools.partial(_unavailable, unavailable[name])
            if name in unavailable
            else None,
            description=f"{class_name(entry)} with "
            + (
                f"{name}=True"
                if name in entry.flags
                else "foreach=False"
                if name == "loop"
                else "its own defaults"
            ),
        )
        for name in names
    )


def _unavailable(reason: str) -> str:
    """An implementation's availability check that always gives ``reason``."""
    return reason


def spec_of(entry: Entry) -> optiplug.OptimizerSpec:
    """The :class:`optiplug.OptimizerSpec` of one catalogue entry."""
    paper = f" Paper: {entry.paper}." if entry.paper else ""
    return optiplug.OptimizerSpec(
        name=entry.name,
        factory=optiplug.lazy(f"optiplug_pytorch_optimizer.optimizers:{class_name(entry)}"),
        config=config_class(entry),
        description=f"{entry.summary} (pytorch-optimizer's {class_name(entry)}).{paper}",
        state_slots=state_slots(entry),
        implementations=implementations(entry),
        origin=optiplug.Origin(
            library=LIBRARY,
            version=VERSION,
            target=entry.target,
            paper=entry.paper,
            limitation=entry.limitation,
        ),
        group_state=entry.group_state,
        step_closure=entry.closure,
        create_graph=entry.create_graph,
        train_eval=entry.train_eval,
        example_hparams=entry.example_hparams,
        example_dtype=entry.example_dtype,
        hf_names=HF_NAMES.get(entry.name, ()),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide every optimizer pytorch-optimizer registers (none without it)."""
    optiplug.errors.PluginUnavailable.unless_installed(
        "pytorch_optimizer",
        distribution="pytorch-optimizer",
        provides=[entry.name for entry in ENTRIES],
    )
    return [spec_of(entry) for entry in ENTRIES]

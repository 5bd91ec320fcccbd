"""Entry-point module of optiplug-torch: records only, no torch import.

The wrapper classes (:mod:`optiplug_torch.optimizers`) are named lazily, so
``optiplug list`` reads these records without importing torch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import optiplug

from .catalog import ENTRIES, LIBRARY, VERSION, Entry, Slot
from .config import CONFIGS

OPTIPLUG_API = 1

PLUGIN = "torch"
"""The entry-point name: qualified names are ``torch:<name>``."""

HF_NAMES: dict[str, tuple[optiplug.HFName, ...]] = {
    "adagrad": (optiplug.HFName("adagrad", adam_arguments=False),),
    "rmsprop": (optiplug.HFName("rmsprop", priority=1, adam_arguments=False),),
}
"""The ``TrainingArguments(optim=...)`` names served, by entry: transformers builds
``torch.optim.Adagrad`` and ``torch.optim.RMSprop`` for them, these very classes
(ahead of pytorch-optimizer's re-export of RMSprop), with the keywords it gives
them: the learning rate and weight decay, not the Trainer's Adam ``betas`` and
``eps`` (torch's ``eps`` stays: 1e-10 for Adagrad). ``adafactor`` is not
declared: transformers' Adafactor is not torch's (see the bridge's docs)."""

_PRIORITY = {"foreach": 1, "loop": 0, "default": 0, "fused": -1}
"""As :class:`optiplug.base.ExternalOptimizer` ranks them (``fused`` only when asked)."""


def state_slot(slot: Slot) -> optiplug.StateSlot:
    """The catalogue's slot as an :class:`optiplug.StateSlot`."""
    return optiplug.StateSlot(
        slot.name,
        shape=slot.shape,
        dtype=slot.dtype,
        when=slot.when,
        constraints=slot.constraints,
        kind=slot.kind,
        optional=slot.optional,
    )


def fused_runs(devices: tuple[str, ...], params: Sequence[Any]) -> bool:
    """Whether torch's fused kernel takes ``params``: floating point, on one of ``devices``."""
    return all(p.device.type in devices and p.is_floating_point() for p in params)


def implementations(entry: Entry) -> tuple[optiplug.ImplementationSpec, ...]:
    """``loop`` plus each kernel flag the class names, or ``default`` for a class with none.

    The table :func:`optiplug.base.external_implementations` derives from the
    class's signature, written from the catalogue so that listing imports no
    torch; ``fused`` runs only on the devices torch's kernel supports.
    """
    names = ["loop", *entry.flags] if entry.flags else ["default"]
    target = f"optiplug_torch.optimizers:{entry.class_name}"
    return tuple(
        optiplug.ImplementationSpec(
            entry.name,
            name,
            optiplug.lazy(target, impl=name),
            priority=_PRIORITY[name],
            supports=functools.partial(fused_runs, entry.fused_devices)
            if name == "fused"
            else None,
            description=f"torch.optim.{entry.class_name} with "
            + {"loop": "foreach=False", "default": "its own kernel"}.get(name, f"{name}=True"),
        )
        for name in names
    )


def spec_of(entry: Entry) -> optiplug.OptimizerSpec:
    """The :class:`optiplug.OptimizerSpec` of one catalogue entry."""
    return optiplug.OptimizerSpec(
        name=entry.name,
        factory=optiplug.lazy(f"optiplug_torch.optimizers:{entry.class_name}"),
        config=CONFIGS[entry.name],
        description=f"{entry.summary} (torch.optim.{entry.class_name}). Paper: {entry.paper}.",
        state_slots=None if entry.slots is None else tuple(map(state_slot, entry.slots)),
        implementations=implementations(entry),
        origin=optiplug.Origin(
            library=LIBRARY,
            version=VERSION,
            target=f"torch.optim:{entry.class_name}",
            paper=entry.paper,
            limitation=entry.limitation,
        ),
        step_closure=entry.closure,
        example_hparams=entry.example_hparams,
        hf_names=HF_NAMES.get(entry.name, ()),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide every bridged ``torch.optim`` class of the catalogue."""
    return [spec_of(entry) for entry in ENTRIES]

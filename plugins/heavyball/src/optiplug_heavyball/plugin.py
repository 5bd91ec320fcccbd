"""Entry-point module of optiplug-heavyball: records only, no torch or heavyball import."""

from __future__ import annotations

import optiplug

from .catalog import CATALOG, LIBRARY, VERSION, Entry, Slot
from .config import CONFIGS
from .state import GROUP_STATE

OPTIPLUG_API = 1

EXAMPLE_DTYPE = "float32"
"""heavyball keeps its state in ``storage_dtype`` (float32) and some kernels (SOAP's
eigendecompositions) refuse float64: the checks run float32 parameters."""


def _slot(slot: Slot) -> optiplug.StateSlot:
    constraints = () if slot.kind == "any" else ("finite",)
    return optiplug.StateSlot(
        slot.name,
        shape=slot.shape,
        dtype=slot.dtype,
        when=slot.when,
        constraints=constraints,
        kind=slot.kind,
    )


def spec_of(entry: Entry) -> optiplug.OptimizerSpec:
    """The record of one catalogue row.

    Args:
        entry: a row of :data:`~optiplug_heavyball.catalog.CATALOG`.

    Returns:
        The :class:`optiplug.OptimizerSpec`, bridged (``origin`` set).
    """
    class_name = entry.target.split(":")[1]
    return optiplug.OptimizerSpec(
        name=entry.name,
        factory=optiplug.lazy(f"optiplug_heavyball.optimizers:{class_name}"),
        config=CONFIGS[entry.name],
        description=f"heavyball {class_name}: {entry.summary}.",
        state_slots=None if entry.slots is None else tuple(_slot(slot) for slot in entry.slots),
        origin=optiplug.Origin(
            library=LIBRARY,
            version=VERSION,
            target=entry.target,
            paper=entry.paper,
            limitation=entry.limitation,
        ),
        group_state=GROUP_STATE,
        train_eval=entry.train_eval,
        example_dtype=EXAMPLE_DTYPE,
        example_hparams=entry.example_hparams,
        capabilities=("keeps-norm",) if entry.keeps_norm else (),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide every heavyball optimizer of the catalogue (none without heavyball)."""
    optiplug.errors.PluginUnavailable.unless_installed(
        "heavyball", provides=[entry.name for entry in CATALOG]
    )
    return [spec_of(entry) for entry in CATALOG]

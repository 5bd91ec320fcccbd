"""Entry-point module of optiplug-torchao: records only, no torch or torchao import."""

from __future__ import annotations

import optiplug

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION, Entry
from .config import CONFIGS

OPTIPLUG_API = 1

_MODULE = "optiplug_torchao.optimizers"

_BLOCKWISE = "torchao's blockwise 8-bit state, not bitsandbytes'"

HF_NAMES: dict[str, tuple[optiplug.HFName, ...]] = {
    "adamw4bit": (optiplug.HFName("adamw_torch_4bit"),),
    "adamw8bit": (
        optiplug.HFName("adamw_torch_8bit"),
        optiplug.HFName("adamw_bnb_8bit", caveat=_BLOCKWISE),
        optiplug.HFName("adamw_8bit", caveat=_BLOCKWISE),
        optiplug.HFName("paged_adamw_8bit", caveat=optiplug.HFName.UNPAGED),
    ),
}
"""The ``TrainingArguments(optim=...)`` names each catalogue entry serves, by its name."""


def _factory(item: Entry) -> optiplug.LazyCallable:
    if item.name == "cpu_offload":
        return optiplug.lazy(f"{_MODULE}:cpu_offload")
    return optiplug.lazy(f"{_MODULE}:{item.cls.lstrip('_')}")


def spec_of(item: Entry) -> optiplug.OptimizerSpec:
    """The registry record of one catalogue entry.

    Args:
        item: the entry.

    Returns:
        Its :class:`optiplug.OptimizerSpec`, bridged (with an :class:`optiplug.Origin`).
    """
    return optiplug.OptimizerSpec(
        name=item.name,
        factory=_factory(item),
        config=None if item.limitation else CONFIGS[item.name],
        description=item.description,
        state_slots=item.state or None,
        origin=optiplug.Origin(
            library=LIBRARY,
            version=LIBRARY_VERSION,
            target=item.target,
            paper=item.paper,
            limitation=item.limitation,
        ),
        example_shape=item.example_shape,
        example_dtype=item.example_dtype,
        hf_names=HF_NAMES.get(item.name, ()),
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide every optimizer of ``torchao.optim`` (none without torchao)."""
    optiplug.errors.PluginUnavailable.unless_installed(
        "torchao", provides=[item.name for item in CATALOG]
    )
    return [spec_of(item) for item in CATALOG]

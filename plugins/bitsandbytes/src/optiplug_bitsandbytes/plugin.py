"""Entry-point module of optiplug-bitsandbytes: records only, no torch or bitsandbytes import."""

from __future__ import annotations

import optiplug

from .catalog import CATALOG, LIBRARY, LIBRARY_VERSION, Entry
from .config import CONFIGS

OPTIPLUG_API = 1

_MODULE = "optiplug_bitsandbytes.optimizers"

HF_PRIORITY = 1
"""Above every other declaration of these names (the 32-bit fallbacks declare 0 or -1):
bitsandbytes' own class is what transformers builds for them."""

_ADEMAMIX_BETAS = (
    "the Trainer's adam_beta1/adam_beta2 are not passed (AdEMAMix takes three betas; "
    "give betas=(b1, b2, b3) to from_training_args)"
)

HF_OPTIM: dict[str, tuple[str, str]] = {
    "adamw_bnb_8bit": ("adamw8bit", ""),
    "adamw_8bit": ("adamw8bit", ""),
    "paged_adamw_8bit": ("pagedadamw8bit", ""),
    "paged_adamw_32bit": ("pagedadamw32bit", ""),
    "lion_8bit": ("lion8bit", ""),
    "lion_32bit": ("lion32bit", ""),
    "paged_lion_8bit": ("pagedlion8bit", ""),
    "paged_lion_32bit": ("pagedlion32bit", ""),
    "rmsprop_bnb": ("rmsprop", ""),
    "rmsprop_bnb_8bit": ("rmsprop8bit", ""),
    "rmsprop_bnb_32bit": ("rmsprop32bit", ""),
    "ademamix": ("ademamix", _ADEMAMIX_BETAS),
    "ademamix_8bit": ("ademamix8bit", _ADEMAMIX_BETAS),
    "paged_ademamix_8bit": ("pagedademamix8bit", _ADEMAMIX_BETAS),
    "paged_ademamix_32bit": ("pagedademamix", _ADEMAMIX_BETAS),
}
"""``TrainingArguments(optim=...)`` -> (the entry that keeps the state it names, caveat).

transformers builds ``AdamW``, ``Lion``, ``RMSprop`` or ``AdEMAMix`` with
``optim_bits`` 8 or 32 and ``is_paged`` from the name; each entry here is the
class with those fixed (``paged_ademamix_32bit`` is ``PagedAdEMAMix`` in
32 bits: ``PagedAdEMAMix32bit`` cannot step, see its limitation)."""


def _hf_names(item: Entry) -> tuple[optiplug.HFName, ...]:
    return tuple(
        optiplug.HFName(optim, caveat=caveat, priority=HF_PRIORITY)
        for optim, (name, caveat) in HF_OPTIM.items()
        if name == item.name
    )


def _factory(item: Entry) -> optiplug.LazyCallable:
    if item.limitation:
        return optiplug.lazy(f"{_MODULE}:unavailable", entry=item.name)
    return optiplug.lazy(f"{_MODULE}:{item.cls}")


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
        hf_names=_hf_names(item),
        example_hparams=_example_hparams(item),
    )


def _example_hparams(item: Entry) -> dict[str, float]:
    """A momentum for the classes bitsandbytes implements with momentum only (SGD, LARS)."""
    required = any(p.name == "momentum" and p.check == "momentum_required" for p in item.params)
    return {"momentum": 0.9} if required else {}


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide every optimizer of ``bitsandbytes.optim`` (none without bitsandbytes)."""
    optiplug.errors.PluginUnavailable.unless_installed(
        "bitsandbytes", provides=[item.name for item in CATALOG]
    )
    return [spec_of(item) for item in CATALOG]

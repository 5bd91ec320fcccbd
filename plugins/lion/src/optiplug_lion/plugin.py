"""Entry-point module of optiplug-lion: hookimpls and records only, no torch import."""

from __future__ import annotations

import optiplug

from .config import LION_STATE, LionConfig
from .rule import pretraining_rule

OPTIPLUG_API = 1

_TARGET = "optiplug_lion.optimizer:Lion"

IMPLEMENTATIONS: dict[str, tuple[int, str]] = {
    "fused": (
        2,
        "one fused kernel per tensor (20 bytes/param): C on CPU, torch.compile elsewhere; "
        "falls back to foreach",
    ),
    "foreach": (1, "torch._foreach_* ops over all tensors"),
    "loop": (0, "per-tensor torch ops"),
}
"""name -> (priority when not measured, description); the class's tables read it too."""

_STATE_32, _UNPAGED = optiplug.HFName.STATE_32, optiplug.HFName.UNPAGED

HF_NAMES = (
    optiplug.HFName("lion_32bit"),
    optiplug.HFName("lion_8bit", caveat=_STATE_32),
    optiplug.HFName("paged_lion_32bit", caveat=_UNPAGED),
    optiplug.HFName("paged_lion_8bit", caveat=f"{_STATE_32}; {_UNPAGED}"),
)
"""The ``TrainingArguments(optim=...)`` names ``lion`` serves."""

_SUPPORTS = {
    "fused": "optiplug_lion.optimizer:fused_supported",
    "foreach": "optiplug.base:foreach_supported",
}


def lion_implementations() -> tuple[optiplug.ImplementationSpec, ...]:
    """The ``fused``, ``foreach`` and ``loop`` records of ``lion``.

    Returns:
        One :class:`optiplug.ImplementationSpec` per implementation; each
        factory builds :class:`~optiplug_lion.optimizer.Lion` forced to it.
    """
    return tuple(
        optiplug.ImplementationSpec(
            "lion",
            name,
            optiplug.lazy(_TARGET, impl=name),
            supports=optiplug.lazy(_SUPPORTS[name]) if name in _SUPPORTS else None,
            priority=priority,
            description=description,
            compiles=name == "fused",
        )
        for name, (priority, description) in IMPLEMENTATIONS.items()
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``lion``."""
    return [
        optiplug.OptimizerSpec(
            name="lion",
            factory=optiplug.lazy(_TARGET),
            config=LionConfig,
            description=(
                "Lion (EvoLved Sign Momentum): p -= lr*sign(beta1*m + (1-beta1)*g), "
                "m = beta2*m + (1-beta2)*g, with decoupled weight decay."
            ),
            state_slots=LION_STATE,
            implementations=lion_implementations(),
            hf_names=HF_NAMES,
            capabilities={"elementwise"},
        )
    ]


@optiplug.hookimpl
def optiplug_select_optimizer(
    request: optiplug.SelectionRequest,
) -> list[optiplug.Candidate]:
    """Propose lion for pretraining (:func:`~optiplug_lion.rule.pretraining_rule`)."""
    return pretraining_rule(request)

"""optiplug-adamw: Adam with decoupled weight decay, built on optiplug-adam.

This plugin depends on the ``optiplug-adam`` distribution: it reuses Adam's
validated hyperparameters and state layout and changes only the default
weight decay and the decay rule (``p <- p * (1 - lr * wd)`` before the Adam
step, as ``torch.optim.AdamW``). Importing this package does not import
torch: ``AdamW`` is built on first access.
"""

from __future__ import annotations

from typing import Any

from .plugin import ADAMW_STATE, AdamWConfig

__all__ = ["ADAMW_STATE", "AdamW", "AdamWConfig"]

_DOC = """AdamW (Loshchilov & Hutter): ``p <- p * (1 - lr * wd)``, then the Adam step.

Same update and state names as ``torch.optim.AdamW``, so a torch AdamW
state dict loads here and back.

Args:
    params: tensors, param-group dicts or ``(name, tensor)`` pairs.
    lr: learning rate (default 1e-3).
    impl: ``"loop"``, ``"foreach"``, ``"fused"`` or None (fastest, measured).
    **hparams: ``betas``, ``eps``, ``weight_decay`` (default 1e-2),
        ``amsgrad``, ``maximize`` (see :class:`~optiplug_adamw.AdamWConfig`).
"""


def __getattr__(name: str) -> Any:
    if name != "AdamW":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch  # deferred: imports torch

    from optiplug.base import fused_adam_step, torch_backed_optimizer  # deferred: imports torch

    built = torch_backed_optimizer(
        "adamw",
        torch.optim.AdamW,
        AdamWConfig,
        module=__name__,
        doc=_DOC,
        state_step=fused_adam_step,
    )
    return globals().setdefault(name, built)  # one class object, so instances pickle

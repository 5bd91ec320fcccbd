"""optiplug-adam: the Adam optimizer (with AMSGrad) for optiplug.

``Adam`` is ``torch.optim.Adam`` with validated hyperparameters and a measured
choice of implementation. Importing this package does not import torch:
``Adam`` is built on first access.
"""

from __future__ import annotations

from typing import Any

from .plugin import ADAM_STATE, AdamConfig

__all__ = ["ADAM_STATE", "Adam", "AdamConfig"]

_DOC = """Adam (Kingma & Ba) with optional AMSGrad; L2 weight decay added to the gradient.

Same update and state names (``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``) as ``torch.optim.Adam``.

Args:
    params: tensors, param-group dicts or ``(name, tensor)`` pairs.
    lr: learning rate (default 1e-3).
    impl: ``"loop"``, ``"foreach"``, ``"fused"`` or None (fastest, measured).
    **hparams: ``betas``, ``eps``, ``weight_decay``, ``amsgrad``, ``maximize``
        (see :class:`~optiplug_adam.AdamConfig`).
"""


def __getattr__(name: str) -> Any:
    if name != "Adam":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch  # deferred: imports torch

    from optiplug.base import fused_adam_step, torch_backed_optimizer  # deferred: imports torch

    built = torch_backed_optimizer(
        "adam", torch.optim.Adam, AdamConfig, module=__name__, doc=_DOC, state_step=fused_adam_step
    )
    return globals().setdefault(name, built)  # one class object, so instances pickle

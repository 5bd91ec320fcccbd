"""``AdamW``: ``torch.optim.AdamW`` with optiplug's contract and optiplug-adam's C state step.

Imported on first access of ``optiplug_adamw.AdamW`` (it imports torch).
"""

from __future__ import annotations

import torch

from optiplug.base import TorchBackedOptimizer
from optiplug_adam.native import fused_adam_step

from .plugin import AdamWConfig

__all__ = ["AdamW"]


class AdamW(TorchBackedOptimizer, torch.optim.AdamW):
    """AdamW (Loshchilov & Hutter): ``p <- p * (1 - lr * wd)``, then the Adam step.

    Same update and state names as ``torch.optim.AdamW``, so a torch AdamW
    state dict loads here and back.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: learning rate (default 1e-3).
        impl: ``"loop"``, ``"foreach"``, ``"fused"`` or None (fastest, measured).
        **hparams: ``betas``, ``eps``, ``weight_decay`` (default 1e-2),
            ``amsgrad``, ``maximize`` (see :class:`~optiplug_adamw.AdamWConfig`).
    """

    __module__ = "optiplug_adamw"  # its public path, where pickles find it
    algorithm = "adamw"
    config_class = AdamWConfig
    state_step = fused_adam_step

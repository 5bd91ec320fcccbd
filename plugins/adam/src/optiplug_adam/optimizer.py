"""``Adam``: ``torch.optim.Adam`` with optiplug's contract and a C step on int8/int4/bf16 state.

Imported on first access of ``optiplug_adam.Adam`` (it imports torch).
"""

from __future__ import annotations

import torch

from optiplug.base import TorchBackedOptimizer

from .native import fused_adam_step
from .plugin import AdamConfig

__all__ = ["Adam"]


class Adam(TorchBackedOptimizer, torch.optim.Adam):
    """Adam (Kingma & Ba) with optional AMSGrad; L2 weight decay added to the gradient.

    Same update and state names (``step``, ``exp_avg``, ``exp_avg_sq``,
    ``max_exp_avg_sq``) as ``torch.optim.Adam``.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: learning rate (default 1e-3).
        impl: ``"loop"``, ``"foreach"``, ``"fused"`` or None (fastest, measured).
        **hparams: ``betas``, ``eps``, ``weight_decay``, ``amsgrad``, ``maximize``
            (see :class:`~optiplug_adam.AdamConfig`).
    """

    __module__ = "optiplug_adam"  # its public path, where pickles find it
    algorithm = "adam"
    config_class = AdamConfig
    state_step = fused_adam_step

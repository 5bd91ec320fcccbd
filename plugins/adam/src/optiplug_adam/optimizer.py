"""The Adam optimizer: torch's kernels behind optiplug's contract."""

from __future__ import annotations

import torch

from optiplug.base import TorchBackedOptimizer

from .config import AdamConfig

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
            (see :class:`~optiplug_adam.config.AdamConfig`).
    """

    algorithm = "adam"
    config_class = AdamConfig

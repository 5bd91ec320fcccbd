"""The SGD optimizer: torch's kernels behind optiplug's contract."""

from __future__ import annotations

import torch

from optiplug.base import TorchBackedOptimizer

from .config import SGDConfig

__all__ = ["SGD"]


class SGD(TorchBackedOptimizer, torch.optim.SGD):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

    Same update and state names (``momentum_buffer``) as ``torch.optim.SGD``.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: learning rate (default 1e-3).
        impl: ``"loop"``, ``"foreach"``, ``"fused"`` or None (fastest, measured).
        **hparams: ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``,
            ``maximize`` (see :class:`~optiplug_sgd.config.SGDConfig`).
    """

    algorithm = "sgd"
    config_class = SGDConfig

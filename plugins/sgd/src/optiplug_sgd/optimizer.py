"""``SGD``: ``torch.optim.SGD`` with optiplug's contract and a C step on int8/int4/bf16 state.

Imported on first access of ``optiplug_sgd.SGD`` (it imports torch).
"""

from __future__ import annotations

import torch

from optiplug.base import TorchBackedOptimizer

from .native import fused_sgd_step
from .plugin import SGDConfig

__all__ = ["SGD"]


class SGD(TorchBackedOptimizer, torch.optim.SGD):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

    Same update and state names (``momentum_buffer``) as ``torch.optim.SGD``.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: learning rate (default 1e-3).
        impl: ``"loop"``, ``"foreach"``, ``"fused"`` or None (fastest, measured).
        **hparams: ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``,
            ``maximize`` (see :class:`~optiplug_sgd.SGDConfig`).
    """

    __module__ = "optiplug_sgd"  # its public path, where pickles find it
    algorithm = "sgd"
    config_class = SGDConfig
    state_step = fused_sgd_step

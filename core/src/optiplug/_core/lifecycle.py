"""The train/eval lifecycle some optimizers need (schedule-free methods).

A schedule-free optimizer keeps two points: it steps at one (``train()``
mode) and its parameters must be switched to the other, the averaged one,
for evaluation and checkpoints (``eval()`` mode). Such an optimizer either
declares it (:attr:`~optiplug.OptimizerSpec.train_eval`) or is detected by
having callable ``train`` and ``eval`` methods, which ``torch.optim.Optimizer``
has not. Every loop optiplug runs calls :func:`set_training` with True before
training steps and False before evaluating or checkpointing; for any other
optimizer it does nothing.

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

from .create import SPEC_ATTRIBUTE
from .specs import OptimizerSpec

__all__ = ["has_train_eval", "set_training"]


def has_train_eval(optimizer: Any) -> bool:
    """Whether ``optimizer`` has a train/eval lifecycle (declared or detected).

    Args:
        optimizer: any optimizer.

    Returns:
        True when its spec declares ``train_eval`` or it has callable
        ``train`` and ``eval`` methods.
    """
    spec = getattr(optimizer, SPEC_ATTRIBUTE, None)
    if isinstance(spec, OptimizerSpec) and spec.train_eval:
        return True
    return callable(getattr(optimizer, "train", None)) and callable(
        getattr(optimizer, "eval", None)
    )


def set_training(optimizer: Any, training: bool) -> bool:
    """Switch ``optimizer`` to train (True) or eval (False) mode, if it has the lifecycle.

    Call it with True before training steps and with False before
    evaluation and before saving a checkpoint; switching to the mode it is
    already in changes nothing (as schedule-free's methods document).

    Args:
        optimizer: any optimizer.
        training: the mode to switch to.

    Returns:
        Whether the optimizer has the lifecycle (and was switched).

    Raises:
        TypeError: its spec declares ``train_eval`` but it has no callable
            ``train``/``eval`` methods.
    """
    if not has_train_eval(optimizer):
        return False
    method = getattr(optimizer, "train" if training else "eval", None)
    if not callable(method):
        raise TypeError(
            f"{type(optimizer).__name__} declares train_eval but has no callable "
            f"{'train' if training else 'eval'}() method"
        )
    method()
    return True

"""The train/eval lifecycle some optimizers need (schedule-free methods), and how a step is taken.

A schedule-free optimizer keeps two points: it steps at one (``train()``
mode) and its parameters must be switched to the other, the averaged one,
for evaluation and checkpoints (``eval()`` mode). Such an optimizer either
declares it (:attr:`~optiplug.OptimizerSpec.train_eval`) or is detected by
having callable ``train`` and ``eval`` methods, which ``torch.optim.Optimizer``
has not. Every loop optiplug runs calls :func:`set_training` with True before
training steps and False before evaluating or checkpointing; for any other
optimizer it does nothing.

Some optimizers also need more than ``loss.backward(); optimizer.step()``:
a closure (:attr:`~optiplug.OptimizerSpec.step_closure`) or gradients that
keep their graph (:attr:`~optiplug.OptimizerSpec.create_graph`).
:func:`training_step` takes one step the way the spec asks.

Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .record import record_of

__all__ = ["has_train_eval", "set_training", "step_needs", "training_step"]


def has_train_eval(optimizer: Any) -> bool:
    """Whether ``optimizer`` has a train/eval lifecycle (declared or detected).

    Args:
        optimizer: any optimizer.

    Returns:
        True when its spec declares ``train_eval`` or it has callable
        ``train`` and ``eval`` methods.
    """
    record = record_of(optimizer)
    if record is not None and record.spec.train_eval:
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


def step_needs(optimizer: Any) -> tuple[bool, bool]:
    """What a step of ``optimizer`` needs, from its spec: ``(closure, create_graph)``.

    Args:
        optimizer: any optimizer; one optiplug did not build needs neither.

    Returns:
        Whether ``step`` must be given a closure, and whether ``backward``
        must keep the graph.
    """
    record = record_of(optimizer)
    if record is None:
        return False, False
    return record.spec.step_closure, record.spec.create_graph


def training_step(optimizer: Any, loss_of: Callable[[], Any]) -> Any:
    """One training step, taken the way the optimizer's spec asks.

    Zeroes the gradients, computes ``loss_of()``, backpropagates it (keeping
    the graph when the spec declares ``create_graph``) and steps. An
    optimizer whose spec declares ``step_closure`` is given a closure doing
    the same, which it may call several times (line searches, sharpness-
    aware perturbations).

    Args:
        optimizer: a ``torch.optim.Optimizer``, in train mode if it has the
            lifecycle (:func:`set_training`).
        loss_of: computes the loss from the current parameters.

    Returns:
        The loss: the closure's first evaluation when one is used (what
        torch's L-BFGS returns), else ``loss_of()``'s value.
    """
    closure_needed, create_graph = step_needs(optimizer)

    def closure() -> Any:
        optimizer.zero_grad()
        loss = loss_of()
        loss.backward(create_graph=create_graph)
        return loss

    if closure_needed:
        return optimizer.step(closure)
    loss = closure()
    optimizer.step()
    return loss

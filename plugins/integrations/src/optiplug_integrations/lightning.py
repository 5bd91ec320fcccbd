"""A Lightning callback switching schedule-free optimizers between train and eval mode.

Schedule-free optimizers keep two points: training steps need
``optimizer.train()``, and evaluation and the weights you save need
``optimizer.eval()`` (the averaged point). Lightning calls neither, so::

    from optiplug_integrations.lightning import ScheduleFreeMode

    trainer = L.Trainer(callbacks=[ScheduleFreeMode()], ...)

Importing this module imports lightning (as
:mod:`optiplug_integrations.transformers` imports transformers);
``import optiplug`` never imports it.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from optiplug.base import set_training

__all__ = ["ScheduleFreeMode"]


class ScheduleFreeMode(L.Callback):
    """Train mode for training steps, eval mode for validation, test, predict and checkpoints.

    * ``train()`` before each training batch (so training starts and
      resumes, after validation or a checkpoint, in train mode; a switch to
      the mode the optimizer is in changes nothing);
    * ``eval()`` when validation, test or predict starts, and when a
      training epoch ends (so end-of-epoch checkpoints and the weights after
      ``fit`` are the averaged ones);
    * on a checkpoint saved in train mode (``every_n_train_steps``,
      ``trainer.save_checkpoint``), ``eval()`` and the checkpoint's model and
      optimizer state taken again, since Lightning collects them before its
      hooks run.

    Optimizers without ``train()``/``eval()`` are left alone. A
    ``save_weights_only`` checkpoint in the middle of an epoch calls no
    callback hook, so it holds train-mode weights.
    """

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        """Train mode for the coming step."""
        _switch(trainer, True)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Eval mode: what is validated, saved or used after the epoch is the averaged point."""
        _switch(trainer, False)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Eval mode for validation (sanity checks too)."""
        _switch(trainer, False)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Eval mode for testing."""
        _switch(trainer, False)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Eval mode for prediction."""
        _switch(trainer, False)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Eval mode for a checkpoint saved in train mode, its state taken again."""
        if not _switch(trainer, False, only_from_training=True):
            return
        checkpoint["state_dict"] = trainer.strategy.lightning_module_state_dict()
        if "optimizer_states" in checkpoint:
            states = [trainer.strategy.optimizer_state(opt) for opt in trainer.optimizers]
            checkpoint["optimizer_states"] = states


def _switch(trainer: L.Trainer, training: bool, only_from_training: bool = False) -> bool:
    """Switch each optimizer with the lifecycle; whether any was switched."""
    switched = False
    for optimizer in trainer.optimizers:
        target = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's own
        if only_from_training and not _in_train_mode(target):
            continue
        switched = set_training(target, training) or switched
    return switched


def _in_train_mode(optimizer: Any) -> bool:
    """Whether a schedule-free optimizer is in train mode (its groups' ``train_mode``)."""
    groups = getattr(optimizer, "param_groups", [])
    return bool(groups) and all(group.get("train_mode", False) for group in groups)

"""``ScheduleFreeMode``: a schedule-free optimizer in the right mode at each of Lightning's stages."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning as L
from torch.utils.data import DataLoader, TensorDataset

import optiplug
from optiplug_integrations.lightning import ScheduleFreeMode


def _loader(seed: int, size: int) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


class Recorder(L.LightningModule):
    """Records the optimizer's mode in each step and its state before each validation."""

    def __init__(self, algorithm: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.algorithm = algorithm
        self.modes: dict[str, list[bool | None]] = {"train": [], "val": []}
        self.before_validation: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def _mode(self) -> bool | None:
        return self.optimizers().optimizer.param_groups[0].get("train_mode")  # type: ignore[union-attr]

    def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
        self.modes["train"].append(self._mode())
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, *args: Any) -> None:
        optimizer = self.optimizers().optimizer  # type: ignore[union-attr]
        snapshot = (copy.deepcopy(self.layer.state_dict()), copy.deepcopy(optimizer.state_dict()))
        self.before_validation.append(snapshot)  # the last one: what validation starts from

    def validation_step(self, batch: Any, batch_index: int) -> None:
        self.modes["val"].append(self._mode())
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> Any:
        return optiplug.create(self.algorithm, self.parameters(), lr=0.05)


SETTINGS: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "max_epochs": 2,
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "enable_checkpointing": False,
    "num_sanity_val_steps": 0,
}


def _fit(
    module: Recorder, callbacks: tuple[Any, ...] = (ScheduleFreeMode(),), **more: Any
) -> L.Trainer:
    trainer = L.Trainer(**{**SETTINGS, **more}, callbacks=list(callbacks))
    trainer.fit(module, _loader(0, 32), _loader(1, 8))
    return trainer


def _validation_loss_by_hand(module: Recorder) -> torch.Tensor:
    """The last epoch's training end state, the optimizer switched to eval, the loss computed here."""
    weights, state = module.before_validation[-1]
    layer = torch.nn.Linear(4, 1)
    layer.load_state_dict(weights)
    optimizer = optiplug.create(module.algorithm, layer.parameters(), lr=0.05)
    optimizer.load_state_dict(state)
    optimizer.eval()  # type: ignore[attr-defined]
    (x, y) = next(iter(_loader(1, 8)))
    with torch.no_grad():
        return torch.nn.functional.mse_loss(layer(x), y)


def test_schedule_free_trains_in_train_mode_and_validates_in_eval_mode() -> None:
    module = Recorder("adamw_schedulefree")
    trainer = _fit(module)
    assert module.modes["train"] == [True] * 8  # 2 epochs of 4 batches
    assert module.modes["val"] == [False] * 2
    by_hand = _validation_loss_by_hand(module)
    assert torch.equal(trainer.callback_metrics["val_loss"], by_hand)  # same ops, same operands
    weights, _ = module.before_validation[-1]
    x, y = next(iter(_loader(1, 8)))
    in_train_mode = torch.nn.functional.mse_loss(x @ weights["weight"].T + weights["bias"], y)
    assert not torch.equal(in_train_mode, by_hand)  # the test tells the two points apart
    assert trainer.optimizers[0].param_groups[0]["train_mode"] is False  # averaged after fit


def test_a_checkpoint_saved_in_train_mode_holds_the_eval_point(tmp_path: Path) -> None:
    module = Recorder("adamw_schedulefree")
    trainer = _fit(module, max_epochs=1)
    optimizer = trainer.optimizers[0]
    optimizer.train()  # type: ignore[attr-defined]
    train_point = module.layer.weight.detach().clone()
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=False)
    optimizer.train()  # type: ignore[attr-defined]
    optimizer.eval()  # type: ignore[attr-defined]
    assert torch.equal(saved["state_dict"]["layer.weight"], module.layer.weight)
    assert not torch.equal(saved["state_dict"]["layer.weight"], train_point)
    assert saved["optimizer_states"][0]["param_groups"][0]["train_mode"] is False


def test_an_optimizer_without_train_and_eval_is_left_alone() -> None:
    module = Recorder("adamw")
    plain = copy.deepcopy(module)
    _fit(module)
    _fit(plain, callbacks=())
    assert module.modes["train"] == [None] * 8
    for ours, theirs in zip(module.parameters(), plain.parameters(), strict=True):
        assert torch.equal(ours, theirs)

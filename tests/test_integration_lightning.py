"""A factory and a schedule as Lightning hyperparameters: fit, checkpoint, resume, reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import optiplug

STEPS = 8
"""Eight epochs of one batch; the checkpoint saved after the fourth is resumed from.

One batch per epoch makes the batches independent of where Lightning restarts a
plain (not resumable) DataLoader, so any difference is the optimizer's or schedule's.
"""


class Regressor(L.LightningModule):
    """A linear layer whose optimizer and lr schedule are hyperparameters."""

    def __init__(self, optimizer: optiplug.OptimizerFactory, schedule: optiplug.Schedule) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = self.hparams["optimizer"](self.parameters())
        scheduler = self.hparams["schedule"].as_torch(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def data() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)


def fit(model: Regressor, root: Path, ckpt_path: Path | None = None) -> L.Trainer:
    every_epoch = ModelCheckpoint(dirpath=root, filename="{epoch}", save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=[every_epoch],
        max_steps=STEPS,
        default_root_dir=root,
    )
    trainer.fit(model, data(), ckpt_path=ckpt_path, weights_only=True)
    return trainer


def model() -> Regressor:
    return Regressor(
        optiplug.factory("adamw", lr=0.05, weight_decay=0.01),
        optiplug.schedule("cosine", total_steps=STEPS, warmup_steps=2),
    )


def test_resume_with_a_factory_hyperparameter_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = model()
    fit(whole, tmp_path / "whole")
    checkpoint = tmp_path / "whole" / "epoch=3.ckpt"
    resumed = model()
    trainer = fit(resumed, tmp_path / "resumed", ckpt_path=checkpoint)  # weights_only=True
    assert trainer.global_step == STEPS
    # CPU, fp32, same batches and kernels: the runs are bit-identical
    for (name, value), expected in zip(resumed.named_parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=name)

    loaded = Regressor.load_from_checkpoint(checkpoint)  # Lightning's default: weights_only
    assert loaded.hparams["optimizer"] == whole.hparams["optimizer"]
    assert loaded.hparams["schedule"] == whole.hparams["schedule"]
    optimizer = loaded.hparams["optimizer"](loaded.parameters())  # fully functional
    assert optimizer.param_groups[0]["lr"] == 0.05
    assert torch.load(checkpoint, weights_only=True)["hyper_parameters"]["schedule"](1) == 1.0

"""A tiny Hugging Face Trainer job, trained whole and resumed from a checkpoint (bridge tests).

A regression model trained by the Trainer on CPU: 6 steps with a checkpoint
after 3, then resumed from it; its 64x64 weight is large enough for
blockwise-quantized state (torchao) to take its quantized path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import optiplug

HF_STEPS = 6
HF_SAVE_EVERY = 3


class Regression(torch.nn.Module):
    """``Linear(64, 64)`` with a mean-squared-error loss, as the Trainer expects (a dict)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": ((self.layer(x) - y) ** 2).mean()}


class Pairs(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """64 fixed random (x, y) pairs."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 64, generator=generator)
        self.y = torch.randn(64, 64, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


def run_trainer(
    output_dir: Path, name: str, registry: optiplug.Registry, *, resume: Path | None = None
) -> Any:
    """Train ``Regression`` with optiplug's ``name`` for :data:`HF_STEPS` steps; return the Trainer.

    Args:
        output_dir: where the Trainer writes its checkpoints.
        name: the algorithm, looked up in ``registry``.
        registry: the registry holding it.
        resume: an earlier run's output directory: resume from its checkpoint
            after :data:`HF_SAVE_EVERY` steps.
    """
    from transformers import Trainer, TrainingArguments

    from optiplug_integrations.transformers import optimizer_cls_and_kwargs

    arguments = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=HF_STEPS,
        per_device_train_batch_size=16,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=HF_SAVE_EVERY,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    # the Trainer calls "the class" with no arguments, then the result with the model
    recipe: Any = optimizer_cls_and_kwargs(name, registry=registry, lr=1e-2)
    trainer = Trainer(
        model=Regression(), args=arguments, train_dataset=Pairs(), optimizer_cls_and_kwargs=recipe
    )
    checkpoint = None if resume is None else str(resume / f"checkpoint-{HF_SAVE_EVERY}")
    trainer.train(resume_from_checkpoint=checkpoint)
    return trainer

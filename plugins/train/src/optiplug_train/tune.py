"""``AutoOptimizer.tune`` on the built-in training job: ``train --tune``, ``--compare --tune-lr``, ``tune``.

The tune sees the run's own model (its seeded initial weights), the first
batches of its training data in the order the run would see them, and a
held-out set drawn from the validation split, so its choice is measured on
the job it is for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from optiplug import AutoOptimizer, Candidate, Registry, Selection

from .config import TrainConfig
from .data import Corpus, Windows, spread, windows
from .loop import seeded_model
from .model import next_token_loss
from .options import DEFAULT_TUNE_BUDGET
from .variants import as_candidate

__all__ = [
    "DEFAULT_TUNE_BUDGET",
    "HELD_OUT_BATCHES",
    "job_loss",
    "run_length_budget",
    "run_hyperparameters",
    "tune_job",
    "tune_lrs",
]

HELD_OUT_BATCHES = 8
"""Batches of validation windows the tune's held-out loss averages."""

_MAX_TRAIN_BATCHES = 256


def job_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training job's loss: next-character cross-entropy of ``model`` on ``batch``."""
    return next_token_loss(model(batch["tokens"]), batch["targets"])


def job_batches(
    config: TrainConfig, corpus: Corpus, train_batches: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Up to ``train_batches`` training batches in a seeded order, and the held-out validation batches."""
    generator = torch.Generator().manual_seed(config.seed)
    loader = torch.utils.data.DataLoader(
        Windows(corpus.train, config.block_size),
        batch_size=config.batch_size,
        shuffle=True,
        drop_last=True,
        generator=generator,
    )
    found: list[dict[str, Any]] = []
    for batch in loader:
        if len(found) >= train_batches:
            break
        found.append({key: value.to(config.device) for key, value in batch.items()})
    rows = spread(windows(corpus.val, config.block_size), HELD_OUT_BATCHES * config.batch_size)
    held_out = [
        {"tokens": chunk[:, :-1].to(config.device), "targets": chunk[:, 1:].to(config.device)}
        for chunk in torch.split(rows, config.batch_size)
    ]
    return found, held_out


def run_length_budget(steps: int) -> int:
    """The budget that gives one candidate's short runs the run's own length.

    A tune spends :attr:`AutoOptimizer.TUNE_RANGE_SHARE <optiplug.AutoOptimizer.TUNE_RANGE_SHARE>` of a candidate's
    steps on its range test and the rest on three short runs, so ``steps``
    per short run takes ``3 * steps / (1 - RANGE_SHARE)`` (5x the run). On the
    training job, short runs of 300 steps (budget 1500) chose lion's lr 1.29e-3
    (the 500-step run: 2.3241), short runs of 500 steps 4.78e-4 (2.0278):
    the lr that wins a short run is not the one that wins a longer run.

    Args:
        steps: the run's optimizer steps.

    Returns:
        That budget, at least :data:`DEFAULT_TUNE_BUDGET`.
    """
    # rounded first: 3 / (1 - 0.4) is 5.000000000000001 in floating point
    return max(
        DEFAULT_TUNE_BUDGET,
        math.ceil(
            round(steps * AutoOptimizer.TUNE_SHORT_RUNS / (1 - AutoOptimizer.TUNE_RANGE_SHARE), 6)
        ),
    )


def run_hyperparameters(hparams: dict[str, Any]) -> tuple[float, tuple[tuple[str, Any], ...]]:
    """A tuned selection's hyperparameters as a run takes them: ``lr``, and the others as pairs.

    Args:
        hparams: the selection's hyperparameters (``lr`` among them).

    Returns:
        ``(lr, ((name, value), ...))`` for ``TrainConfig.lr`` and ``optimizer_params``.
    """
    return float(hparams["lr"]), tuple((k, v) for k, v in hparams.items() if k != "lr")


def tune_job(
    config: TrainConfig,
    corpus: Corpus,
    registry: Registry,
    candidates: Sequence[str | Candidate] | None = None,
    *,
    budget_steps: int = DEFAULT_TUNE_BUDGET,
) -> Selection:
    """Run ``AutoOptimizer.tune`` on the job's model and data.

    Args:
        config: the run (model shape, batch size, seed, device).
        corpus: its corpus.
        registry: where the candidates are looked up.
        candidates: algorithm names; None lets the pretraining rules choose.
        budget_steps: optimizer steps of the whole tune.

    Returns:
        The tuned :class:`~optiplug.Selection`.

    Raises:
        TuneError: the budget is too small for the candidates, or all diverged.
    """
    model = seeded_model(config, corpus).to(config.device)
    train, held_out = job_batches(config, corpus, min(budget_steps, _MAX_TRAIN_BATCHES))
    return AutoOptimizer.tune(
        model,
        job_loss,
        train + held_out,
        candidates=candidates,
        budget_steps=budget_steps,
        held_out=len(held_out),
        seed=config.seed,
        task="causal-lm",
        stage="pretraining",
        registry=registry,
    )


def tune_lrs(
    config: TrainConfig,
    corpus: Corpus,
    registry: Registry,
    names: Sequence[str],
    *,
    budget_steps: int = DEFAULT_TUNE_BUDGET,
) -> dict[str, Selection]:
    """Tune each optimizer of ``names`` alone (its lr only), each with the whole budget.

    Returns:
        ``{name: selection}``; ``selection.hparams`` holds the tuned learning rates.
    """
    return {
        name: tune_job(config, corpus, registry, [as_candidate(name)], budget_steps=budget_steps)
        for name in names
    }

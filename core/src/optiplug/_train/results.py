"""What a run reports: :class:`TrainResult`, or :class:`Skipped` for an optimizer ``--compare`` lacks.

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Skipped", "TrainResult"]


@attrs.frozen
class TrainResult:
    """What one training run measured.

    Attributes:
        optimizer: the algorithm's name.
        hyperparameters: its effective hyperparameters: the registered defaults
            with the run's (lr, betas, ...) over them.
        schedule: the schedule, as text.
        parameters: the model's parameter count.
        start_step: the step the run started from (after a resume).
        steps: the step it ended at.
        initial_val_loss: validation loss (curve subset) at ``start_step``.
        train_loss: loss on a fixed, evenly spaced subset of training windows.
        val_loss: loss on the validation split (up to 4096 windows).
        baseline: unigram entropy of the training split (nats).
        seconds: wall time of the training loop and its evaluations.
        curve: ``(step, training batch loss)`` of every step.
        val_curve: ``(step, validation loss)`` at each evaluation point.
        sample: generated text (after ``prompt``).
        prompt: the sample's prompt.
        saved: where the run saved its checkpoint, or None.
        reason: why ``AutoOptimizer`` chose the optimizer (``--optimizer auto``).
        skipped: steps skipped for a non-finite loss (``--nonfinite skip``).
        grad_norm: the global gradient norm of the last step, before clipping
            (measured only with ``--clip``; None otherwise).
        val_windows: validation windows behind ``val_loss`` (0: not recorded).
        curve_windows: validation windows behind each point of ``val_curve``
            and ``initial_val_loss`` (``--eval-windows``; 0: not recorded).
    """

    optimizer: str
    hyperparameters: dict[str, Any]
    schedule: str
    parameters: int
    start_step: int
    steps: int
    initial_val_loss: float
    train_loss: float
    val_loss: float
    baseline: float
    seconds: float
    curve: tuple[tuple[int, float], ...]
    val_curve: tuple[tuple[int, float], ...]
    sample: str
    prompt: str
    saved: str | None = None
    reason: str = ""
    skipped: int = 0
    grad_norm: float | None = None
    val_windows: int = 0
    curve_windows: int = 0


@attrs.frozen
class Skipped:
    """An optimizer ``--compare`` could not run, and why."""

    name: str
    reason: str

"""What a run reports: :class:`TrainResult`, or :class:`Skipped` for an optimizer ``--compare`` lacks.

A race (``--compare`` with ``--seeds`` or ``--target-loss``) reports a
:class:`RaceResult`: a :class:`RaceRow` of figures and statistics per
optimizer. Importing this module does not import torch.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

__all__ = ["Estimate", "RaceResult", "RaceRow", "Skipped", "TrainResult"]


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
        val_seconds: training seconds (its evaluations left out) from the
            run's start to each point of ``val_curve`` (empty: not recorded).
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
    val_seconds: tuple[float, ...] = ()
    curve_windows: int = 0


@attrs.frozen
class Skipped:
    """An optimizer ``--compare`` could not run, and why."""

    name: str
    reason: str


def _json_float(value: float | None) -> float | None:
    """``value`` for JSON: NaN and infinities (which JSON lacks) become None."""
    return value if value is not None and math.isfinite(value) else None


@attrs.frozen
class Estimate:
    """A mean over seeds and its 95% Student-t confidence interval.

    Attributes:
        mean: the mean of the seeds' values.
        half_width: half the interval's width (NaN for one seed: no interval).
        n: how many seeds.
    """

    mean: float
    half_width: float
    n: int

    def as_json(self) -> dict[str, Any]:
        """``{"mean", "half_width", "n"}`` (``half_width`` None for one seed)."""
        return {"mean": self.mean, "half_width": _json_float(self.half_width), "n": self.n}


@attrs.frozen
class RaceRow:
    """One optimizer of a race: each seed's figures and their statistics.

    Attributes:
        optimizer: the algorithm's name.
        lr: the learning rate every seed used.
        seeds: the seeds, in order.
        val_losses: each seed's final validation loss (whole split).
        steps_to_target: each seed's first validation point at or below the
            target (None where it never got there, or without a target).
        seconds_to_target: each seed's wall time to that step (None likewise).
        val_curves: each seed's ``(step, validation loss)`` points.
        val_loss: the final validation loss over the seeds.
        steps: steps to target over the seeds; None unless every seed reached it.
        seconds: seconds to target over the seeds; None unless every seed reached it.
        p_val_loss: Welch's two-sided p-value of the final validation loss
            against the race's first optimizer (None for the first, or with
            fewer than two seeds).
        p_steps: the same for steps to target (None unless both reached it
            with every seed).
    """

    optimizer: str
    lr: float
    seeds: tuple[int, ...]
    val_losses: tuple[float, ...]
    steps_to_target: tuple[int | None, ...]
    seconds_to_target: tuple[float | None, ...]
    val_curves: tuple[tuple[tuple[int, float], ...], ...]
    val_loss: Estimate
    steps: Estimate | None = None
    seconds: Estimate | None = None
    p_val_loss: float | None = None
    p_steps: float | None = None

    @property
    def missed(self) -> int:
        """How many seeds never reached the target (0 without one)."""
        return sum(step is None for step in self.steps_to_target)

    def as_json(self) -> dict[str, Any]:
        """The row as JSON-ready data (None for what is missing or not finite)."""

        def estimate(value: Estimate | None) -> dict[str, Any] | None:
            return None if value is None else value.as_json()

        return {
            "optimizer": self.optimizer,
            "lr": self.lr,
            "seeds": list(self.seeds),
            "val_losses": list(self.val_losses),
            "steps_to_target": list(self.steps_to_target),
            "seconds_to_target": list(self.seconds_to_target),
            "val_curves": [[list(point) for point in curve] for curve in self.val_curves],
            "val_loss": self.val_loss.as_json(),
            "steps": estimate(self.steps),
            "seconds": estimate(self.seconds),
            "p_val_loss": _json_float(self.p_val_loss),
            "p_steps": _json_float(self.p_steps),
            "missed": self.missed,
        }


@attrs.frozen
class RaceResult:
    """What a race measured: a row per optimizer that ran, and those skipped.

    Attributes:
        target: the validation loss to reach, or None (final losses only).
        seeds: the seeds every optimizer ran with.
        rows: one per optimizer that ran, in ``--compare``'s order; the
            first is the reference of the p-values.
        skipped: the optimizers that could not run, and why.
        eval_every: steps between validation points (the resolution of
            steps to target).
        baseline: the unigram baseline of the training split (nats), or None.
        alpha: the significance threshold the report applies to the p-values.
    """

    target: float | None
    seeds: tuple[int, ...]
    rows: tuple[RaceRow, ...]
    skipped: tuple[Skipped, ...] = ()
    eval_every: int = 1
    baseline: float | None = None
    alpha: float = 0.01

    def as_json(self) -> dict[str, Any]:
        """The race as JSON-ready data: settings, a row per optimizer, the skipped ones."""
        return {
            "target": self.target,
            "seeds": list(self.seeds),
            "eval_every": self.eval_every,
            "baseline": self.baseline,
            "alpha": self.alpha,
            "rows": [row.as_json() for row in self.rows],
            "skipped": [{"name": s.name, "reason": s.reason} for s in self.skipped],
        }

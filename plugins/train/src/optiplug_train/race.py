"""A race: ``--compare A,B --seeds N --target-loss X``, the figures and statistics of its runs.

Each optimizer runs once per seed; per optimizer, the race reports the
steps and the wall time to the target validation loss (the first validation
point at or below it, as AlgoPerf's time-to-target takes the first
evaluation that reaches it) and the final validation loss, each as a mean
with its 95% Student-t interval over the seeds, and Welch's two-sided
t-test against the first optimizer. A difference counts as significant at
p < 0.01, the threshold of the modded-nanogpt speedrun's record rule.

Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from .results import Estimate, RaceResult, RaceRow, Skipped, TrainResult
from .stats import mean_interval, welch

__all__ = [
    "CONFIDENCE",
    "SIGNIFICANCE",
    "race_row",
    "seconds_to_target",
    "steps_to_target",
    "summarize",
]

CONFIDENCE = 0.95
"""The level of the intervals."""
SIGNIFICANCE = 0.01
"""A p-value below this is reported as significant (the speedrun's threshold)."""


def steps_to_target(result: TrainResult, target: float) -> int | None:
    """The step of the first validation point of ``result`` at or below ``target``.

    Args:
        result: a run.
        target: the validation loss to reach (nats per character).

    Returns:
        That step, or None when no validation point got there.
    """
    return next((step for step, loss in result.val_curve if loss <= target), None)


def seconds_to_target(result: TrainResult, step: int) -> float:
    """The training time ``result`` took to reach ``step``, evaluations left out.

    Measured at each validation point (AlgoPerf's time to target also
    leaves evaluation out); a run that recorded no times (one saved by an
    older version) spreads its total time evenly over its steps.

    Args:
        result: a run.
        step: a step of it (one of its validation points).

    Returns:
        Seconds from the run's start to ``step``.
    """
    if len(result.val_seconds) == len(result.val_curve):
        for (point, _), seconds in zip(result.val_curve, result.val_seconds, strict=True):
            if point == step:
                return seconds
    done = result.steps - result.start_step
    return result.seconds * (step - result.start_step) / done if done > 0 else 0.0


def _estimate(values: Sequence[float]) -> Estimate:
    mean, half_width = mean_interval(values, CONFIDENCE)
    return Estimate(mean=mean, half_width=half_width, n=len(values))


def race_row(
    name: str, runs: Sequence[TrainResult], seeds: Sequence[int], target: float | None
) -> RaceRow:
    """One optimizer's figures over its seeds, without p-values.

    Args:
        name: the optimizer.
        runs: one run per seed, in the seeds' order.
        seeds: the seeds.
        target: the validation loss to reach, or None.

    Returns:
        The row; ``steps`` and ``seconds`` only when every seed reached ``target``.
    """
    steps = [None if target is None else steps_to_target(run, target) for run in runs]
    seconds = [
        None if step is None else seconds_to_target(run, step)
        for run, step in zip(runs, steps, strict=True)
    ]
    reached = target is not None and all(step is not None for step in steps)
    return RaceRow(
        optimizer=name,
        lr=float(runs[0].hyperparameters["lr"]),
        seeds=tuple(seeds),
        val_losses=tuple(run.val_loss for run in runs),
        steps_to_target=tuple(steps),
        seconds_to_target=tuple(seconds),
        val_curves=tuple(run.val_curve for run in runs),
        val_loss=_estimate([run.val_loss for run in runs]),
        steps=_estimate([float(s) for s in steps if s is not None]) if reached else None,
        seconds=_estimate([s for s in seconds if s is not None]) if reached else None,
    )


def _p_value(a: Sequence[float | int | None], b: Sequence[float | int | None]) -> float | None:
    """Welch's two-sided p of two samples; None if either has a gap or fewer than two values."""
    if len(a) < 2 or len(b) < 2 or None in a or None in b:
        return None
    return welch([float(v) for v in a if v is not None], [float(v) for v in b if v is not None]).p


def summarize(
    runs: Mapping[str, Sequence[TrainResult]],
    *,
    seeds: Sequence[int],
    target: float | None,
    skipped: Sequence[Skipped] = (),
    eval_every: int = 1,
) -> RaceResult:
    """The race's result: a row per optimizer, p-values against the first.

    Args:
        runs: ``{optimizer: one run per seed}``, in ``--compare``'s order.
        seeds: the seeds, in the runs' order.
        target: the validation loss to reach, or None.
        skipped: the optimizers that could not run.
        eval_every: steps between validation points.

    Returns:
        The :class:`RaceResult`.
    """
    rows = [race_row(name, found, seeds, target) for name, found in runs.items()]
    if rows:
        first = rows[0]
        rows[1:] = [
            attrs.evolve(
                row,
                p_val_loss=_p_value(first.val_losses, row.val_losses),
                p_steps=_p_value(first.steps_to_target, row.steps_to_target),
            )
            for row in rows[1:]
        ]
    baseline = next((found[0].baseline for found in runs.values() if found), None)
    return RaceResult(
        target=target,
        seeds=tuple(seeds),
        rows=tuple(rows),
        skipped=tuple(skipped),
        eval_every=eval_every,
        baseline=baseline,
        alpha=SIGNIFICANCE,
    )

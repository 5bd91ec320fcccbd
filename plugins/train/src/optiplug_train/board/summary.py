"""The board from the records: per optimizer and workload, its figures and its test against AdamW.

For each optimizer and workload the chosen lr is the one whose seed-0 run
did best (reached the target in fewest steps, else the lowest final
metric; diverged and failed runs last); the row gathers every seed at that
lr. Steps and seconds to target are means with 95% Student-t intervals
(over the seeds, when every seed reached the target), and the p-value is
Welch's two-sided test against AdamW's row on the same workload: on the
steps to target when both rows reached it on every seed, else on the final
metric. The statistics are ``optiplug train --compare``'s own
(:mod:`optiplug_train.stats`, at :data:`optiplug_train.race.CONFIDENCE`).

Importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..race import CONFIDENCE, SIGNIFICANCE
from ..results import Estimate
from ..stats import mean_interval, welch

__all__ = ["BASELINE", "SIGNIFICANCE", "Row", "rank_rows", "rows_of", "robustness"]

BASELINE = "adamw"
_ORDER = {"reached": 0, "not reached": 1, "diverged": 2, "failed": 3}


@attrs.frozen
class Row:
    """One optimizer on one workload, over its seeds at its chosen lr.

    Attributes:
        optimizer: the catalogue name.
        workload: the workload.
        lr: the chosen lr (None: the optimizer takes none).
        seeds: the seeds measured at it.
        status: ``reached`` (every seed), ``not reached``, ``diverged`` or ``failed``.
        reason: why, for a diverged or failed row (its first seed's reason).
        steps: steps to target (mean, 95% half-width, n), when every seed reached it.
        seconds: seconds to target, likewise.
        final: the final validation metric (None when no seed finished).
        p: Welch's two-sided p against AdamW (None: too few seeds, or AdamW's own row).
        p_on: what ``p`` compares: ``"steps"`` or ``"final"``.
        steps_ratio: mean steps to target over AdamW's (None unless both reached).
    """

    optimizer: str
    workload: str
    lr: float | None
    seeds: tuple[int, ...]
    status: str
    reason: str
    steps: Estimate | None
    seconds: Estimate | None
    final: Estimate | None
    p: float | None = None
    p_on: str = ""
    steps_ratio: float | None = None


def _estimate(values: Sequence[float]) -> Estimate | None:
    if not values:
        return None
    mean, half_width = mean_interval(values, CONFIDENCE)
    return Estimate(mean=mean, half_width=half_width, n=len(values))


def _merit(record: Mapping[str, Any]) -> tuple[int, float, float]:
    steps = record["steps_to_target"]
    final = record["final_metric"]
    return (
        _ORDER[record["status"]],
        math.inf if steps is None else float(steps),
        math.inf if final is None else float(final),
    )


def _status(records: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    statuses = [r["status"] for r in records]
    worst = max(records, key=lambda r: _ORDER[r["status"]])
    if "failed" in statuses or all(s == "reached" for s in statuses):
        return worst["status"], worst["reason"]
    status = "diverged" if "diverged" in statuses else "not reached"
    return status, next(r["reason"] for r in records if r["status"] == status)


def _row(optimizer: str, workload: str, records: Sequence[Mapping[str, Any]]) -> Row:
    chosen = min((r for r in records if r["seed"] == min(x["seed"] for x in records)), key=_merit)
    at_lr = sorted((r for r in records if r["lr"] == chosen["lr"]), key=lambda r: r["seed"])
    status, reason = _status(at_lr)
    reached = status == "reached"
    finals = [float(r["final_metric"]) for r in at_lr if r["final_metric"] is not None]
    return Row(
        optimizer=optimizer,
        workload=workload,
        lr=chosen["lr"],
        seeds=tuple(r["seed"] for r in at_lr),
        status=status,
        reason=reason,
        steps=_estimate([float(r["steps_to_target"]) for r in at_lr]) if reached else None,
        seconds=_estimate([float(r["seconds_to_target"]) for r in at_lr]) if reached else None,
        final=_estimate(finals) if len(finals) == len(at_lr) else None,
    )


def _samples(
    row: Row, records: Mapping[tuple[str, str], list[Mapping[str, Any]]]
) -> dict[str, list[float]]:
    at_lr = [r for r in records[(row.optimizer, row.workload)] if r["lr"] == row.lr]
    return {
        "steps": [float(r["steps_to_target"]) for r in at_lr if r["steps_to_target"] is not None]
        if row.status == "reached"
        else [],
        "final": [float(r["final_metric"]) for r in at_lr if r["final_metric"] is not None],
    }


def _against(
    row: Row, base: Row | None, grouped: Mapping[tuple[str, str], list[Mapping[str, Any]]]
) -> Row:
    if base is None or row.optimizer == base.optimizer:
        return row
    ratio = None
    if row.steps is not None and base.steps is not None and base.steps.mean > 0:
        ratio = row.steps.mean / base.steps.mean
    mine, theirs = _samples(row, grouped), _samples(base, grouped)
    on = "steps" if mine["steps"] and theirs["steps"] else "final"
    p = None
    if len(mine[on]) >= 2 and len(theirs[on]) >= 2:
        p = welch(mine[on], theirs[on]).p
    return attrs.evolve(row, p=p, p_on=on if p is not None else "", steps_ratio=ratio)


def rows_of(records: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Every optimizer's row on every workload it ran, tested against AdamW's.

    Args:
        records: the results file's records (headers are skipped; a later run
            record of the same key replaces an earlier one).

    Returns:
        The rows, ranked within each workload by :func:`rank_rows`.
    """
    latest: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for record in records:
        if record.get("kind") == "run":
            latest[(record["optimizer"], record["workload"], record["lr"], record["seed"])] = record
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for record in latest.values():
        grouped[(record["optimizer"], record["workload"])].append(record)
    rows = [_row(o, w, found) for (o, w), found in grouped.items()]
    bases = {row.workload: row for row in rows if row.optimizer == BASELINE}
    return rank_rows([_against(row, bases.get(row.workload), grouped) for row in rows])


def _rank_key(row: Row) -> tuple[str, int, float, float, str]:
    steps = math.inf if row.steps is None else row.steps.mean
    final = math.inf if row.final is None else row.final.mean
    return (row.workload, _ORDER[row.status], steps, final, row.optimizer)


def rank_rows(rows: Iterable[Row]) -> list[Row]:
    """Rows by workload, then status (reached first), steps to target, final metric, name."""
    return sorted(rows, key=_rank_key)


def robustness(rows: Iterable[Row]) -> list[tuple[str, int, int, float]]:
    """Per optimizer: workloads reached, workloads run, and its mean rank fraction.

    The rank fraction of a row is its place in its workload's ranking over
    the number of rows there (0 is first); lower is better.

    Returns:
        ``(optimizer, reached, run, mean rank fraction)``, most robust first.
    """
    by_workload: dict[str, list[Row]] = defaultdict(list)
    for row in rank_rows(rows):
        by_workload[row.workload].append(row)
    places: dict[str, list[float]] = defaultdict(list)
    reached: dict[str, int] = defaultdict(int)
    for ranked in by_workload.values():
        for place, row in enumerate(ranked):
            places[row.optimizer].append(place / len(ranked))
            reached[row.optimizer] += row.status == "reached"
    table = [(o, reached[o], len(p), math.fsum(p) / len(p)) for o, p in places.items()]
    return sorted(table, key=lambda t: (-t[1], t[3], t[0]))

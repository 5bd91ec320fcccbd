"""The board's rows as AutoOptimizer's evidence: :class:`optiplug.Measurement` records.

Importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from optiplug import Measurement

from .results import read_records
from .summary import BASELINE, Row, rows_of

__all__ = ["board_evidence", "measurements", "write_evidence"]


def _measurement(row: Row, base: Row | None) -> Measurement:
    return Measurement(
        optimizer=row.optimizer,
        workload=row.workload,
        status=row.status,
        seeds=len(row.seeds),
        steps_ratio=row.steps_ratio,
        p=row.p,
        p_on=row.p_on,
        final=None if row.final is None else row.final.mean,
        adamw_final=None if base is None or base.final is None else base.final.mean,
    )


def measurements(records: Iterable[Mapping[str, Any]]) -> list[Measurement]:
    """Every row of the board of ``records`` as a measurement against AdamW's row."""
    rows = rows_of(records)
    bases = {row.workload: row for row in rows if row.optimizer == BASELINE}
    return [_measurement(row, bases.get(row.workload)) for row in rows]


def board_evidence(results: str | os.PathLike[str]) -> list[Measurement]:
    """The measurements of a leaderboard results file, for ``AutoOptimizer.explain(evidence=...)``.

    Args:
        results: a JSON-lines file written by ``optiplug leaderboard``.

    Returns:
        One measurement per optimizer and workload.
    """
    return measurements(read_records(results))


board_evidence.__module__ = "optiplug_train"


def write_evidence(records: Iterable[Mapping[str, Any]], path: Path) -> None:
    """Write the measurements of ``records`` as an evidence JSON file."""
    payload = {"measurements": [m.as_json() for m in measurements(records)]}
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")

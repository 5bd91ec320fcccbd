"""``optiplug leaderboard``: run a tier of the board, then show where the entries stand.

Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import math
import sys

from optiplug.cli import format_table
from optiplug.errors import OptiplugError

from .summary import Row

__all__ = ["configure", "run"]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``leaderboard`` command's arguments to ``parser``."""
    add = parser.add_argument
    add("--only", type=_names, default=[], metavar="NAME[,NAME]", help="run only these optimizers")
    add(
        "--provider",
        default=None,
        metavar="P",
        help="run only the optimizers of plugin or distribution P",
    )
    add(
        "--tier",
        choices=("smoke", "ranked"),
        default="smoke",
        help="smoke: lr sweep, one seed; ranked: --seeds seeds at the chosen lr (default: smoke)",
    )
    add(
        "--results",
        default="leaderboard.jsonl",
        metavar="FILE",
        help="the JSON-lines results file to append to and resume from (default: leaderboard.jsonl)",
    )
    add(
        "--workloads",
        type=_names,
        default=[],
        metavar="W[,W]",
        help="char-lm, digits, diabetes, logistic (default: all)",
    )
    add(
        "--lrs",
        type=int,
        default=4,
        help="lr values per entry in the smoke tier, a decade apart from 0.1x the default lr (default: 4)",
    )
    add("--seeds", type=int, default=5, help="seeds per entry in the ranked tier (default: 5)")
    add("--top", type=int, default=20, help="entries in the ranked tier (default: 20)")
    add("--steps", type=int, default=None, help="cap every workload's step budget (a quick check)")
    add("--jobs", type=int, default=1, help="parallel worker processes (default: 1)")
    add(
        "--against",
        choices=("published", "results"),
        default="published",
        help="place the entries among the published board and these results (default), or these results alone",
    )
    add("--quiet", action="store_true", help="no progress lines")


def _estimate(value: object) -> str:
    mean, half = getattr(value, "mean", None), getattr(value, "half_width", math.nan)
    if mean is None:
        return "-"
    return f"{mean:.4g}" if math.isnan(half) else f"{mean:.4g} ± {half:.2g}"


def table(rows: list[Row], mark: set[str]) -> str:
    """A workload's rows as an aligned table; names in ``mark`` get a ``*``."""
    body = [
        [
            str(place),
            row.optimizer + (" *" if row.optimizer in mark else ""),
            "-" if row.lr is None else f"{row.lr:.3g}",
            str(len(row.seeds)),
            row.status,
            _estimate(row.steps),
            _estimate(row.seconds),
            _estimate(row.final),
            "-" if row.p is None else f"{row.p:.3g}",
        ]
        for place, row in enumerate(rows, 1)
    ]
    head = [
        "#",
        "optimizer",
        "lr",
        "seeds",
        "status",
        "steps to target",
        "s to target",
        "final",
        "p vs adamw",
    ]
    return format_table(head, body)


def run(args: argparse.Namespace) -> int:
    """Run the tier, then print each workload's board with the entries run marked."""
    from .board import Board, leaderboard, published_records  # deferred: imports torch

    try:
        board = leaderboard(
            only=args.only, provider=args.provider, tier=args.tier, results=args.results,
            workloads=args.workloads, lrs=args.lrs, seeds=args.seeds, top=args.top,
            steps=args.steps, jobs=args.jobs, registry=args.registry,
            stream=None if args.quiet else sys.stderr,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(
            f"interrupted; what finished is in {args.results}: run the same command to resume",
            file=sys.stderr,
        )
        return 130
    # marked: what --only/--provider selected, under the catalogue names its records carry
    # (``acme:acme_sgd`` on the command line is recorded as ``acme_sgd`` where that is unique)
    mine = {r["optimizer"] for r in board.records if r.get("kind") == "run"}
    mark = mine if args.only or args.provider else set()
    if args.against == "published":
        own = {
            (r.get("optimizer"), r.get("workload"), r.get("lr"), r.get("seed"))
            for r in board.records
        }
        kept = [
            r
            for r in published_records()
            if (r.get("optimizer"), r.get("workload"), r.get("lr"), r.get("seed")) not in own
        ]
        board = Board.from_records([*kept, *board.records])
    for name in args.workloads or sorted({row.workload for row in board.rows}, key=_order):
        rows = board.workload(name)
        if not rows:
            continue
        placed = [
            f"{row.optimizer}: {i} of {len(rows)}"
            for i, row in enumerate(rows, 1)
            if row.optimizer in mark
        ]
        print(f"\n{name}" + (f" ({'; '.join(placed)})" if placed else ""))
        print(table(rows[:10] + [r for r in rows[10:] if r.optimizer in mark], mark))
    if not board.rows:
        raise OptiplugError("no runs: nothing was selected")
    return 0


def _order(name: str) -> int:
    from .workloads import WORKLOADS  # deferred: imports torch

    return list(WORKLOADS).index(name) if name in WORKLOADS else len(WORKLOADS)

"""``optiplug auto``: the AutoOptimizer selection and its explanation."""

from __future__ import annotations

import argparse
import json
from typing import Any

import attrs

from .._auto.selection import AutoOptimizer
from .._core.selection import Selection

__all__ = ["configure_auto", "run_auto", "selection_to_dict"]


def configure_auto(parser: argparse.ArgumentParser) -> None:
    """Add the ``auto`` command's arguments."""
    parser.add_argument("--task", help="task name, e.g. text-classification or causal-lm")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", help="HF-style config.json (or a directory holding one)")
    source.add_argument("--params", type=int, help="parameter count N")
    parser.add_argument("--stage", choices=["pretraining", "finetuning"])
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def selection_to_dict(selection: Selection) -> dict[str, Any]:
    """A JSON-ready view of a selection and every candidate.

    Args:
        selection: what ``AutoOptimizer`` chose.

    Returns:
        The choice, its schedule, the reason, the request and every candidate.
    """
    schedule = selection.schedule
    candidates = []
    for report in selection.candidates:
        candidate, info = report.candidate, report.candidate.provider
        candidates.append(
            {
                "algorithm": candidate.algorithm,
                "hparams": candidate.hparams,
                "score": candidate.score,
                "rule": candidate.rule,
                "reason": candidate.reason,
                "plugin": info.plugin if info else None,
                "distribution": info.distribution if info else None,
                "version": info.version if info else None,
                "status": report.status,
                "note": report.note,
            }
        )
    request = attrs.asdict(selection.request)
    request.pop("config", None)
    return {
        "optimizer": selection.optimizer,
        "hparams": selection.hparams,
        "schedule": schedule.to_dict() if hasattr(schedule, "to_dict") else schedule,
        "reason": selection.reason,
        "request": request,
        "candidates": candidates,
    }


def run_auto(args: argparse.Namespace) -> int:
    """Print the selection for the given task/config/size.

    Args:
        args: the parsed arguments (``task``, ``config``, ``params``, ``stage``,
            ``json``, ``registry``).

    Returns:
        0.

    Raises:
        OptiplugError: an unreadable config, or no rule proposed an installed optimizer.
    """
    selection = AutoOptimizer.for_task(
        args.task,
        args.config,
        num_parameters=args.params,
        stage=args.stage,
        registry=args.registry,
    )
    if args.json:
        print(json.dumps(selection_to_dict(selection), indent=2, default=str))
    else:
        print(selection.explain())
    return 0

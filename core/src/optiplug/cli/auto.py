"""``optiplug auto``: the AutoOptimizer selection and its explanation."""

from __future__ import annotations

import argparse
import json
from typing import Any

import attrs

from .._auto.model_config import checked_task, parse_parameter_count
from .._auto.selection import AutoOptimizer
from .._core.selection import MemoryOption, MemoryPlan, Selection
from .listing import read_negative_values

__all__ = ["configure_auto", "run_auto", "selection_to_dict"]


def configure_auto(parser: argparse.ArgumentParser) -> None:
    """Add the ``auto`` command's arguments.

    A value that starts with a dash and a digit (``--memory-budget -1GB``,
    ``--params -4M``) is read as the option's value, which its parser then
    refuses as not positive, rather than as an unknown option.

    Args:
        parser: the ``auto`` subcommand's parser.
    """
    read_negative_values(parser)
    parser.add_argument("--task", help="task name, e.g. text-classification or causal-lm")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", help="HF-style config.json (or a directory holding one)")
    source.add_argument(
        "--params",
        help="parameter count N, a whole number from 1 to 1e300: 7e9, 7B, 125M, 1.3b, 350k "
        "or 7,000,000 (commas between groups of three digits only)",
    )
    parser.add_argument("--stage", choices=["pretraining", "finetuning"])
    parser.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help=(
            "memory per device for parameters, gradients and optimizer state (activations "
            "not counted), a finite positive size: 24GB (1e9 bytes), 80GiB (2**30 bytes), "
            "512MB or bytes; needs --config or --params"
        ),
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def selection_to_dict(selection: Selection) -> dict[str, Any]:
    """A JSON-ready view of a selection and every candidate.

    Args:
        selection: what ``AutoOptimizer`` chose.

    Returns:
        The choice, its schedule, the reason, the request, every candidate
        and the memory plan (bytes; None without a budget).
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
    memory = selection.memory
    return {
        "optimizer": selection.optimizer,
        "hparams": selection.hparams,
        "schedule": schedule.to_dict() if hasattr(schedule, "to_dict") else schedule,
        "reason": selection.reason,
        "request": request,
        "candidates": candidates,
        "memory": None if memory is None else _memory_to_dict(memory),
    }


def _memory_to_dict(plan: MemoryPlan) -> dict[str, Any]:
    """A memory plan as JSON-ready data, each option with its ``total`` bytes."""
    data = attrs.asdict(plan, recurse=False)
    for key in ("chosen", "compact"):
        data[key] = _option_to_dict(data[key])
    data["tried"] = [_option_to_dict(option) for option in plan.tried]
    data["notes"] = list(plan.notes)
    return data


def _option_to_dict(option: MemoryOption | None) -> dict[str, Any] | None:
    if option is None:
        return None
    return {**attrs.asdict(option), "total": option.total}


def run_auto(args: argparse.Namespace) -> int:
    """Print the selection for the given task/config/size.

    Args:
        args: the parsed arguments (``task``, ``config``, ``params``, ``stage``,
            ``memory_budget``, ``json``, ``registry``).

    Returns:
        0.

    Raises:
        OptiplugError: an unknown task (with a did-you-mean), a bad ``--params``
            or ``--memory-budget`` (or a budget without a size), an unreadable
            config, or no rule proposed an installed optimizer.
    """
    task = checked_task(args.task)  # a typo is refused, not sent to the size rules
    count = parse_parameter_count(args.params) if args.params is not None else None
    selection = AutoOptimizer.for_task(
        task,
        args.config,
        num_parameters=count,
        stage=args.stage,
        registry=args.registry,
        memory_budget=args.memory_budget,
    )
    if args.json:
        print(json.dumps(selection_to_dict(selection), indent=2, default=str))
    else:
        print(selection.explain())
    return 0

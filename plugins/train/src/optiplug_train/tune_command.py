"""``optiplug tune``: ``AutoOptimizer.tune`` on the built-in training job, as a table.

It measures on the model and data ``optiplug train`` would use with the same
options, and prints every candidate's tuned lr and held-out loss; ``--plot``
draws the range tests. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from optiplug import Registry, Selection
from optiplug.cli import check_plot_path
from optiplug.errors import OptiplugError

from .config import TrainConfig
from .options import add_model_options, add_tune_budget, given_options

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``tune`` command's arguments to ``parser``.

    Args:
        parser: the ``tune`` subcommand's parser.
    """
    parser.add_argument(
        "--candidates",
        metavar="A,B,C",
        help="optimizers to measure (default: those the pretraining rules rank highest, "
        "one per 750 budget steps, at most 3)",
    )
    add_tune_budget(parser)
    parser.add_argument("--plot", metavar="PATH", help="draw the range tests (loss vs lr)")
    parser.add_argument("--json", action="store_true", help="print the trials as JSON")
    job = parser.add_argument_group("the training job (as optiplug train)")
    job.add_argument("--seed", type=int, help="seed of weights, batches and trials (default: 0)")
    job.add_argument("--device", help="torch device (default: cpu)")
    job.add_argument("--threads", type=int, metavar="N", help="torch threads")
    add_model_options(parser)


def _candidates(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or len(set(names)) != len(names):
        raise OptiplugError(f"--candidates {text!r}: expected distinct names, e.g. adamw,lion,muon")
    return names


def trials_json(selection: Selection) -> dict[str, Any]:
    """The tune as JSON-ready data: the winner and every trial (``null`` for a diverged loss)."""
    tuning = selection.tuning
    if tuning is None:
        raise OptiplugError("the selection carries no tuning")

    def finite(value: float | None) -> float | None:
        return value if value is not None and math.isfinite(value) else None

    return {
        "chosen": selection.name,
        "hparams": {k: v for k, v in selection.hparams.items() if isinstance(v, (int, float))},
        "lr_rule": tuning.lr_rule,
        "budget_steps": tuning.budget_steps,
        "seed": tuning.seed,
        "trials": [
            {
                "algorithm": t.algorithm,
                "lr": t.lr,
                "lr_steepest": t.lr_steepest,
                "lr_at_min": t.lr_at_min,
                "held_out_loss": finite(t.held_out_loss),
                "steps": t.steps,
                "note": t.note,
            }
            for t in tuning.trials
        ],
    }


def run(args: argparse.Namespace) -> int:
    """Run ``optiplug tune``: measure the candidates on the training job and print the table.

    Args:
        args: the parsed arguments; ``args.registry`` is where optimizers are looked up.

    Returns:
        0 on success.

    Raises:
        OptiplugError: bad options, an unknown optimizer, a ``--plot`` path
            that could not be written (refused before tuning), a budget too
            small for the candidates, or every candidate diverged.
    """
    from .data import load_corpus  # deferred: imports torch
    from .launch import torch_threads  # deferred: imports torch
    from .loop import check_run  # deferred: imports torch
    from .tune import tune_job  # deferred: imports torch

    registry: Registry = args.registry
    config = TrainConfig(**given_options(args))
    candidates = _candidates(args.candidates)
    for name in candidates or ():
        registry.spec(name)
    if args.plot:
        check_plot_path(args.plot)
    corpus = load_corpus(config.data, config.max_chars)
    check_run(config, corpus)
    with torch_threads(config.threads):
        selection = tune_job(config, corpus, registry, candidates, budget_steps=args.tune_budget)
    if args.json:
        print(json.dumps(trials_json(selection), indent=2))
    else:
        print(selection.explain())
    if args.plot:
        selection.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0

"""``optiplug train``'s arguments, and the :class:`~optiplug_train.config.TrainConfig` they give.

Importing this module does not import torch (``optiplug --help`` builds every
command's arguments).
"""

from __future__ import annotations

import argparse
from typing import Any

from optiplug.cli import parse_param
from optiplug.errors import OptiplugError
from optiplug.validators import STATE_PRECISIONS

from .config import (
    NONFINITE_POLICIES,
    PARALLEL_MODES,
    RESUMABLE_FIELDS,
    OptionError,
    TrainConfig,
    as_typed,
    option_name,
    read_run_file,
)

__all__ = [
    "DEFAULT_PLOT",
    "DEFAULT_TUNE_BUDGET",
    "MAX_SEEDS",
    "add_tune_budget",
    "check_seeds",
    "config_from_args",
    "configure",
]

DEFAULT_PLOT = "optiplug-compare.png"
DEFAULT_TUNE_BUDGET = 1500
"""Optimizer steps of ``--tune``/``--tune-lr``/``optiplug tune``, all candidates together."""
MAX_SEEDS = 100
"""The most seeds ``--seeds N`` races over (a larger N is refused before anything runs).

A race trains every optimizer once per seed, one after the other:
``--seeds N`` over K optimizers is N x K full trainings. At 100 seeds a
mean's 95% interval is already about a twelfth as wide as at 3 (Student's
t over the square root of N), and the race takes hours on a CPU; a mistyped
``--seeds 1000000`` (two million trainings for two optimizers) is an error,
not a start.
"""


def check_seeds(seeds: Any) -> None:
    """Refuse a ``--seeds`` count that is not an integer from 1 to :data:`MAX_SEEDS`.

    Args:
        seeds: the count (``--seeds N``: how many seeds a race trains each optimizer on).

    Raises:
        OptionError: naming ``--seeds``, the value and the bound.
    """
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise OptionError("seeds", seeds, "must be an integer >= 1")
    if seeds > MAX_SEEDS:
        raise OptionError(
            "seeds",
            seeds,
            f"is more than {MAX_SEEDS}, the most seeds a race takes "
            "(each seed trains every optimizer of --compare once)",
        )


_FIELDS = {
    "steps": "steps",
    "batch_size": "batch_size",
    "block_size": "block_size",
    "layers": "n_layer",
    "d_model": "d_model",
    "heads": "n_head",
    "optimizer": "optimizer",
    "lr": "lr",
    "impl": "impl",
    "schedule": "schedule",
    "schedule_param": "schedule_params",
    "warmup": "warmup_steps",
    "seed": "seed",
    "device": "device",
    "data": "data",
    "max_chars": "max_chars",
    "eval_every": "eval_every",
    "eval_windows": "eval_windows",
    "sample_chars": "sample_chars",
    "temperature": "temperature",
    "prompt": "prompt",
    "save": "save",
    "save_every": "save_every",
    "resume": "resume",
    "stop_at": "stop_at",
    "nproc": "nproc",
    "threads": "threads",
    "nonfinite": "nonfinite",
    "clip": "clip",
    "parallel": "parallel",
}
"""Command-line destination -> :class:`~optiplug_train.config.TrainConfig` field."""


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("optimizer and schedule")
    run.add_argument(
        "--optimizer",
        metavar="NAME",
        help="'auto' (AutoOptimizer for causal-LM pretraining) or an installed optimizer "
        "(default: adamw)",
    )
    run.add_argument("--lr", type=float, help="base learning rate (default: the optimizer's own)")
    run.add_argument("--impl", help="force an implementation (loop, foreach, fused...)")
    run.add_argument(
        "--state-precision",
        choices=STATE_PRECISIONS,
        help="store the optimizer's per-element state in fp32 (default), bf16, int8 or int4 "
        "(adamw, adam, sgd, lion, muon)",
    )
    run.add_argument("--schedule", metavar="NAME", help="schedule name (default: cosine)")
    run.add_argument(
        "--schedule-param",
        type=parse_param,
        action="append",
        metavar="KEY=VALUE",
        help="extra schedule parameter (repeatable); total_steps and warmup_steps are filled in",
    )
    run.add_argument(
        "--clip",
        type=float,
        metavar="MAX_NORM",
        help="clip the global gradient norm (L2) to MAX_NORM before every step (default: off)",
    )
    run.add_argument("--warmup", type=int, metavar="N", help="warm-up steps (default: steps/20)")
    run.add_argument("--steps", type=int, metavar="N", help="optimizer steps (default: 500)")
    run.add_argument("--seed", type=int, help="seed of weights, data order and sample (default: 0)")
    run.add_argument("--device", help="torch device (default: cpu)")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Add the data and model options (``--data`` ... ``--heads``) to ``parser``."""
    model = parser.add_argument_group("data and model")
    model.add_argument(
        "--data", metavar="PATH", help="a text file or directory (default: the standard library)"
    )
    model.add_argument(
        "--max-chars",
        type=int,
        metavar="N",
        help="character budget of the corpus (default: 1500000)",
    )
    model.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="windows per optimizer step, over all processes (default: 32)",
    )
    model.add_argument(
        "--block-size", type=int, metavar="N", help="characters of context (default: 64)"
    )
    model.add_argument("--layers", type=int, metavar="N", help="transformer blocks (default: 3)")
    model.add_argument("--d-model", type=int, metavar="N", help="embedding width (default: 96)")
    model.add_argument("--heads", type=int, metavar="N", help="attention heads (default: 4)")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("evaluation and output")
    output.add_argument(
        "--eval-every", type=int, metavar="N", help="validation every N steps (default: steps/10)"
    )
    output.add_argument(
        "--eval-windows",
        type=int,
        metavar="N",
        help="validation windows per curve point (default: 256)",
    )
    output.add_argument(
        "--sample-chars",
        type=int,
        metavar="N",
        help="characters to generate at the end (default: 200)",
    )
    output.add_argument(
        "--temperature", type=float, help="sampling temperature, 0 = greedy (default: 0.8)"
    )
    output.add_argument("--prompt", help="the sample's prompt (default: 'def ')")
    output.add_argument("--quiet", action="store_true", help="log lines, no progress bar")
    output.add_argument(
        "--compare",
        metavar="A,B,C",
        help="train each optimizer (NAME or NAME=LR, separated by commas, none empty) on "
        "identical data and plot the losses",
    )
    output.add_argument(
        "--seeds",
        type=int,
        metavar="N",
        help=f"with --compare: race each optimizer over N seeds (--seed, --seed + 1, ...; "
        f"1 to {MAX_SEEDS}) and report means, 95%% intervals and Welch's t-test against the first",
    )
    output.add_argument(
        "--target-loss",
        type=float,
        metavar="LOSS",
        help="with --compare: also report the steps and seconds each run took to reach this "
        "validation loss",
    )
    output.add_argument(
        "--plot", metavar="PATH", help=f"--compare's plot (default: {DEFAULT_PLOT})"
    )


def _add_process_options(parser: argparse.ArgumentParser) -> None:
    process = parser.add_argument_group("checkpoints and processes")
    process.add_argument("--save", metavar="DIR", help="save the run to DIR at the end")
    process.add_argument("--save-every", type=int, metavar="N", help="also save every N steps")
    process.add_argument("--resume", metavar="DIR", help="resume a run saved with --save")
    process.add_argument(
        "--stop-at",
        type=int,
        metavar="STEP",
        help="stop at STEP, keeping the schedule over --steps",
    )
    process.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="N processes (torch.distributed, gloo); each takes batch-size/N windows",
    )
    process.add_argument(
        "--parallel",
        choices=PARALLEL_MODES,
        help="ddp: every process holds the whole model (default); fsdp: each holds a shard of "
        "the parameters, gradients and optimizer state (FSDP2; one process or --nproc N)",
    )
    process.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch threads per process (default: torch's own; 1 is often faster on a busy machine)",
    )
    process.add_argument(
        "--nonfinite",
        choices=NONFINITE_POLICIES,
        help="on a NaN or inf loss: stop the run, keeping the last good checkpoint (default), "
        "or skip that batch's update",
    )


def add_tune_budget(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, run_length: bool = False
) -> None:
    """Add ``--tune-budget`` (optimizer steps of a tune, all candidates together).

    Args:
        parser: where to add it.
        run_length: the command knows the run's ``--steps`` (``train``): the
            default is then None, resolved per run by the caller.
    """
    default = (
        f"5 x --steps per optimizer whose lr is tuned, so each short run is as long as the "
        f"run, at least {DEFAULT_TUNE_BUDGET}; {DEFAULT_TUNE_BUDGET} for --optimizer auto"
        if run_length
        else str(DEFAULT_TUNE_BUDGET)
    )
    parser.add_argument(
        "--tune-budget",
        type=int,
        metavar="STEPS",
        default=None if run_length else DEFAULT_TUNE_BUDGET,
        help=f"optimizer steps of the tune, all candidates together (default: {default})",
    )


def _add_tune_options(parser: argparse.ArgumentParser) -> None:
    tune = parser.add_argument_group("measuring the optimizer (AutoOptimizer.tune)")
    tune.add_argument(
        "--tune",
        action="store_true",
        help="before training, measure: with --optimizer auto, the candidates the rules rank "
        "highest; with a named optimizer, its lr (LR range test and a short run each)",
    )
    tune.add_argument(
        "--tune-lr",
        action="store_true",
        help="with --compare: tune each optimizer's lr first (those given as NAME=LR keep theirs)",
    )
    add_tune_budget(tune, run_length=True)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` command's arguments to ``parser``.

    Args:
        parser: the ``train`` subcommand's parser.
    """
    _add_run_options(parser)
    _add_tune_options(parser)
    add_model_options(parser)
    _add_output_options(parser)
    _add_process_options(parser)


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``TrainConfig`` fields the parsed ``args`` set (options not given, or absent, are left out)."""
    given = {
        field: getattr(args, dest)
        for dest, field in _FIELDS.items()
        if getattr(args, dest, None) is not None
    }
    if "schedule_params" in given:
        given["schedule_params"] = tuple(tuple(pair) for pair in given["schedule_params"])
    precision = getattr(args, "state_precision", None)
    if precision is not None:
        given["optimizer_params"] = (("state_precision", precision),)
    return given


_UNSET_MEANS = {
    "lr": "the optimizer's default lr",
    "warmup_steps": "the default warm-up (--steps / 20)",
    "impl": "the implementation chosen by measuring (no --impl)",
}
"""What a run saved without the option used, where "without --X" says too little."""


def _saved_with(field: str, value: Any) -> str:
    """What the saved run used for ``field``, in options: ``--layers 1``, ``without --clip``."""
    if value is None or value == ():
        unset = _UNSET_MEANS.get(field)
        return f"with {unset}" if unset else f"without {option_name(field)}"
    return f"with {as_typed(field, value)}"


def _conflict(field: str, given: Any, saved: Any) -> str:
    return (
        f"{as_typed(field, given)} cannot change on resume: "
        f"the run was saved {_saved_with(field, saved)}"
    )


def _merge_resumed(given: dict[str, Any], directory: str) -> dict[str, Any]:
    saved = read_run_file(directory)
    options = dict(saved["options"])
    options["schedule_params"] = tuple(tuple(pair) for pair in options["schedule_params"])
    conflicts = [
        _conflict(name, given[name], options[name])
        for name in RESUMABLE_FIELDS
        if name in given and given[name] != options[name]
    ]
    if conflicts:
        raise OptiplugError("; ".join(conflicts))
    # a resumed run keeps saving into the directory it resumed from
    return {"steps": saved["steps"], "save": directory, **options, **given}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`~optiplug_train.config.TrainConfig` the arguments describe.

    With ``--resume DIR`` the options saved in ``DIR/train.json`` fill in what
    is not given (and the run saves into ``DIR`` again unless ``--save`` says
    elsewhere); giving a different value for one that defines the run (model,
    data, optimizer, schedule, seed, batch, processes) is an error.

    Args:
        args: the parsed ``train`` arguments.

    Returns:
        The run's configuration.

    Raises:
        OptiplugError: a conflicting option on resume, or an invalid value.
    """
    given = given_options(args)
    if args.resume:
        given = _merge_resumed(given, args.resume)
    return TrainConfig(**given)

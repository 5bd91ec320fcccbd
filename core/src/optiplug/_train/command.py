"""``optiplug train``: train a small character-level language model and report how it did.

The default run trains a 3-layer transformer on the interpreter's own
standard-library sources for 500 steps with ``adamw`` and a cosine schedule,
then prints the training and validation loss beside the unigram baseline and
a generated sample. ``--compare adamw,lion,muon`` trains several optimizers on
identical data and seeds and plots their loss curves.

This module does not import torch; :mod:`optiplug._train` is imported when the
command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..cli.schedule import parse_param
from ..errors import OptiplugError

if TYPE_CHECKING:
    from .job import Corpus, Skipped, TrainConfig, TrainResult

__all__ = ["configure", "config_from_args", "run"]

DEFAULT_PLOT = "optiplug-compare.png"
_MATPLOTLIB_MISSING = (
    "matplotlib is not installed, so no plot was written; "
    "install it with: pip install 'optiplug[plot]'"
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
}
"""Command-line destination -> :class:`~optiplug._train.TrainConfig` field."""


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
    run.add_argument("--schedule", metavar="NAME", help="schedule name (default: cosine)")
    run.add_argument(
        "--schedule-param",
        type=parse_param,
        action="append",
        metavar="KEY=VALUE",
        help="extra schedule parameter (repeatable); total_steps and warmup_steps are filled in",
    )
    run.add_argument("--warmup", type=int, metavar="N", help="warm-up steps (default: steps/20)")
    run.add_argument("--steps", type=int, metavar="N", help="optimizer steps (default: 500)")
    run.add_argument("--seed", type=int, help="seed of weights, data order and sample (default: 0)")
    run.add_argument("--device", help="torch device (default: cpu)")


def _add_model_options(parser: argparse.ArgumentParser) -> None:
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
        help="train each optimizer (NAME or NAME=LR) on identical data and plot the losses",
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
        "--threads",
        type=int,
        metavar="N",
        help="torch threads per process (default: torch's own; 1 is often faster on a busy machine)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` command's arguments to ``parser``."""
    _add_run_options(parser)
    _add_model_options(parser)
    _add_output_options(parser)
    _add_process_options(parser)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        field: getattr(args, dest)
        for dest, field in _FIELDS.items()
        if getattr(args, dest, None) is not None
    }
    if "schedule_params" in given:
        given["schedule_params"] = tuple(tuple(pair) for pair in given["schedule_params"])
    return given


def _merge_resumed(given: dict[str, Any], directory: str) -> dict[str, Any]:
    from .job import RESUMABLE_FIELDS, read_run_file

    saved = read_run_file(directory)
    options = dict(saved["options"])
    options["schedule_params"] = tuple(tuple(pair) for pair in options["schedule_params"])
    conflicts = [
        f"{name}={given[name]!r} (saved: {options[name]!r})"
        for name in RESUMABLE_FIELDS
        if name in given and given[name] != options[name]
    ]
    if conflicts:
        raise OptiplugError(
            f"--resume {directory!r}: these options differ from the saved run's and cannot "
            f"change: {', '.join(conflicts)}"
        )
    # a resumed run keeps saving into the directory it resumed from
    return {"steps": saved["steps"], "save": directory, **options, **given}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`~optiplug._train.TrainConfig` the arguments describe.

    With ``--resume DIR`` the options saved in ``DIR/train.json`` fill in what
    is not given (and the run saves into ``DIR`` again unless ``--save`` says
    elsewhere); giving a different value for one that defines the run (model,
    data, optimizer, schedule, seed, batch, processes) is an error.

    Raises:
        OptiplugError: a conflicting option on resume, or an invalid value.
    """
    from .job import TrainConfig

    given = _given(args)
    if args.resume:
        given = _merge_resumed(given, args.resume)
    return TrainConfig(**given)


def _check_combinations(args: argparse.Namespace, config: TrainConfig) -> None:
    if args.compare and (config.save or config.resume or config.nproc > 1):
        raise OptiplugError("--compare runs in one process and cannot --save, --resume or --nproc")
    if args.compare and args.optimizer:
        raise OptiplugError("--compare names the optimizers; drop --optimizer")
    if args.plot and not args.compare:
        raise OptiplugError("--plot goes with --compare")


def _preflight(config: TrainConfig) -> None:
    """Fail fast (before loading data or starting processes) on a bad name or value."""
    from .._api import factory
    from .job import make_schedule

    make_schedule(config)
    if config.optimizer != "auto":
        overrides = {} if config.lr is None else {"lr": config.lr}
        factory(config.optimizer, impl=config.impl, **overrides)


# ------------------------------------------------------------------ report
def _format_hparams(hparams: dict[str, Any]) -> str:
    return ", ".join(
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value!r}"
        for key, value in hparams.items()
    )


def _header(config: TrainConfig, corpus: Corpus) -> str:
    total = len(corpus.train) + len(corpus.val)
    processes = f", {config.nproc} processes" if config.nproc > 1 else ""
    return "\n".join(
        [
            f"corpus: {corpus.description}: {corpus.files} files, {total:,} characters, "
            f"vocabulary {len(corpus.vocab)}",
            f"        train {len(corpus.train):,} / validation {len(corpus.val):,} "
            f"characters (the last 10%)",
            f"model:  {config.n_layer}-layer character transformer, d_model {config.d_model}, "
            f"{config.n_head} heads, context {config.block_size}",
            f"batch:  {config.batch_size} windows x {config.block_size} characters per step"
            f"{processes}",
        ]
    )


def _report(result: TrainResult, config: TrainConfig) -> str:
    from .._text import format_table

    rate = (result.steps - result.start_step) / result.seconds if result.seconds else 0.0
    resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
    rows = [
        ["train", f"{result.train_loss:.4f}", ""],
        [
            "validation",
            f"{result.val_loss:.4f}",
            f"step {result.start_step}: {result.initial_val_loss:.4f}",
        ],
        ["unigram baseline", f"{result.baseline:.4f}", "entropy of the training characters"],
    ]
    lines = [
        f"optimizer: {result.optimizer} ({_format_hparams(result.hyperparameters)})",
        *([f"           chosen because: {result.reason}"] if result.reason else []),
        f"schedule:  {result.schedule}",
        f"trained {result.parameters:,} parameters to step {result.steps}{resumed} in "
        f"{result.seconds:.1f} s ({rate:.1f} steps/s)",
        "",
        format_table(["loss", "nats/char", "note"], rows),
    ]
    if result.saved:
        lines += ["", f"saved to {result.saved}"]
    if result.sample:
        lines += [
            "",
            f"sample ({config.sample_chars} characters, temperature {config.temperature:g}, "
            f"seed {config.seed}):",
            result.prompt + result.sample,
        ]
    return "\n".join(lines)


def _compare_table(results: Sequence[TrainResult | Skipped]) -> str:
    from .._text import format_table
    from .job import Skipped

    rows = []
    for result in results:
        if isinstance(result, Skipped):
            rows.append([result.name, "-", "-", "-", "-", f"skipped: {result.reason}"])
            continue
        rows.append(
            [
                result.optimizer,
                f"{result.hyperparameters['lr']:g}",
                f"{result.train_loss:.4f}",
                f"{result.val_loss:.4f}",
                f"{result.seconds:.1f}",
                "",
            ]
        )
    header = ["optimizer", "lr", "train loss", "val loss", "seconds", "note"]
    return format_table(header, rows)


# ------------------------------------------------------------------ run
def _matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _run_compare(args: argparse.Namespace, config: TrainConfig) -> int:
    from . import job as _train

    entries = _train.parse_compare(args.compare)
    _train.availability(entries)
    can_plot = _matplotlib_available()
    if not can_plot:
        print(f"note: {_MATPLOTLIB_MISSING}", file=sys.stderr)
    corpus = _train.load_corpus(config.data, config.max_chars)
    _train.check_run(config, corpus)
    _train.make_schedule(config)
    print(_header(config, corpus), flush=True)
    with _train.torch_threads(config.threads):
        results = _train.compare(config, entries, corpus, quiet=args.quiet)
    trained = [r for r in results if isinstance(r, _train.TrainResult)]
    print()
    print(_compare_table(results))
    print(f"\nunigram baseline: {trained[0].baseline:.4f} nats/char")
    if not can_plot:
        print(f"note: {_MATPLOTLIB_MISSING}", file=sys.stderr)
        return 0
    title = (
        f"optiplug train --compare: character LM, {config.n_layer} layers x {config.d_model}, "
        f"batch {config.batch_size} x {config.block_size}, seed {config.seed}"
    )
    print(f"wrote {_train.plot_losses(trained, args.plot or DEFAULT_PLOT, title=title)}")
    return 0


def _run_single(args: argparse.Namespace, config: TrainConfig) -> int:
    from . import job as _train

    corpus = _train.load_corpus(config.data, config.max_chars)
    _train.check_run(config, corpus)
    print(_header(config, corpus), flush=True)
    if config.nproc > 1:
        result = _train.launch(config, quiet=args.quiet)
    else:
        with _train.torch_threads(config.threads):
            result = _train.train(config, corpus, quiet=args.quiet)
    assert result is not None
    print()
    print(_report(result, config))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``optiplug train`` (one run, ``--nproc`` processes, or ``--compare``).

    Args:
        args: the parsed arguments.

    Returns:
        0 on success (optiplug errors propagate to the CLI, which exits 2).
    """
    config = config_from_args(args)
    _check_combinations(args, config)
    if args.compare:
        return _run_compare(args, config)
    _preflight(config)
    return _run_single(args, config)

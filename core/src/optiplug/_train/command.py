"""``optiplug train``: train a small character-level language model and report how it did.

The default run trains a 3-layer transformer on the interpreter's own
standard-library sources for 500 steps with ``adamw`` and a cosine schedule,
then prints the training and validation loss beside the unigram baseline and
a generated sample. ``--compare adamw,lion,muon`` trains several optimizers on
identical data and seeds and plots their loss curves.

This module imports torch: the ``train`` plugin imports it when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from .._core.registry import Registry
from ..errors import OptiplugError
from .compare import availability, compare, parse_compare
from .config import TrainConfig
from .cpus import ThreadChoice, choose_threads
from .data import load_corpus
from .launch import launch, torch_threads
from .loop import check_run, train
from .options import DEFAULT_PLOT, config_from_args
from .preflight import preflight
from .report import compare_table, header, plot_losses, report
from .results import TrainResult

__all__ = ["run"]

_MATPLOTLIB_MISSING = (
    "matplotlib is not installed, so no plot was written; "
    "install it with: pip install 'optiplug[plot]'"
)


def _check_combinations(args: argparse.Namespace, config: TrainConfig) -> None:
    if args.compare and (config.save or config.resume or config.nproc > 1):
        raise OptiplugError("--compare runs in one process and cannot --save, --resume or --nproc")
    if args.compare and args.optimizer:
        raise OptiplugError("--compare names the optimizers; drop --optimizer")
    if args.plot and not args.compare:
        raise OptiplugError("--plot goes with --compare")


def _matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _plot_title(config: TrainConfig) -> str:
    return (
        f"optiplug train --compare: character LM, {config.n_layer} layers x {config.d_model}, "
        f"batch {config.batch_size} x {config.block_size}, seed {config.seed}"
    )


def _threads(args: argparse.Namespace, config: TrainConfig) -> ThreadChoice:
    """The threads per process, and where the number comes from."""
    given_by = "--threads" if args.threads is not None else f"saved in {config.resume}"
    return choose_threads(config.threads, config.nproc, given_by=given_by)


def _run_compare(
    args: argparse.Namespace,
    config: TrainConfig,
    registry: Registry,
    entries: list[tuple[str, float | None]],
) -> int:
    can_plot = _matplotlib_available()
    if not can_plot:
        print(f"note: {_MATPLOTLIB_MISSING}", file=sys.stderr)
    corpus = load_corpus(config.data, config.max_chars)
    check_run(config, corpus)
    threads = _threads(args, config)
    print(header(config, corpus, threads), flush=True)
    with torch_threads(threads.threads):
        results = compare(config, entries, registry, corpus, quiet=args.quiet)
    trained = [r for r in results if isinstance(r, TrainResult)]
    print()
    print(compare_table(results))
    print(f"\nunigram baseline: {trained[0].baseline:.4f} nats/char")
    if not can_plot:
        print(f"note: {_MATPLOTLIB_MISSING}", file=sys.stderr)
        return 0
    print(f"wrote {plot_losses(trained, args.plot or DEFAULT_PLOT, title=_plot_title(config))}")
    return 0


def _run_single(args: argparse.Namespace, config: TrainConfig, registry: Registry) -> int:
    corpus = load_corpus(config.data, config.max_chars)
    check_run(config, corpus)
    threads = _threads(args, config)
    print(header(config, corpus, threads), flush=True)
    if config.nproc > 1:
        result: TrainResult | None = launch(config, quiet=args.quiet, threads=threads.threads)
    else:
        with torch_threads(threads.threads):
            result = train(config, registry, corpus, quiet=args.quiet)
    if result is None:
        raise OptiplugError("the run returned no result")
    print()
    print(report(result, config))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``optiplug train`` (one run, ``--nproc`` processes, or ``--compare``).

    Every option is checked before the corpus is read or a step is taken
    (:func:`~optiplug._train.preflight.preflight`): a mistake that would end
    the run late (a save directory under a file, a plot in a missing
    directory, an unknown ``--impl``) costs nothing.

    Args:
        args: the parsed arguments; ``args.registry`` is where optimizers and
            schedules are looked up.

    Returns:
        0 on success (optiplug errors propagate to the CLI, which exits 2).

    Raises:
        OptiplugError: bad options, an unknown optimizer or schedule, a path
            that could not be written, a corpus too small, a run that cannot
            be resumed, or a failed process.
    """
    registry: Registry = args.registry
    config = config_from_args(args)
    _check_combinations(args, config)
    if not args.compare:
        preflight(config, registry)
        return _run_single(args, config, registry)
    entries = parse_compare(args.compare)
    reasons = availability(entries, registry)
    runnable = [(name, lr) for name, lr in entries if reasons[name] is None]
    plot = (args.plot or DEFAULT_PLOT) if _matplotlib_available() else None
    preflight(config, registry, optimizers=runnable, plot=plot)
    return _run_compare(args, config, registry, entries)

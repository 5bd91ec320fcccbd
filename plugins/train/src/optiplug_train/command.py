"""``optiplug train``: train a small character-level language model and report how it did.

The default run trains a 3-layer transformer on the interpreter's own
standard-library sources for 500 steps with ``adamw`` and a cosine schedule,
then prints the training and validation loss beside the unigram baseline and
a generated sample. ``--compare adamw,lion,muon`` trains several optimizers on
identical data and seeds and plots their loss curves; with ``--seeds N`` and
``--target-loss X`` it races them over N seeds and reports intervals and
p-values.

This module imports torch: the ``train`` plugin imports it when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import shlex
import sys
from typing import Any

import attrs

import optiplug
from optiplug import Registry
from optiplug.errors import OptiplugError

from .compare import availability, check_installed, compare, parse_compare, race, unavailable
from .config import OptionError, TrainConfig, read_run_file
from .cpus import ThreadChoice, choose_threads
from .data import Corpus, load_corpus
from .launch import launch, torch_threads
from .loop import Interrupted, check_run, train
from .options import DEFAULT_PLOT, DEFAULT_TUNE_BUDGET, check_seeds, config_from_args
from .preflight import preflight
from .report import (
    compare_table,
    header,
    plot_losses,
    plot_race,
    race_notes,
    race_table,
    report,
)
from .results import RaceResult, TrainResult
from .tune import run_hyperparameters, run_length_budget, tune_job, tune_lrs

__all__ = ["INTERRUPTED", "run"]

INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT, as a shell reports it)."""

_MATPLOTLIB_MISSING = (
    "matplotlib is not installed, so no plot was written; "
    "install it with: pip install 'optiplug[plot]'"
)


_SHARDING = (
    "sharding: FSDP2 (fully_shard) over {nproc} process(es): each transformer block of at least "
    "{min_params:,} parameters is its own unit, the root holds the rest; each "
    "process keeps its shard of the parameters, gradients and optimizer state"
)


def _fsdp_min_params() -> int:
    """The smallest block :class:`optiplug.Graph` shards as its own unit, by default."""
    default: int = inspect.signature(optiplug.Graph).parameters["fsdp_min_params"].default
    return default


def _check_combinations(args: argparse.Namespace, config: TrainConfig) -> None:
    if args.compare and (config.save or config.resume or config.nproc > 1):
        raise OptiplugError("--compare runs in one process and cannot --save, --resume or --nproc")
    if args.compare and config.parallel == "fsdp":
        raise OptiplugError(
            "--compare runs in one process without torch.distributed: drop --parallel fsdp"
        )
    if args.compare and args.optimizer:
        raise OptiplugError("--compare names the optimizers; drop --optimizer")
    if args.plot and not args.compare:
        raise OptiplugError("--plot goes with --compare")
    _check_race_options(args)
    _check_tune_options(args)


def _racing(args: argparse.Namespace) -> bool:
    """Whether ``--compare`` is a race (``--seeds`` or ``--target-loss`` given)."""
    return args.seeds is not None or args.target_loss is not None


def _check_race_options(args: argparse.Namespace) -> None:
    """Refuse a bad ``--seeds`` or ``--target-loss``, or either without ``--compare``."""
    if args.seeds is not None:
        check_seeds(args.seeds)
    target = args.target_loss
    if target is not None and not (math.isfinite(target) and target > 0):
        raise OptionError(
            "target_loss", target, "must be a finite number > 0 (a validation loss, in nats)"
        )
    for option, value in (("seeds", args.seeds), ("target_loss", target)):
        if value is not None and not args.compare:
            raise OptionError(option, value, "goes with --compare (it races its optimizers)")


def _check_tune_options(args: argparse.Namespace) -> None:
    if args.tune and args.compare:
        raise OptiplugError("--tune trains one optimizer; with --compare use --tune-lr")
    if args.tune and args.lr is not None:
        raise OptiplugError(f"--tune chooses the lr; drop --lr {args.lr:g}")
    if args.tune and args.resume:
        raise OptiplugError("--resume continues with the saved optimizer; drop --tune")
    if args.tune_lr and not args.compare:
        raise OptiplugError("--tune-lr goes with --compare (one optimizer: --tune)")
    if (args.tune or args.tune_lr) and args.tune_budget is not None and args.tune_budget < 1:
        raise OptiplugError(f"--tune-budget {args.tune_budget}: expected a positive step count")


def _tune_budget(args: argparse.Namespace, config: TrainConfig, auto: bool) -> int:
    """``--tune-budget``, or its default: the run's length per tuned lr, 1500 for auto."""
    if args.tune_budget is not None:
        budget: int = args.tune_budget
        return budget
    return DEFAULT_TUNE_BUDGET if auto else run_length_budget(config.steps)


def _tuned_config(
    args: argparse.Namespace, config: TrainConfig, corpus: Corpus, registry: Registry
) -> TrainConfig:
    """``config`` with the optimizer and hyperparameters ``--tune`` measured as best."""
    candidates = None if config.optimizer == "auto" else [config.optimizer]
    what = "the rules' candidates" if candidates is None else config.optimizer
    budget = _tune_budget(args, config, auto=candidates is None)
    print(f"tuning {what} ({budget} steps)...", flush=True)
    selection = tune_job(config, corpus, registry, candidates, budget_steps=budget)
    print(selection.explain(), flush=True)
    lr, params = run_hyperparameters(selection.hparams)
    return attrs.evolve(config, optimizer=selection.name, lr=lr, optimizer_params=params)


def _tuned_lrs(
    args: argparse.Namespace,
    config: TrainConfig,
    corpus: Corpus,
    registry: Registry,
    entries: list[tuple[str, float | None]],
) -> dict[str, dict[str, Any]]:
    """``--tune-lr``: each runnable optimizer given without an lr, tuned alone."""
    names = [name for name, lr in entries if lr is None and unavailable(name, registry) is None]
    budget = _tune_budget(args, config, auto=False)
    print(f"tuning the lr of {', '.join(names)} ({budget} steps each)...", flush=True)
    found = tune_lrs(config, corpus, registry, names, budget_steps=budget)
    for name, selection in found.items():
        trial = selection.tuning.trials[0] if selection.tuning else None
        if trial is not None:
            print(
                f"  {name}: lr {trial.lr:.3g} (range test's minimum at {trial.lr_at_min or 0:.3g}, "
                f"held-out loss {trial.held_out_loss:.4f})",
                flush=True,
            )
    return {name: dict(selection.hparams) for name, selection in found.items()}


def _matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _plot_title(config: TrainConfig, seeds: int = 1) -> str:
    which = (
        f"seed {config.seed}" if seeds == 1 else f"seeds {config.seed}-{config.seed + seeds - 1}"
    )
    return (
        f"optiplug train --compare: character LM, {config.n_layer} layers x {config.d_model}, "
        f"batch {config.batch_size} x {config.block_size}, {which}"
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
        tuned = _tuned_lrs(args, config, corpus, registry, entries) if args.tune_lr else None
        if _racing(args):
            return _race(args, config, registry, entries, (corpus, tuned, can_plot))
        results = compare(config, entries, registry, corpus, quiet=args.quiet, tuned=tuned)
    trained = [r for r in results if isinstance(r, TrainResult)]
    print()
    print(compare_table(results))
    print(f"\nunigram baseline: {trained[0].baseline:.4f} nats/char")
    if not can_plot:
        print(f"note: {_MATPLOTLIB_MISSING}", file=sys.stderr)
        return 0
    print(f"wrote {plot_losses(trained, args.plot or DEFAULT_PLOT, title=_plot_title(config))}")
    return 0


def _race(
    args: argparse.Namespace,
    config: TrainConfig,
    registry: Registry,
    entries: list[tuple[str, float | None]],
    context: tuple[Corpus, dict[str, dict[str, Any]] | None, bool],
) -> int:
    """The race: every optimizer over ``--seeds`` seeds, its table, notes and plot."""
    corpus, tuned, can_plot = context
    seeds = args.seeds or 1
    result: RaceResult = race(
        config,
        entries,
        registry,
        corpus,
        seeds=seeds,
        target=args.target_loss,
        quiet=args.quiet,
        tuned=tuned,
    )
    print()
    print(race_table(result))
    print()
    print(race_notes(result, config))
    if result.baseline is not None:
        print(f"unigram baseline: {result.baseline:.4f} nats/char")
    if not can_plot:
        print(f"note: {_MATPLOTLIB_MISSING}", file=sys.stderr)
        return 0
    title = _plot_title(config, seeds)
    print(f"wrote {plot_race(result, args.plot or DEFAULT_PLOT, title=title)}")
    return 0


def _run_single(args: argparse.Namespace, config: TrainConfig, registry: Registry) -> int:
    corpus = load_corpus(config.data, config.max_chars)
    check_run(config, corpus)
    threads = _threads(args, config)
    if args.tune:
        with torch_threads(threads.threads):
            config = _tuned_config(args, config, corpus, registry)
    print(header(config, corpus, threads), flush=True)
    if config.parallel == "fsdp":
        print(_SHARDING.format(nproc=config.nproc, min_params=_fsdp_min_params()), flush=True)
    if config.nproc > 1 or config.parallel == "fsdp":  # FSDP needs a process group, even of one
        result: TrainResult | None = launch(config, quiet=args.quiet, threads=threads.threads)
    else:
        with torch_threads(threads.threads):
            result = train(config, registry, corpus, quiet=args.quiet)
    if result is None:
        raise OptiplugError("the run returned no result")
    print()
    print(report(result, config))
    return 0


def _interrupted_elsewhere(config: TrainConfig) -> list[str]:
    """What Ctrl-C outside one process's training loop leaves: what the save directory holds."""
    if config.save is None:
        return ["interrupted", "nothing was saved (no --save)"]
    try:
        held = read_run_file(config.save).get("step")
    except OptiplugError:
        return ["interrupted", f"no checkpoint was saved in {config.save}"]
    return [
        "interrupted",
        f"the last checkpoint, step {held}, is intact in {config.save}; continue with: "
        f"optiplug train --resume {shlex.quote(config.save)}",
    ]


def run(args: argparse.Namespace) -> int:
    """Run ``optiplug train`` (one run, ``--nproc`` processes, or ``--compare``).

    Every option is checked before the corpus is read or a step is taken
    (:func:`~optiplug_train.preflight.preflight`): a mistake that would end
    the run late (a save directory under a file, a plot in a missing
    directory, an unknown ``--impl``) costs nothing. Ctrl-C prints, instead
    of a traceback, the step the run stopped at, the last checkpoint (its
    step, intact) and the command that resumes it.

    Args:
        args: the parsed arguments; ``args.registry`` is where optimizers and
            schedules are looked up.

    Returns:
        0 on success, 130 after Ctrl-C (optiplug errors propagate to the
        CLI, which exits 2).

    Raises:
        OptiplugError: bad options, an unknown optimizer or schedule, a path
            that could not be written, a corpus too small, a run that cannot
            be resumed, or a failed process.
    """
    config = config_from_args(args)
    try:
        return _run(args, config)
    except Interrupted as stop:
        lines = stop.lines
    except KeyboardInterrupt:
        lines = _interrupted_elsewhere(config)
    for line in lines:
        print(f"optiplug: {line}", file=sys.stderr)
    return INTERRUPTED


def _run(args: argparse.Namespace, config: TrainConfig) -> int:
    registry: Registry = args.registry
    # parsed first: --compare '' is refused as empty, not taken for no --compare
    entries = None if args.compare is None else parse_compare(args.compare)
    _check_combinations(args, config)
    if entries is None:
        preflight(config, registry)
        return _run_single(args, config, registry)
    check_installed(args.compare, entries, registry)
    reasons = availability(entries, registry)
    runnable = [(name, lr) for name, lr in entries if reasons[name] is None]
    plot = (args.plot or DEFAULT_PLOT) if _matplotlib_available() else None
    preflight(config, registry, optimizers=runnable, plot=plot)
    return _run_compare(args, config, registry, entries)

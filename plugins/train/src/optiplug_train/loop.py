"""The training run: a Graph wired to model, optimizer, schedule and data, then the loop.

Everything is seeded, so two runs with the same options see the same data in
the same order from the same initial weights. Under ``torch.distributed``
every process runs :func:`train`; rank 0 logs, evaluates and reports.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import IO, Any

import attrs
import torch

from optiplug import Graph, OptimizerFactory, Registry
from optiplug.errors import GraphError, HyperparameterError, OptiplugError

from .checkpoints import require_checkpoints, resume_run, save_run
from .config import TrainConfig
from .data import Corpus, Windows, load_corpus, spread, unigram_entropy, windows
from .model import CharTransformer, generate, mean_loss, next_token_loss
from .optim import effective_hparams, make_schedule, resolve_optimizer
from .report import Progress, echo, run_header
from .results import TrainResult

__all__ = ["Interrupted", "build_graph", "check_run", "seeded_model", "train"]

_FINAL_WINDOWS = 4096


# ------------------------------------------------------------------ setup
def seeded_model(config: TrainConfig, corpus: Corpus) -> CharTransformer:
    """The run's model at its initial weights: seeded with ``config.seed``, on the CPU.

    Args:
        config: the run (model shape and seed).
        corpus: its corpus (the vocabulary size).

    Returns:
        The model; the same weights for the same options.
    """
    torch.manual_seed(config.seed)
    return CharTransformer(
        len(corpus.vocab),
        block_size=config.block_size,
        n_layer=config.n_layer,
        d_model=config.d_model,
        n_head=config.n_head,
    )


def build_graph(
    config: TrainConfig, corpus: Corpus, registry: Registry
) -> tuple[Graph, OptimizerFactory]:
    """Seed, build the model, and wire it to optimizer, schedule and data in a Graph.

    Under ``torch.distributed`` each process loads ``batch_size / world`` windows
    per step (the Graph shards the data and wraps the model in DDP, or with
    ``config.parallel == "fsdp"`` shards it with FSDP2, one unit per block).

    Args:
        config: the run.
        corpus: its corpus.
        registry: where the optimizer and schedule are looked up.

    Returns:
        The Graph and the optimizer factory it was given.

    Raises:
        UnknownOptimizerError: no such optimizer.
        HyperparameterError: invalid hyperparameters or schedule parameters.
    """
    model = seeded_model(config, corpus)
    graph = Graph(model, device=config.device, seed=config.seed, parallel=config.parallel)
    graph.set_nonfinite_policy(config.nonfinite)
    graph.set_grad_clip(config.clip)
    graph.set_scheduler(make_schedule(config, registry))
    chosen = resolve_optimizer(
        config.optimizer,
        model,
        registry,
        lr=config.lr,
        impl=config.impl,
        params=dict(config.optimizer_params),
    )
    graph.set_optimizer(chosen)
    per_rank = config.batch_size // graph.world_size
    dataset = Windows(corpus.train, config.block_size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=per_rank, shuffle=True, drop_last=True)
    graph.set_data_loader(loader, forward_input="tokens")
    return graph, chosen


def _prompt(config: TrainConfig, corpus: Corpus) -> str:
    if config.prompt is not None:
        return config.prompt
    if all(c in corpus.vocab for c in "def "):
        return "def "
    return corpus.decode(corpus.train[:1].tolist())


def check_run(config: TrainConfig, corpus: Corpus) -> None:
    """Refuse, before training, what would fail later: corpus size, prompt, device.

    Args:
        config: the run.
        corpus: its corpus.

    Raises:
        OptiplugError: a corpus too small for one batch of windows and one
            validation window (naming the sizes), or a device torch cannot use.
        HyperparameterError: an empty prompt, or one with characters the corpus lacks.
    """
    if config.sample_chars and not _prompt(config, corpus):
        raise HyperparameterError("prompt", "", "must not be empty", algorithm="train")
    corpus.encode(_prompt(config, corpus))
    _check_device(config.device)
    train_windows = len(windows(corpus.train, config.block_size))
    if train_windows < config.batch_size or len(corpus.val) < config.block_size + 1:
        raise OptiplugError(
            f"the corpus is too small: {len(corpus.train):,} training and {len(corpus.val):,} "
            f"validation characters; --batch-size {config.batch_size} and --block-size "
            f"{config.block_size} need at least {config.batch_size * config.block_size + 1:,} "
            f"and {config.block_size + 1:,}"
        )


def _check_device(device: str) -> None:
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise OptiplugError(f"--device {device!r} cannot be used here: {message}") from None


def _start(graph: Graph, config: TrainConfig, corpus: Corpus, registry: Registry) -> int:
    """Check checkpoints can be written, resume if asked; the step training starts from."""
    if config.save:
        require_checkpoints(graph, "--save")
    if config.resume:
        resume_run(graph, config, corpus, registry)
    return graph.training_step


# ------------------------------------------------------------------ the loop
@attrs.define
class _Curves:
    train: list[tuple[int, float]] = attrs.Factory(list)
    val: list[tuple[int, float]] = attrs.Factory(list)
    saved_at: int | None = None
    val_seconds: list[float] = attrs.Factory(list)
    """Training seconds (evaluations left out) up to each point of ``val``."""


class _Evaluator:
    """The fixed validation windows and the curve's points.

    Rank 0 records them; under FSDP every rank evaluates alongside it, since
    each forward gathers the sharded parameters from all ranks.
    """

    def __init__(self, graph: Graph, config: TrainConfig, corpus: Corpus, active: bool) -> None:
        self.graph, self.config, self.active = graph, config, active
        self.val_rows = windows(corpus.val, config.block_size)
        self.curve_rows = spread(self.val_rows, config.eval_windows)
        self.began = time.perf_counter()
        self.evaluating = 0.0  # seconds spent in evaluations so far, not training

    def start(self) -> None:
        """The training clock starts now (the time to each point counts from here)."""
        self.began, self.evaluating = time.perf_counter(), 0.0

    def due(self, step: int) -> bool:
        return self.active and (
            step % self.config.eval_interval == 0 or step >= self.config.last_step
        )

    def point(self, step: int, curves: _Curves, progress: Progress) -> float:
        entered = time.perf_counter()
        self.graph.eval()  # a train/eval optimizer (schedule-free) evaluates its averaged point
        try:
            loss = mean_loss(self.graph.module, self.curve_rows, self.graph.device)
        finally:
            self.graph.train()
        curves.val_seconds.append(entered - self.began - self.evaluating)
        self.evaluating += time.perf_counter() - entered
        curves.val.append((step, loss))
        progress.evaluated(step, loss)
        return loss


def _epoch(graph: Graph, n: int) -> Generator[Mapping[str, Any], None, None]:
    """``graph.epoch(n)`` as a generator: closing it closes the Graph's epoch too."""
    yield from graph.epoch(n)


def _steps(graph: Graph, last_step: int) -> Iterator[torch.Tensor]:
    """Train until ``last_step``, yielding each step's loss (after the step; skipped ones not)."""
    while graph.training_step < last_step:
        with contextlib.closing(_epoch(graph, graph.data_position[0])) as batches:
            for batch in batches:
                logits = graph.forward_batch(batch)
                loss = next_token_loss(logits, graph.targets(batch)["targets"])
                graph.backward(loss)
                if not graph.step():
                    continue  # skipped for a non-finite loss (--nonfinite skip)
                yield loss.detach()
                if graph.training_step >= last_step:
                    return


def _lr(graph: Graph) -> float:
    if graph.optimizer is None:
        raise OptiplugError("the Graph has no optimizer")
    return float(graph.optimizer.param_groups[0]["lr"])


def _loop(
    graph: Graph,
    config: TrainConfig,
    corpus: Corpus,
    evaluator: _Evaluator,
    tracking: tuple[Progress, _Curves],
) -> None:
    progress, curves = tracking
    try:
        if evaluator.active:
            evaluator.point(graph.training_step, curves, progress)
        for loss in _steps(graph, config.last_step):
            _after_step(graph, config, corpus, float(loss), (evaluator, progress, curves))
    except GraphError as error:  # a non-finite loss, gradient or state: nothing more is saved
        progress.close()
        raise OptiplugError(_stopped(error, config, curves)) from error
    except KeyboardInterrupt:
        progress.close()  # end the progress line before the message
        raise
    progress.close()


def _distributed() -> bool:
    """Whether this process belongs to an initialized ``torch.distributed`` group."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Within: Ctrl-C takes effect when the block ends, so a save is never cut in half.

    Only in one process, on the main thread, under Python's own SIGINT
    handler: ranks of a distributed run save together and must stop together.
    """
    if (
        _distributed()
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


def _save(graph: Graph, config: TrainConfig, corpus: Corpus, curves: _Curves) -> None:
    """Save the run (Ctrl-C waits for the save) and record the step saved."""
    with _ctrl_c_deferred():
        save_run(graph, config, corpus)
        curves.saved_at = graph.training_step


def _after_step(
    graph: Graph,
    config: TrainConfig,
    corpus: Corpus,
    loss: float,
    tracking: tuple[_Evaluator, Progress, _Curves],
) -> None:
    """Record the step's loss, evaluate and save when due."""
    evaluator, progress, curves = tracking
    step = graph.training_step
    curves.train.append((step, loss))
    progress.update(step, loss, _lr(graph), graph.last_grad_norm)
    if evaluator.due(step) and step != curves.val[-1][0]:
        evaluator.point(step, curves, progress)
    if config.save and config.save_every and step % config.save_every == 0:
        _save(graph, config, corpus, curves)


def _stopped(error: GraphError, config: TrainConfig, curves: _Curves) -> str:
    """Why the run stopped, where its last good checkpoint is, and what to try."""
    if curves.saved_at is not None:
        kept = (
            f"the last good checkpoint, step {curves.saved_at}, is in {config.save} "
            f"(--resume {config.save})"
        )
    elif config.resume:
        kept = f"the checkpoint it resumed from, in {config.resume}, is untouched"
    else:
        kept = "nothing was saved" if config.save else "nothing is saved without --save"
    hint = "lower --lr" + (
        "" if config.nonfinite == "skip" else ", or skip such batches with --nonfinite skip"
    )
    return f"training stopped: {error}; {kept}; {hint}"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run: where it stopped, and what is saved.

    Attributes:
        lines: what to tell the user: the step it stopped at, then the last
            checkpoint (its step and where) and how to resume, or that
            nothing was saved.
    """

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def _first_save(config: TrainConfig, start: int) -> int:
    """The step of this run's first save: the first multiple of ``--save-every``, or the end."""
    if config.save_every:
        due = (start // config.save_every + 1) * config.save_every
        return min(due, config.last_step)
    return config.last_step


def _interrupted(
    config: TrainConfig, step: int, start: int, saved_at: int | None, label: str
) -> list[str]:
    """What Ctrl-C at ``step`` leaves: the step, the intact checkpoint and the resume command."""
    stopped = f"{label}interrupted at step {step} of {config.last_step}"
    if saved_at is not None and config.save:
        where: tuple[str, int] | None = (config.save, saved_at)
    elif config.resume:
        where = (config.resume, start)  # untouched since it was loaded
    else:
        where = None
    if where is not None:
        directory, held = where
        return [
            stopped,
            f"the last checkpoint, step {held}, is intact in {directory}; continue with: "
            f"optiplug train --resume {shlex.quote(directory)}",
        ]
    if config.save:
        return [
            stopped,
            f"no checkpoint was saved yet (the first was due at step "
            f"{_first_save(config, start)}), so there is nothing to resume in {config.save}",
        ]
    return [stopped, "nothing was saved (no --save)"]


# ------------------------------------------------------------------ results
def _model(graph: Graph) -> CharTransformer:
    if not isinstance(graph.module, CharTransformer):
        raise TypeError(f"expected a CharTransformer, the Graph trains {type(graph.module)}")
    return graph.module


def _announce(
    graph: Graph, chosen: OptimizerFactory, config: TrainConfig, registry: Registry, start: int
) -> str:
    """What is about to be trained: parameters, optimizer and its hyperparameters, schedule."""
    return run_header(
        parameters=sum(p.numel() for p in graph.parameters()),
        optimizer=chosen.name,
        hyperparameters=effective_hparams(chosen, registry),
        schedule=repr(graph.schedule),
        steps=(start, config.last_step),
        impl=config.impl,
        reason=getattr(chosen, "reason", ""),
    )


def _finish(graph: Graph, config: TrainConfig, corpus: Corpus, curves: _Curves) -> dict[str, Any]:
    """Final losses, the baseline and the sample (rank 0), at the evaluation point.

    A train/eval optimizer (schedule-free) is left in eval mode: the model
    it leaves is its averaged point, the one to use.
    """
    graph.eval()
    val_rows = spread(windows(corpus.val, config.block_size), _FINAL_WINDOWS)
    train_rows = spread(windows(corpus.train, config.block_size), len(val_rows))
    prompt = _prompt(config, corpus)
    ids = generate(
        _model(graph),
        corpus.encode(prompt),
        config.sample_chars,
        temperature=config.temperature,
        seed=config.seed,
    )
    return {
        "val_windows": len(val_rows),
        "curve_windows": len(spread(windows(corpus.val, config.block_size), config.eval_windows)),
        "steps": graph.training_step,
        "initial_val_loss": curves.val[0][1],
        "train_loss": mean_loss(graph.module, train_rows, graph.device),
        "val_loss": mean_loss(graph.module, val_rows, graph.device),
        "baseline": unigram_entropy(corpus.train, len(corpus.vocab)),
        "curve": tuple(curves.train),
        "val_curve": tuple(curves.val),
        "val_seconds": tuple(curves.val_seconds),
        "sample": corpus.decode(ids),
        "prompt": prompt,
        "saved": config.save,
        "skipped": graph.skipped_steps,
        "grad_norm": graph.last_grad_norm,
    }


def _result(
    graph: Graph, chosen: OptimizerFactory, registry: Registry, measured: dict[str, Any]
) -> TrainResult:
    return TrainResult(
        optimizer=chosen.name,
        hyperparameters=effective_hparams(chosen, registry),
        schedule=repr(graph.schedule),
        parameters=sum(p.numel() for p in graph.parameters()),
        reason=getattr(chosen, "reason", ""),
        **measured,
    )


def train(
    config: TrainConfig,
    registry: Registry,
    corpus: Corpus | None = None,
    *,
    log: Callable[[str], None] | None = echo,
    stream: IO[str] | None = None,
    quiet: bool = False,
    label: str = "",
) -> TrainResult | None:
    """Train the character LM described by ``config`` and measure it.

    Under ``torch.distributed`` every process calls it; rank 0 logs, evaluates
    and returns the result, the others return None.

    Args:
        config: the run.
        registry: where the optimizer and schedule are looked up.
        corpus: the corpus, if already loaded (``--compare`` loads it once).
        log: where log lines go (rank 0); None drops them.
        stream: where the progress bar goes (default ``sys.stderr``).
        quiet: no progress bar, log lines instead.
        label: prefix of the progress line.

    Returns:
        The :class:`TrainResult` (on rank 0).

    Raises:
        OptiplugError: an unknown optimizer or schedule, bad hyperparameters, a
            corpus too small, or a checkpoint that cannot be resumed.
        Interrupted: Ctrl-C once training began (a save in progress is
            finished first); it says where the run stopped and what is saved.
    """
    corpus = corpus if corpus is not None else load_corpus(config.data, config.max_chars)
    check_run(config, corpus)
    graph, chosen = build_graph(config, corpus, registry)
    lead = graph.rank == 0
    start = _start(graph, config, corpus, registry)
    sharded = graph.parallel == "fsdp"  # every forward needs every rank
    evaluator = _Evaluator(graph, config, corpus, lead or sharded)
    if lead and log is not None:
        for line in _announce(graph, chosen, config, registry, start).splitlines():
            log(label + line)
    progress = Progress(
        config.last_step,
        start=start,
        stream=stream,
        quiet=quiet or not lead,
        log=log if lead else None,
        label=label,
        val_label=f"val({len(evaluator.curve_rows)}w)",
    )
    began = time.perf_counter()
    evaluator.start()
    curves = _Curves()
    try:
        _loop(graph, config, corpus, evaluator, (progress, curves))
        seconds = time.perf_counter() - began
        if config.save and curves.saved_at != graph.training_step:
            _save(graph, config, corpus, curves)
        if not lead and not sharded:
            torch.distributed.barrier()
            return None
        measured = _finish(graph, config, corpus, curves)
    except KeyboardInterrupt:
        lines = _interrupted(config, graph.training_step, start, curves.saved_at, label)
        raise Interrupted(lines) from None
    if not lead:
        torch.distributed.barrier()
        return None
    if _distributed():
        torch.distributed.barrier()
    return _result(graph, chosen, registry, {**measured, "start_step": start, "seconds": seconds})

"""``optiplug train``: a small character-level transformer LM, trained with ``optiplug.Graph``.

The corpus needs no download: by default it is the running interpreter's own
standard library (the top-level ``*.py`` files of ``sysconfig``'s ``stdlib``
directory, sorted by name, up to a character budget). Characters are the
tokens; the last 10% of the text is the fixed validation split. Everything is
seeded, so two runs with the same options see the same data in the same order
from the same initial weights.

This module imports torch; the CLI imports it only when ``train`` runs.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import math
import os
import pickle
import socket
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from .._api import default_registry
from .._api import factory as make_factory
from .._auto.selection import AutoOptimizer
from .._core import ranks as _ranks
from .._core.build import build_schedule
from .._graph.graph import Graph
from ..errors import HyperparameterError, OptimizerUnavailableError, OptiplugError

__all__ = [
    "RESUMABLE_FIELDS",
    "SAVED_DEFAULTS",
    "CharTransformer",
    "Corpus",
    "Progress",
    "Skipped",
    "TrainConfig",
    "TrainResult",
    "Windows",
    "availability",
    "build_graph",
    "check_run",
    "compare",
    "echo",
    "generate",
    "launch",
    "load_corpus",
    "make_schedule",
    "mean_loss",
    "next_token_loss",
    "parse_compare",
    "plot_losses",
    "read_run_file",
    "resolve_optimizer",
    "save_run",
    "smooth",
    "spread",
    "stdlib_files",
    "torch_threads",
    "train",
    "unavailable",
    "unigram_entropy",
    "windows",
]

VALIDATION_FRACTION = 0.1
CHECKPOINT_NAME = "checkpoint"
RUN_FILE = "train.json"
_RUN_FILE_VERSION = 1
_EVAL_BATCH = 128
_FINAL_WINDOWS = 4096


def echo(line: str) -> None:
    """Print ``line`` to stdout and flush (log lines show up at once in a file or pipe)."""
    print(line, flush=True)


def _at_least(minimum: int) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise HyperparameterError(
                attribute.name, value, f"must be an integer >= {minimum}", algorithm="train"
            )

    return check


def _optional(minimum: int) -> Callable[[Any, attrs.Attribute, Any], None]:
    check = _at_least(minimum)

    def optional(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


def _check_lr(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
        raise HyperparameterError(attribute.name, value, "must be a number > 0", algorithm="train")


@attrs.frozen
class TrainConfig:
    """Everything that defines one ``optiplug train`` run.

    Attributes:
        steps: optimizer steps in the run (also the schedule's horizon).
        batch_size: windows per optimizer step, over all processes.
        block_size: characters of context per window.
        n_layer: transformer blocks.
        d_model: embedding width.
        n_head: attention heads (must divide ``d_model``).
        optimizer: ``"auto"`` or a registered optimizer name.
        lr: base learning rate; None keeps the optimizer's (or selection's) own.
        impl: force an implementation (``"loop"``, ``"fused"``...); None measures.
        schedule: a registered schedule name.
        schedule_params: extra schedule parameters as ``(key, value)`` pairs.
        warmup_steps: warm-up for schedules that take one; None = ``steps // 20``.
        seed: seeds the weights, the data order and the sample.
        device: where to train.
        data: a text file or directory; None = the standard library.
        max_chars: character budget of the corpus.
        eval_every: steps between validation points; None = ``steps // 10``.
        eval_windows: validation windows per point on the curve.
        sample_chars: characters to generate at the end (0 = none).
        temperature: sampling temperature (0 = greedy).
        prompt: the sample's prompt; None = ``"def "`` when the vocabulary has it.
        save: directory to save to (``checkpoint/`` and ``train.json``), or None.
        save_every: save every N steps too (besides the end), or None.
        resume: directory to resume from, or None.
        stop_at: stop after this step (saving first), keeping the schedule over ``steps``.
        nproc: processes (torch.distributed, gloo); each gets ``batch_size / nproc``.
        threads: torch intra-op threads (per process); None keeps torch's default
            (with ``nproc``: the CPU count divided among the processes).
    """

    steps: int = attrs.field(default=500, validator=_at_least(1))
    batch_size: int = attrs.field(default=32, validator=_at_least(1))
    block_size: int = attrs.field(default=64, validator=_at_least(2))
    n_layer: int = attrs.field(default=3, validator=_at_least(1))
    d_model: int = attrs.field(default=96, validator=_at_least(1))
    n_head: int = attrs.field(default=4, validator=_at_least(1))
    optimizer: str = "adamw"
    lr: float | None = attrs.field(default=None, validator=_check_lr)
    impl: str | None = None
    schedule: str = "cosine"
    schedule_params: tuple[tuple[str, Any], ...] = attrs.field(
        default=(), converter=lambda pairs: tuple(tuple(p) for p in pairs)
    )
    warmup_steps: int | None = attrs.field(default=None, validator=_optional(0))
    seed: int = 0
    device: str = "cpu"
    data: str | None = None
    max_chars: int = attrs.field(default=1_500_000, validator=_at_least(1))
    eval_every: int | None = attrs.field(default=None, validator=_optional(1))
    eval_windows: int = attrs.field(default=256, validator=_at_least(1))
    sample_chars: int = attrs.field(default=200, validator=_at_least(0))
    temperature: float = 0.8
    prompt: str | None = None
    save: str | None = None
    save_every: int | None = attrs.field(default=None, validator=_optional(1))
    resume: str | None = None
    stop_at: int | None = attrs.field(default=None, validator=_optional(1))
    nproc: int = attrs.field(default=1, validator=_at_least(1))
    threads: int | None = attrs.field(default=None, validator=_optional(1))

    def __attrs_post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise HyperparameterError(
                "n_head", self.n_head, f"must divide d_model={self.d_model}", algorithm="train"
            )
        if self.batch_size % self.nproc:
            raise HyperparameterError(
                "batch_size",
                self.batch_size,
                f"must be divisible by nproc={self.nproc} (each process takes batch_size / nproc)",
                algorithm="train",
            )
        if self.nproc > 1 and self.device != "cpu":
            raise HyperparameterError(
                "device", self.device, "--nproc runs gloo processes on the CPU", algorithm="train"
            )

    @property
    def warmup(self) -> int:
        """The warm-up steps the schedule gets when it takes ``warmup_steps``."""
        return self.steps // 20 if self.warmup_steps is None else self.warmup_steps

    @property
    def eval_interval(self) -> int:
        """Steps between points of the validation curve."""
        return self.eval_every or max(1, self.steps // 10)

    @property
    def last_step(self) -> int:
        """The step this run stops at: ``stop_at`` when given (and earlier), else ``steps``."""
        return min(self.steps, self.stop_at or self.steps)


RESUMABLE_FIELDS = (
    "batch_size",
    "block_size",
    "n_layer",
    "d_model",
    "n_head",
    "optimizer",
    "lr",
    "impl",
    "schedule",
    "schedule_params",
    "warmup_steps",
    "seed",
    "data",
    "max_chars",
    "nproc",
)
"""Options a resumed run takes from ``train.json`` and may not change."""

SAVED_DEFAULTS = ("threads", "save_every")
"""Options a resumed run takes from ``train.json`` unless given (the thread count
changes the order of float sums, so keeping it keeps a resumed run bit-identical)."""


# ------------------------------------------------------------------ corpus
@attrs.frozen(eq=False)
class Corpus:
    """A character corpus split into training and validation token ids.

    Attributes:
        description: where the text came from, for the report.
        files: how many files were read.
        vocab: the characters, sorted; token ``i`` is ``vocab[i]``.
        train: token ids of the first 90% of the text.
        val: token ids of the last 10%.
    """

    description: str
    files: int
    vocab: str
    train: torch.Tensor
    val: torch.Tensor

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``.

        Raises:
            HyperparameterError: a character outside the vocabulary.
        """
        index = {c: i for i, c in enumerate(self.vocab)}
        missing = sorted({c for c in text if c not in index})
        if missing:
            raise HyperparameterError(
                "prompt", text, f"characters not in the corpus: {missing!r}", algorithm="train"
            )
        return [index[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids ``ids``."""
        return "".join(self.vocab[i] for i in ids)


def stdlib_files(max_chars: int) -> list[Path]:
    """The standard library's top-level ``*.py`` files, sorted, until ``max_chars`` bytes.

    Args:
        max_chars: stop once the files read reach this many bytes.

    Returns:
        The files, in name order.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        if total >= max_chars:
            break
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise OptiplugError(f"--data {str(path)!r}: no such file or directory")
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def _read_texts(paths: Sequence[Path], max_chars: int) -> tuple[str, int]:
    parts: list[str] = []
    total = used = 0
    for path in paths:
        if total >= max_chars:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not text
        if "\0" in text or not text:
            continue
        parts.append(text)
        total += len(text)
        used += 1
    return "\n".join(parts)[:max_chars], used


def load_corpus(data: str | os.PathLike[str] | None, max_chars: int = 1_500_000) -> Corpus:
    """Read the corpus and split it 90/10 into training and validation ids.

    Args:
        data: a UTF-8 text file or a directory of them (binary files and
            hidden paths are skipped); None = the standard library's sources.
        max_chars: the character budget.

    Returns:
        The :class:`Corpus`.

    Raises:
        OptiplugError: the path does not exist or holds no text.
    """
    if data is None:
        text, used = _read_texts(stdlib_files(max_chars), max_chars)
        version = ".".join(map(str, sys.version_info[:3]))
        description = f"Python {version} standard library ({sysconfig.get_paths()['stdlib']})"
    else:
        text, used = _read_texts(_text_files(Path(data)), max_chars)
        description = str(data)
        if not text:
            raise OptiplugError(f"--data {str(data)!r}: no UTF-8 text found")
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    points, ids = np.unique(codes, return_inverse=True)
    ids = torch.from_numpy(ids.astype(np.int64).reshape(-1))
    split = int(len(ids) * (1 - VALIDATION_FRACTION))
    vocab = "".join(map(chr, points.tolist()))
    return Corpus(description, used, vocab, ids[:split].clone(), ids[split:].clone())


def unigram_entropy(ids: torch.Tensor, vocab_size: int) -> float:
    """Entropy, in nats, of the character distribution of ``ids``.

    It is the loss of the best model that ignores context: a language model
    worth its name ends below it.
    """
    counts = torch.bincount(ids, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def windows(ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Consecutive windows of ``block_size + 1`` ids, one id of overlap: ``(n, block + 1)``."""
    if len(ids) < block_size + 1:
        return ids.new_empty((0, block_size + 1))
    return ids.unfold(0, block_size + 1, block_size)


def spread(rows: torch.Tensor, count: int) -> torch.Tensor:
    """At most ``count`` rows of ``rows``, evenly spaced (a fixed subset)."""
    if len(rows) <= count:
        return rows
    return rows[torch.linspace(0, len(rows) - 1, count).round().long()]


class Windows(torch.utils.data.Dataset):
    """Training windows as ``{"tokens": ids[:-1], "targets": ids[1:]}`` mappings."""

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        self.rows = windows(ids, block_size)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.rows[index]
        return {"tokens": row[:-1], "targets": row[1:]}


# ------------------------------------------------------------------ model
class _Block(torch.nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc = torch.nn.Linear(d_model, 4 * d_model)
        self.out = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        heads = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, d // self.n_head)
        q, k, v = heads.permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharTransformer(torch.nn.Module):
    """A GPT-style decoder over characters (pre-LayerNorm, learned positions, no dropout).

    Args:
        vocab_size: number of distinct characters.
        block_size: longest context.
        n_layer: transformer blocks.
        d_model: embedding width.
        n_head: attention heads.
    """

    def __init__(
        self, vocab_size: int, *, block_size: int, n_layer: int, d_model: int, n_head: int
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.embed = torch.nn.Embedding(vocab_size, d_model)
        self.position = torch.nn.Embedding(block_size, d_model)
        self.blocks = torch.nn.ModuleList(_Block(d_model, n_head) for _ in range(n_layer))
        self.ln = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, vocab)`` of the next character at every position."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(self.ln(hidden))


def _init_weights(module: torch.nn.Module) -> None:
    if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        torch.nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, torch.nn.Linear) and module.bias is not None:
        torch.nn.init.zeros_(module.bias)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Cross-entropy (nats per character) of ``logits`` against ``targets``."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), **kwargs)


@torch.no_grad()
def mean_loss(module: torch.nn.Module, rows: torch.Tensor, device: torch.device) -> float:
    """Mean next-character loss of ``module`` over windows ``rows`` (nats per character).

    Args:
        module: the (unwrapped) model; put back in its mode afterwards.
        rows: windows of ``block_size + 1`` ids.
        device: where the model is.

    Returns:
        The loss, averaged over every predicted character.
    """
    was_training = module.training
    module.eval()
    total, count = 0.0, 0
    for chunk in rows.split(_EVAL_BATCH):
        chunk = chunk.to(device)
        logits = module(chunk[:, :-1])
        total += float(next_token_loss(logits, chunk[:, 1:], reduction="sum"))
        count += chunk[:, 1:].numel()
    module.train(was_training)
    return total / max(1, count)


@torch.no_grad()
def generate(
    module: CharTransformer,
    prompt: Sequence[int],
    length: int,
    *,
    temperature: float = 0.8,
    seed: int = 0,
) -> list[int]:
    """Continue ``prompt`` by ``length`` sampled characters.

    Args:
        module: the model.
        prompt: token ids to start from (at least one).
        length: characters to add.
        temperature: softmax temperature; 0 picks the most likely character.
        seed: seeds a private generator (the global RNG is not touched).

    Returns:
        The ids generated after the prompt.
    """
    was_training = module.training
    module.eval()
    device = next(module.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(length):
        context = torch.tensor([ids[-module.block_size :]], device=device)
        logits = module(context)[0, -1].float().cpu()
        if temperature <= 0:
            ids.append(int(logits.argmax()))
        else:
            probabilities = torch.softmax(logits / temperature, dim=-1)
            ids.append(int(torch.multinomial(probabilities, 1, generator=generator)))
    module.train(was_training)
    return ids[len(prompt) :]


# ------------------------------------------------------------------ progress
class Progress:
    """A progress line on a terminal, or a few log lines elsewhere.

    On a TTY (and unless ``quiet``) it redraws one line on ``stream`` with the
    step, steps/s, loss, validation loss, lr and time left. Otherwise it stays
    silent between validation points and logs one line at each.

    Args:
        total: the step the run ends at.
        start: the step it starts from (after a resume).
        stream: where the bar goes (default ``sys.stderr``).
        quiet: never draw the bar.
        log: where log lines go (default ``print``); None drops them.
        label: a prefix, e.g. the optimizer's name.
    """

    def __init__(
        self,
        total: int,
        *,
        start: int = 0,
        stream: IO[str] | None = None,
        quiet: bool = False,
        log: Callable[[str], None] | None = echo,
        label: str = "",
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.bar = not quiet and _is_tty(self.stream)
        self.total, self.start, self.label = total, start, label
        self.log = log
        self.began = time.perf_counter()
        self.drawn = 0.0
        self.step = start
        self.loss = self.val = self.lr = math.nan

    def update(self, step: int, loss: float, lr: float) -> None:
        """Record a training step; redraw the bar at most ten times a second."""
        self.step, self.loss, self.lr = step, loss, lr
        now = time.perf_counter()
        if self.bar and (now - self.drawn >= 0.1 or step >= self.total):
            self.drawn = now
            self.stream.write("\r" + self.line(bar=True))
            self.stream.flush()

    def evaluated(self, step: int, val: float) -> None:
        """Record a validation point; off a terminal, log a line."""
        self.step, self.val = step, val
        if not self.bar and self.log is not None:
            self.log(self.line(bar=False))

    def close(self) -> None:
        """End the bar's line."""
        if self.bar:
            self.stream.write("\r" + self.line(bar=True) + "\n")
            self.stream.flush()

    def rate(self) -> float:
        """Steps per second since the start."""
        elapsed = time.perf_counter() - self.began
        return (self.step - self.start) / elapsed if elapsed > 0 else 0.0

    def line(self, *, bar: bool) -> str:
        """The progress text: step, bar (on a TTY), speed, losses, lr, time left."""
        width = len(str(self.total))
        parts = [f"{self.label}step {self.step:>{width}}/{self.total}"]
        if bar:
            done = self.step / max(1, self.total)
            parts.append(f"[{'#' * round(20 * done):.<20}] {100 * done:3.0f}%")
        rate = self.rate()
        parts.append(f"{rate:5.1f} steps/s")
        if not math.isnan(self.loss):
            parts.append(f"loss {self.loss:.3f}")
        if not math.isnan(self.val):
            parts.append(f"val {self.val:.3f}")
        if not math.isnan(self.lr):
            parts.append(f"lr {self.lr:.2e}")
        if bar and rate > 0:
            parts.append(f"eta {_duration((self.total - self.step) / rate)}")
        return "  ".join(parts)


def _is_tty(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed
        return False


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


# ------------------------------------------------------------------ the run
@attrs.frozen
class TrainResult:
    """What one training run measured.

    Attributes:
        optimizer: the algorithm's name.
        hyperparameters: its main hyperparameters as built (lr, betas, ...).
        schedule: the schedule, as text.
        parameters: the model's parameter count.
        start_step: the step the run started from (after a resume).
        steps: the step it ended at.
        initial_val_loss: validation loss (curve subset) at ``start_step``.
        train_loss: loss on a fixed, evenly spaced subset of training windows.
        val_loss: loss on the validation split (up to 4096 windows).
        baseline: unigram entropy of the training split (nats).
        seconds: wall time of the training loop and its evaluations.
        curve: ``(step, training batch loss)`` of every step.
        val_curve: ``(step, validation loss)`` at each evaluation point.
        sample: generated text (after ``prompt``).
        prompt: the sample's prompt.
        saved: where the run saved its checkpoint, or None.
        reason: why ``AutoOptimizer`` chose the optimizer (``--optimizer auto``).
    """

    optimizer: str
    hyperparameters: dict[str, Any]
    schedule: str
    parameters: int
    start_step: int
    steps: int
    initial_val_loss: float
    train_loss: float
    val_loss: float
    baseline: float
    seconds: float
    curve: tuple[tuple[int, float], ...]
    val_curve: tuple[tuple[int, float], ...]
    sample: str
    prompt: str
    saved: str | None = None
    reason: str = ""


def _accepts(factory: Any, keyword: str) -> bool:
    try:
        return keyword in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def make_schedule(config: TrainConfig) -> Any:
    """The run's schedule: ``config.schedule`` over ``config.steps`` with its warm-up.

    ``total_steps`` and ``warmup_steps`` are filled in for schedules that take
    them, unless ``schedule_params`` sets them.

    Raises:
        UnknownScheduleError: no such schedule.
        HyperparameterError: a missing or invalid schedule parameter.
    """
    spec = default_registry().schedule_spec(config.schedule)
    kwargs = dict(config.schedule_params)
    if _accepts(spec.factory, "total_steps"):
        kwargs.setdefault("total_steps", config.steps)
    if _accepts(spec.factory, "warmup_steps"):
        kwargs.setdefault("warmup_steps", config.warmup)
    return build_schedule(spec, kwargs)


def resolve_optimizer(
    name: str,
    model: torch.nn.Module,
    *,
    lr: float | None = None,
    impl: str | None = None,
) -> Any:
    """The optimizer factory for ``name`` (``"auto"`` asks ``AutoOptimizer``).

    Args:
        name: ``"auto"`` or a registered optimizer name.
        model: the model (``auto`` counts its parameters).
        lr: overrides the learning rate, when given.
        impl: forces an implementation, when given.

    Returns:
        An :class:`~optiplug.OptimizerFactory` (a :class:`~optiplug.Selection` for auto).

    Raises:
        UnknownOptimizerError: ``name`` is not installed.
        HyperparameterError: ``lr`` is invalid for it.
    """
    overrides = {} if lr is None else {"lr": lr}
    if name != "auto":
        return make_factory(name, impl=impl, **overrides)
    selection = AutoOptimizer.for_model(model, task="causal-lm", stage="pretraining")
    make_factory(selection.name, impl=impl, **{**selection.hparams, **overrides})  # validate
    return attrs.evolve(selection, hparams={**selection.hparams, **overrides}, impl=impl)


def build_graph(config: TrainConfig, corpus: Corpus) -> tuple[Graph, Any]:
    """Seed, build the model, and wire it to optimizer, schedule and data in a Graph.

    Under ``torch.distributed`` each process loads ``batch_size / world`` windows
    per step (the Graph shards the data and wraps the model in DDP).

    Returns:
        The Graph and the optimizer factory it was given.

    Raises:
        UnknownOptimizerError: no such optimizer.
        HyperparameterError: invalid hyperparameters or schedule parameters.
    """
    world = _ranks.world_size()
    dataset = Windows(corpus.train, config.block_size)
    per_rank = config.batch_size // world
    torch.manual_seed(config.seed)
    model = CharTransformer(
        len(corpus.vocab),
        block_size=config.block_size,
        n_layer=config.n_layer,
        d_model=config.d_model,
        n_head=config.n_head,
    )
    graph = Graph(model, device=config.device, seed=config.seed)
    graph.set_scheduler(make_schedule(config))
    chosen = resolve_optimizer(config.optimizer, model, lr=config.lr, impl=config.impl)
    graph.set_optimizer(chosen)
    loader = torch.utils.data.DataLoader(dataset, batch_size=per_rank, shuffle=True, drop_last=True)
    graph.set_data_loader(loader, forward_input="tokens")
    return graph, chosen


def _require_checkpoints(graph: Graph, option: str) -> None:
    if not (hasattr(graph, "save") and hasattr(graph, "load")):
        raise OptiplugError(
            f"{option} needs Graph.save/Graph.load, which this version of optiplug lacks"
        )


def _run_file_payload(config: TrainConfig, corpus: Corpus, step: int) -> dict[str, Any]:
    options = {name: getattr(config, name) for name in RESUMABLE_FIELDS + SAVED_DEFAULTS}
    options["schedule_params"] = [list(pair) for pair in config.schedule_params]
    return {
        "format": _RUN_FILE_VERSION,
        "step": step,
        "steps": config.steps,
        "options": options,
        "vocab": corpus.vocab,
    }


def save_run(graph: Graph, config: TrainConfig, corpus: Corpus) -> Path:
    """Save the Graph to ``save/checkpoint`` and the run's options to ``save/train.json``.

    Every process calls it (the Graph coordinates its own checkpoint); rank 0
    writes ``train.json``, atomically.

    Returns:
        The save directory.
    """
    assert config.save is not None
    directory = Path(config.save)
    directory.mkdir(parents=True, exist_ok=True)
    graph.save(directory / CHECKPOINT_NAME)
    if _ranks.rank() == 0:
        payload = _run_file_payload(config, corpus, graph.training_step)
        temporary = directory / f".{RUN_FILE}.tmp"
        temporary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, directory / RUN_FILE)
    return directory


def read_run_file(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``train.json`` a saved run left in ``directory``.

    Returns:
        ``{"format", "step", "steps", "options", "vocab"}``.

    Raises:
        OptiplugError: no readable ``train.json`` (not a directory written by ``--save``).
    """
    path = Path(directory) / RUN_FILE
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise OptiplugError(
            f"--resume {str(directory)!r}: not a directory saved by `optiplug train --save` "
            f"({path.name}: {error})"
        ) from None
    if payload.get("format") != _RUN_FILE_VERSION:
        raise OptiplugError(f"--resume {str(directory)!r}: unknown {RUN_FILE} format")
    return payload


def _resume(graph: Graph, config: TrainConfig, corpus: Corpus) -> None:
    assert config.resume is not None
    _require_checkpoints(graph, "--resume")
    saved = read_run_file(config.resume)
    if saved["vocab"] != corpus.vocab:
        raise OptiplugError(
            f"--resume {config.resume!r}: the corpus's characters differ from the saved run's"
        )
    graph.load(Path(config.resume) / CHECKPOINT_NAME)
    if saved["steps"] != config.steps:  # a longer (or shorter) run: stretch the schedule
        graph.set_scheduler(make_schedule(config))


@attrs.define
class _Curves:
    train: list[tuple[int, float]] = attrs.Factory(list)
    val: list[tuple[int, float]] = attrs.Factory(list)
    saved_at: int | None = None


class _Evaluator:
    """The fixed validation windows and the curve's points (rank 0 only)."""

    def __init__(self, graph: Graph, config: TrainConfig, corpus: Corpus, active: bool) -> None:
        self.graph, self.config, self.active = graph, config, active
        self.val_rows = windows(corpus.val, config.block_size)
        self.curve_rows = spread(self.val_rows, config.eval_windows)

    def due(self, step: int) -> bool:
        return self.active and (
            step % self.config.eval_interval == 0 or step >= self.config.last_step
        )

    def point(self, step: int, curves: _Curves, progress: Progress) -> float:
        loss = mean_loss(self.graph.module, self.curve_rows, self.graph.device)
        curves.val.append((step, loss))
        progress.evaluated(step, loss)
        return loss


def _steps(graph: Graph, last_step: int) -> Iterator[torch.Tensor]:
    """Train until ``last_step``, yielding each step's loss (after the step)."""
    while graph.training_step < last_step:
        epoch = graph.data_position[0]
        with contextlib.closing(graph.epoch(epoch)) as batches:
            for batch in batches:
                logits = graph.forward_batch(batch)
                loss = next_token_loss(logits, graph.targets(batch)["targets"])
                graph.backward(loss)
                graph.step()
                yield loss.detach()
                if graph.training_step >= last_step:
                    return


def _loop(
    graph: Graph, config: TrainConfig, corpus: Corpus, evaluator: _Evaluator, progress: Progress
) -> _Curves:
    curves = _Curves()
    if evaluator.active:
        evaluator.point(graph.training_step, curves, progress)
    for loss in _steps(graph, config.last_step):
        step, value = graph.training_step, float(loss)
        curves.train.append((step, value))
        progress.update(step, value, float(graph.optimizer.param_groups[0]["lr"]))
        if evaluator.due(step) and step != curves.val[-1][0]:
            evaluator.point(step, curves, progress)
        if config.save and config.save_every and step % config.save_every == 0:
            save_run(graph, config, corpus)
            curves.saved_at = step
    progress.close()
    return curves


def _prompt(config: TrainConfig, corpus: Corpus) -> str:
    if config.prompt is not None:
        return config.prompt
    if all(c in corpus.vocab for c in "def "):
        return "def "
    return corpus.decode(corpus.train[:1].tolist())


def _hyperparameters(graph: Graph) -> dict[str, Any]:
    assert graph.optimizer is not None
    shown = ("betas", "momentum", "weight_decay", "nesterov")
    found = {k: v for k, v in graph.optimizer.defaults.items() if k in shown}
    return {"lr": graph.base_lrs[0], **found}


def _finish(
    graph: Graph,
    config: TrainConfig,
    corpus: Corpus,
    curves: _Curves,
    start: int,
    seconds: float,
) -> dict[str, Any]:
    """Final losses and the sample (rank 0)."""
    val_rows = spread(windows(corpus.val, config.block_size), _FINAL_WINDOWS)
    train_rows = spread(windows(corpus.train, config.block_size), len(val_rows))
    prompt = _prompt(config, corpus)
    ids = generate(
        graph.module,
        corpus.encode(prompt),
        config.sample_chars,
        temperature=config.temperature,
        seed=config.seed,
    )
    return {
        "start_step": start,
        "steps": graph.training_step,
        "initial_val_loss": curves.val[0][1],
        "train_loss": mean_loss(graph.module, train_rows, graph.device),
        "val_loss": mean_loss(graph.module, val_rows, graph.device),
        "baseline": unigram_entropy(corpus.train, len(corpus.vocab)),
        "seconds": seconds,
        "curve": tuple(curves.train),
        "val_curve": tuple(curves.val),
        "sample": corpus.decode(ids),
        "prompt": prompt,
        "saved": config.save,
    }


def check_run(config: TrainConfig, corpus: Corpus) -> None:
    """Refuse, before training, what would fail later: corpus size, prompt, device.

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


def _start(graph: Graph, config: TrainConfig, corpus: Corpus) -> int:
    """Check checkpoints can be written, resume if asked; the step training starts from."""
    if config.save:
        _require_checkpoints(graph, "--save")
    if config.resume:
        _resume(graph, config, corpus)
    return graph.training_step


def _result(graph: Graph, chosen: Any, measured: dict[str, Any]) -> TrainResult:
    return TrainResult(
        optimizer=chosen.name,
        hyperparameters=_hyperparameters(graph),
        schedule=repr(graph.schedule),
        parameters=sum(p.numel() for p in graph.parameters()),
        reason=getattr(chosen, "reason", ""),
        **measured,
    )


def train(
    config: TrainConfig,
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
    """
    corpus = corpus if corpus is not None else load_corpus(config.data, config.max_chars)
    check_run(config, corpus)
    rank = _ranks.rank()
    graph, chosen = build_graph(config, corpus)
    start = _start(graph, config, corpus)
    lead = rank == 0
    progress = Progress(
        config.last_step,
        start=start,
        stream=stream,
        quiet=quiet or not lead,
        log=log if lead else None,
        label=label,
    )
    began = time.perf_counter()
    curves = _loop(graph, config, corpus, _Evaluator(graph, config, corpus, lead), progress)
    seconds = time.perf_counter() - began
    if config.save and curves.saved_at != graph.training_step:
        save_run(graph, config, corpus)
    if rank != 0:
        torch.distributed.barrier()
        return None
    measured = _finish(graph, config, corpus, curves, start, seconds)
    if _ranks.active():
        torch.distributed.barrier()
    return _result(graph, chosen, measured)


# ------------------------------------------------------------------ compare
@attrs.frozen
class Skipped:
    """An optimizer ``--compare`` could not run, and why."""

    name: str
    reason: str


def unavailable(name: str) -> str | None:
    """Why optimizer ``name`` cannot be used here (``"not installed"``...), or None when it can."""
    from ..errors import UnknownOptimizerError

    if name == "auto":
        return None
    try:
        default_registry().spec(name)
    except UnknownOptimizerError:
        return "not installed"
    except (OptimizerUnavailableError, OptiplugError) as error:
        return str(error)
    return None


def _installed() -> str:
    from .._api import optimizers

    return f"installed: {', '.join(optimizers())}"


def availability(entries: Sequence[tuple[str, float | None]]) -> dict[str, str | None]:
    """Why each optimizer of ``entries`` cannot run (None for those that can).

    Raises:
        OptiplugError: none of them can run.
    """
    reasons = {name: unavailable(name) for name, _ in entries}
    if all(reasons.values()):
        details = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
        raise OptiplugError(f"--compare: no optimizer to run ({details}); {_installed()}")
    return reasons


def parse_compare(text: str) -> list[tuple[str, float | None]]:
    """Parse ``--compare adamw,lion=3e-4,sgd=0.1`` into ``(name, lr or None)`` pairs.

    Raises:
        HyperparameterError: an empty list, a repeated name or an unreadable lr.
    """
    entries: list[tuple[str, float | None]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, lr = item.partition("=")
        try:
            value = float(lr) if lr else None
        except ValueError:
            raise HyperparameterError("compare", item, "expected NAME or NAME=LR") from None
        entries.append((name.strip(), value))
    names = [name for name, _ in entries]
    if not entries or len(set(names)) != len(names):
        raise HyperparameterError(
            "compare", text, "expected distinct names separated by commas, e.g. adamw,lion,muon"
        )
    return entries


def compare(
    config: TrainConfig,
    entries: Sequence[tuple[str, float | None]],
    corpus: Corpus | None = None,
    *,
    log: Callable[[str], None] | None = echo,
    stream: IO[str] | None = None,
    quiet: bool = False,
) -> list[TrainResult | Skipped]:
    """Train each optimizer of ``entries`` on identical data, seed and schedule.

    Args:
        config: the run every optimizer gets (its ``optimizer`` and ``lr`` are replaced).
        entries: ``(name, lr)``; a None lr keeps ``config.lr`` or the optimizer's default.
        corpus: the corpus, if already loaded.
        log: where log lines go; None drops them.
        stream: where the progress bars go.
        quiet: log lines instead of progress bars.

    Returns:
        A :class:`TrainResult` per trained optimizer, a :class:`Skipped` per missing one.

    Raises:
        OptiplugError: none of the optimizers is installed.
    """
    reasons = availability(entries)
    corpus = corpus if corpus is not None else load_corpus(config.data, config.max_chars)
    results: list[TrainResult | Skipped] = []
    for name, lr in entries:
        reason = reasons[name]
        if reason is not None:
            if log is not None:
                log(f"{name}: skipped, {reason} ({_installed()})")
            results.append(Skipped(name, reason))
            continue
        run = attrs.evolve(config, optimizer=name, lr=config.lr if lr is None else lr)
        result = train(run, corpus, log=log, stream=stream, quiet=quiet, label=f"{name}: ")
        assert result is not None
        results.append(result)
    return results


def smooth(values: Sequence[float], weight: float = 0.9) -> list[float]:
    """Exponential moving average with bias correction (as TensorBoard draws it)."""
    out, average = [], 0.0
    for i, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i))
    return out


def plot_losses(
    results: Sequence[TrainResult], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Plot each run's training loss (smoothed) and validation points, and the baseline.

    Args:
        results: the runs (the first one's baseline is drawn).
        path: the image file; its suffix picks the format.
        title: the figure title.

    Returns:
        The path written.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 4.2), layout="constrained")
    axes = figure.subplots()
    for index, result in enumerate(results):
        color = f"C{index}"
        steps, losses = zip(*result.curve, strict=True) if result.curve else ((), ())
        axes.plot(
            steps, smooth(losses), color=color, linewidth=1.4, label=f"{result.optimizer} train"
        )
        val_steps, val_losses = zip(*result.val_curve, strict=True)
        axes.plot(
            val_steps,
            val_losses,
            "o--",
            color=color,
            markersize=3.5,
            linewidth=1,
            label=f"{result.optimizer} val",
        )
    if results:
        axes.axhline(
            results[0].baseline,
            color="0.4",
            linestyle=":",
            label=f"unigram baseline ({results[0].baseline:.2f})",
        )
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss (nats per character)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, ncols=2)
    axes.set_title(title, fontsize=9)
    figure.savefig(path, dpi=110)
    return Path(path)


# ------------------------------------------------------------------ processes
@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Use ``count`` torch intra-op threads inside the block (None: leave them alone).

    On a machine shared with other work, fewer threads than cores is often much
    faster: spinning OpenMP threads wait for each other on every small op.
    """
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, config: TrainConfig, port: int, out: str, quiet: bool) -> None:
    """One process of a ``--nproc`` run (the target of ``torch.multiprocessing.spawn``)."""
    import datetime

    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // config.nproc))
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=config.nproc,
        timeout=datetime.timedelta(minutes=5),
    )
    try:
        result = train(config, log=echo if rank == 0 else None, quiet=quiet)
        if result is not None:
            Path(out).write_bytes(pickle.dumps(result))
        torch.distributed.barrier()  # every rank done before anyone tears down
    finally:
        gc.collect()  # drop DDP's reducer before its gloo group goes (else: abort at exit)
        torch.distributed.destroy_process_group()


def launch(config: TrainConfig, *, quiet: bool = False) -> TrainResult:
    """Run ``config`` in ``config.nproc`` processes (gloo on 127.0.0.1, a free port).

    Every process builds the same seeded Graph, which wraps the model in DDP
    and gives each process its shard of every global batch
    (``batch_size / nproc`` windows); gradients are averaged, so the global
    batch and the learning rate are those of a one-process run. Rank 0 prints.

    Returns:
        Rank 0's :class:`TrainResult`.

    Raises:
        OptiplugError: a process failed (its last error line is quoted).
    """
    from torch.multiprocessing.spawn import ProcessException

    check_run(config, load_corpus(config.data, config.max_chars))
    with tempfile.TemporaryDirectory(prefix="optiplug-train-") as scratch:
        out = Path(scratch) / "result.pickle"
        try:
            torch.multiprocessing.spawn(
                _worker, args=(config, _free_port(), str(out), quiet), nprocs=config.nproc
            )
        except ProcessException as error:
            lines = [line for line in str(error).splitlines() if line.strip()]
            raise OptiplugError(
                f"--nproc {config.nproc}: a process failed: {lines[-1] if lines else error}"
            ) from error
        return pickle.loads(out.read_bytes())

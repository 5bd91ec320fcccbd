"""What the user sees: the progress line, the report, comparison and race tables, the plots.

Importing this module does not import torch; matplotlib (the ``plot`` extra)
is imported only by :func:`plot_losses` and :func:`plot_race`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from optiplug.cli import format_table

from .config import TrainConfig
from .cpus import ThreadChoice
from .results import Estimate, RaceResult, RaceRow, Skipped, TrainResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from .data import Corpus

__all__ = [
    "Progress",
    "compare_table",
    "echo",
    "format_hparams",
    "header",
    "plot_losses",
    "plot_race",
    "race_notes",
    "race_table",
    "report",
    "run_header",
    "smooth",
]


def echo(line: str) -> None:
    """Print ``line`` to stdout and flush (log lines show up at once in a file or pipe)."""
    print(line, flush=True)


# ------------------------------------------------------------------ progress
class Progress:
    """A progress line on a terminal, or a few log lines elsewhere.

    On a TTY (and unless ``quiet``) it redraws one line on ``stream`` with the
    step, steps/s, loss, validation loss, lr and time left. Each redraw
    returns to the start of the line with ``\\r`` and pads the new text with
    spaces to the previous one's length, so no character of a longer earlier
    line is left behind; the line is cut to the terminal's width (a wrapped
    line could not be redrawn). The last line shows the time taken instead of
    the time left, and ends the line. Otherwise it stays silent between
    validation points and logs one line at each.

    Args:
        total: the step the run ends at.
        start: the step it starts from (after a resume).
        stream: where the bar goes (default ``sys.stderr``).
        quiet: never draw the bar.
        log: where log lines go (default ``print``); None drops them.
        label: a prefix, e.g. the optimizer's name.
        val_label: what the validation loss is called, e.g. ``"val(256w)"``
            for a loss measured on 256 windows.
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
        val_label: str = "val",
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.bar = not quiet and _is_tty(self.stream)
        self.total, self.start, self.label, self.val_label = total, start, label, val_label
        self.log = log
        self.began = time.perf_counter()
        self.drawn = 0.0
        self.shown = 0  # characters of the line on screen now
        self.step = start
        self.loss = self.val = self.lr = self.grad_norm = math.nan

    def update(self, step: int, loss: float, lr: float, grad_norm: float | None = None) -> None:
        """Record a training step (and its gradient norm, when measured); redraw at most 10/s."""
        self.step, self.loss, self.lr = step, loss, lr
        self.grad_norm = math.nan if grad_norm is None else grad_norm
        now = time.perf_counter()
        if self.bar and (now - self.drawn >= 0.1 or step >= self.total):
            self.drawn = now
            self._draw(self.line(bar=True))

    def evaluated(self, step: int, val: float) -> None:
        """Record a validation point; off a terminal, log a line."""
        self.step, self.val = step, val
        if not self.bar and self.log is not None:
            self.log(self.line(bar=False))

    def close(self) -> None:
        """Draw the final line (time taken, not time left) and end it."""
        if self.bar:
            self._draw(self.line(bar=True, final=True), end="\n")

    def _draw(self, text: str, end: str = "") -> None:
        """Rewrite the line: ``\\r``, the text cut to the terminal, padded over the last one."""
        columns = _columns(self.stream)
        if columns is not None and len(text) >= columns:
            text = text[: max(1, columns - 1)]
        self.stream.write("\r" + text.ljust(self.shown) + end)
        self.stream.flush()
        self.shown = 0 if end else len(text)

    def rate(self) -> float:
        """Steps per second since the start."""
        elapsed = time.perf_counter() - self.began
        return (self.step - self.start) / elapsed if elapsed > 0 else 0.0

    def line(self, *, bar: bool, final: bool = False) -> str:
        """The progress text: step, bar (on a TTY), speed, losses, lr, time left (or taken)."""
        width = len(str(self.total))
        parts = [f"{self.label}step {self.step:>{width}}/{self.total}"]
        if bar:
            done = self.step / max(1, self.total)
            parts.append(f"[{'#' * round(20 * done):.<20}] {100 * done:3.0f}%")
        rate = self.rate()
        parts.append(f"{rate:5.1f} steps/s")
        for name, value in (("loss", self.loss), (self.val_label, self.val)):
            if not math.isnan(value):
                parts.append(f"{name} {value:.3f}")
        if not math.isnan(self.lr):
            parts.append(f"lr {self.lr:.2e}")
        if not math.isnan(self.grad_norm):
            parts.append(f"gnorm {self.grad_norm:.3g}")
        if bar and final:
            parts.append(f"in {_duration(time.perf_counter() - self.began)}")
        elif bar and rate > 0:
            parts.append(f"eta {_duration((self.total - self.step) / rate)}")
        return "  ".join(parts)


def _columns(stream: IO[str]) -> int | None:
    """The width of the terminal ``stream`` writes to, or None when it is not one."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


def _is_tty(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed
        return False


def _duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


# ------------------------------------------------------------------ tables
def format_hparams(hparams: dict[str, Any]) -> str:
    """``lr=0.001, betas=(0.9, 0.95)``: floats in ``%g``, the rest as ``repr``."""
    return ", ".join(
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value!r}"
        for key, value in hparams.items()
    )


def header(config: TrainConfig, corpus: Corpus, threads: ThreadChoice | None = None) -> str:
    """The lines printed before training: corpus, model, batch, device and threads.

    Args:
        config: the run.
        corpus: its corpus.
        threads: the torch threads per process, and why (None: not shown).

    Returns:
        Five lines of text (four without ``threads``; one more with ``--clip``).
    """
    total = len(corpus.train) + len(corpus.val)
    processes = f", {config.nproc} processes" if config.nproc > 1 else ""
    clip = (
        [f"clip:   global gradient norm (L2) clipped to {config.clip:g} before every step"]
        if config.clip is not None
        else []
    )
    per_process = " per process" if config.nproc > 1 else ""
    device = (
        [f"device: {config.device}; threads: {threads.threads}{per_process} ({threads.why})"]
        if threads is not None
        else []
    )
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
            *device,
            *clip,
        ]
    )


def run_header(
    *,
    parameters: int,
    optimizer: str,
    hyperparameters: dict[str, Any],
    schedule: str,
    steps: tuple[int, int],
    impl: str | None = None,
    reason: str = "",
) -> str:
    """What is about to be trained, printed before the first step.

    Args:
        parameters: the model's parameter count.
        optimizer: the optimizer's name.
        hyperparameters: its effective hyperparameters (defaults and overrides).
        schedule: the schedule, as its ``repr``.
        steps: the step training starts from and the one it stops at.
        impl: the forced implementation, or None (measured).
        reason: why ``AutoOptimizer`` chose it, if it did.

    Returns:
        Lines of text.
    """
    forced = f"; implementation {impl} (--impl)" if impl else ""
    start, stop = steps
    return "\n".join(
        [
            f"optimizer: {optimizer} ({format_hparams(hyperparameters)}){forced}",
            *([f"           chosen because: {reason}"] if reason else []),
            f"schedule:  {schedule}",
            f"training:  {parameters:,} parameters, steps {start} to {stop}",
        ]
    )


def report(result: TrainResult, config: TrainConfig) -> str:
    """The report of one run: optimizer, schedule, speed, the loss table, the sample.

    Args:
        result: what the run measured.
        config: the run.

    Returns:
        Lines of text.
    """
    rate = (result.steps - result.start_step) / result.seconds if result.seconds else 0.0
    resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
    lines = [
        f"optimizer: {result.optimizer} ({format_hparams(result.hyperparameters)})",
        *([f"           chosen because: {result.reason}"] if result.reason else []),
        f"schedule:  {result.schedule}",
        f"trained {result.parameters:,} parameters to step {result.steps}{resumed} in "
        f"{result.seconds:.1f} s ({rate:.1f} steps/s)",
        "",
        _loss_table(result),
    ]
    if result.grad_norm is not None:
        clipped = f", clipped to {config.clip:g}" if config.clip is not None else ""
        lines += ["", f"gradient norm at the last step: {result.grad_norm:.4g}{clipped}"]
    if result.skipped:
        lines += ["", f"skipped {result.skipped} step(s) whose loss or gradient was not finite"]
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


def _loss_table(result: TrainResult) -> str:
    initial = result.initial_val_loss
    windows = f"all {result.val_windows:,} windows" if result.val_windows else "the whole split"
    start = f"step {result.start_step}: {initial:.4f}"
    curve = f" ({result.curve_windows:,} windows)" if result.curve_windows else ""
    rows = [
        ["train", f"{result.train_loss:.4f}", ""],
        ["validation", f"{result.val_loss:.4f}", f"{windows}; {start}{curve}"],
        ["unigram baseline", f"{result.baseline:.4f}", "entropy of the training characters"],
    ]
    return format_table(["loss", "nats/char", "note"], rows)


def compare_table(results: Sequence[TrainResult | Skipped]) -> str:
    """One row per optimizer of a ``--compare``: lr, losses and time, or why it was skipped.

    Args:
        results: the runs, in order.

    Returns:
        The table, as text.
    """
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
    header_row = ["optimizer", "lr", "train loss", "val loss", "seconds", "note"]
    return format_table(header_row, rows)


def _estimate_cell(value: Estimate, digits: str) -> str:
    """``1.7744 ± 0.0032``: the mean and the interval's half-width (the mean alone for one seed)."""
    mean = format(value.mean, digits)
    return mean if math.isnan(value.half_width) else f"{mean} ± {value.half_width:{digits}}"


def _target_cell(row: RaceRow, value: Estimate | None, digits: str) -> str:
    if value is None:
        return f"not reached ({row.missed} of {len(row.seeds)} seeds)"
    return _estimate_cell(value, digits)


def _p_cell(p: float | None) -> str:
    return "-" if p is None else f"{p:.2g}"


def _verdict(row: RaceRow, first: RaceRow, alpha: float) -> str:
    """What a row's p-values say against the first row: ``lower val loss, fewer steps (p < 0.01)``."""
    if len(row.seeds) < 2:
        return "one seed: no test"
    found = []
    if row.p_val_loss is not None and row.p_val_loss < alpha:
        found.append(
            "lower val loss" if row.val_loss.mean < first.val_loss.mean else "higher val loss"
        )
    if row.p_steps is not None and row.p_steps < alpha and row.steps and first.steps:
        found.append("fewer steps" if row.steps.mean < first.steps.mean else "more steps")
    if not found:
        return f"no significant difference from {first.optimizer}"
    return f"{', '.join(found)} than {first.optimizer} (p < {alpha:g})"


def race_table(race: RaceResult) -> str:
    """One row per optimizer of a race: lr, steps and seconds to target, final loss, p-values.

    Each figure is the mean over the seeds ± the half-width of its 95%
    Student-t interval; a target some seed never reached reads
    ``not reached (k of N seeds)``, k the seeds that missed it.

    Args:
        race: what the race measured.

    Returns:
        The table, as text.
    """
    targeted = race.target is not None
    header_row = ["optimizer", "lr"]
    if targeted:
        header_row += ["steps to target", "seconds to target"]
    header_row += ["val loss", "p (val loss)"] + (["p (steps)"] if targeted else []) + ["note"]
    rows = []
    for index, row in enumerate(race.rows):
        cells = [row.optimizer, f"{row.lr:g}"]
        if targeted:
            cells += [_target_cell(row, row.steps, ".1f"), _target_cell(row, row.seconds, ".3g")]
        cells += [_estimate_cell(row.val_loss, ".4f"), _p_cell(row.p_val_loss)]
        cells += [_p_cell(row.p_steps)] if targeted else []
        cells.append("reference" if index == 0 else _verdict(row, race.rows[0], race.alpha))
        rows.append(cells)
    for gone in race.skipped:
        rows.append([gone.name, *["-"] * (len(header_row) - 2), f"skipped: {gone.reason}"])
    return format_table(header_row, rows)


def race_notes(race: RaceResult, config: TrainConfig) -> str:
    """What the race table's figures are: seeds, intervals, the test, the target's resolution.

    Args:
        race: what the race measured.
        config: the run every optimizer got.

    Returns:
        Lines of text.
    """
    seeds = ", ".join(str(seed) for seed in race.seeds)
    reference = race.rows[0].optimizer if race.rows else "the first optimizer"
    count = f"{len(race.seeds)} seed{'' if len(race.seeds) == 1 else 's'}"
    lines = [
        f"{count}: {seeds}; each figure is the mean ± the half-width of its "
        f"95% Student-t interval over the seeds",
        f"p: Welch's t-test, two-sided, against {reference} (final validation loss; steps to "
        f"target when every seed of both reached it); significant below {race.alpha:g}",
        "val loss: the final loss on the validation split (up to 4,096 windows, at the end)",
    ]
    if race.target is not None:
        lines.append(
            f"steps to target: the first validation point ({config.eval_windows} windows, every "
            f"{race.eval_every} steps) at or below {race.target:g}; seconds: the run's time to "
            f"that step"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ plot
def smooth(values: Sequence[float], weight: float = 0.9) -> list[float]:
    """Exponential moving average with bias correction (as TensorBoard draws it).

    Args:
        values: the series.
        weight: the weight of the running average.

    Returns:
        The smoothed series, as long as ``values``.
    """
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
    from matplotlib.figure import Figure  # deferred: optional dependency

    figure = Figure(figsize=(7.5, 4.2), layout="constrained")
    axes = figure.subplots()
    for index, result in enumerate(results):
        _plot_run(axes, result, f"C{index}")
    if results:
        baseline = results[0].baseline
        axes.axhline(
            baseline, color="0.4", linestyle=":", label=f"unigram baseline ({baseline:.2f})"
        )
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss (nats per character)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, ncols=2)
    axes.set_title(title, fontsize=9)
    figure.savefig(path, dpi=110)
    return Path(path)


def _plot_run(axes: Axes, result: TrainResult, color: str) -> None:
    """Draw one run on matplotlib ``axes``: smoothed training loss, validation points."""
    steps, losses = zip(*result.curve, strict=True) if result.curve else ((), ())
    name = f"{result.optimizer} (lr {result.hyperparameters['lr']:.3g})"
    axes.plot(steps, smooth(losses), color=color, linewidth=1.4, label=f"{name} train")
    val_steps, val_losses = zip(*result.val_curve, strict=True)
    axes.plot(
        val_steps,
        val_losses,
        "o--",
        color=color,
        markersize=3.5,
        linewidth=1,
        label=f"{name} val",
    )


def plot_race(race: RaceResult, path: str | os.PathLike[str], *, title: str = "") -> Path:
    """Plot every seed's validation curve (thin, one colour per optimizer) and the target.

    Args:
        race: what the race measured.
        path: the image file; its suffix picks the format.
        title: the figure title.

    Returns:
        The path written.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from matplotlib.figure import Figure  # deferred: optional dependency

    figure = Figure(figsize=(7.5, 4.2), layout="constrained")
    axes = figure.subplots()
    for index, row in enumerate(race.rows):
        label = f"{row.optimizer} (lr {row.lr:.3g}, {len(row.seeds)} seeds)"
        for seed_index, curve in enumerate(row.val_curves):
            steps, losses = zip(*curve, strict=True)
            shown = label if seed_index == 0 else None  # one legend entry per optimizer
            axes.plot(steps, losses, color=f"C{index}", linewidth=0.8, alpha=0.8, label=shown)
    if race.target is not None:
        axes.axhline(
            race.target, color="0.2", linestyle="--", linewidth=1, label=f"target ({race.target:g})"
        )
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("validation loss (nats per character)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title(title, fontsize=9)
    figure.savefig(path, dpi=110)
    return Path(path)

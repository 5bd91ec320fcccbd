"""Ranking selection-rule candidates into a :class:`Selection` (what ``AutoOptimizer`` returns).

Every plugin may implement ``optiplug_select_optimizer(request)`` and return
scored :class:`~optiplug.Candidate` records. All are collected; candidates
naming an algorithm that is not installed are skipped; the highest score
wins, ties broken by algorithm name, then plugin name, then rule name (never
by installation order). The result is a :class:`Selection`, which is an
:class:`~optiplug.OptimizerFactory` that also says why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from .._text import format_table
from ..errors import OptiplugError, TuneError
from .binding import provided_default
from .create import OptimizerFactory
from .specs import Candidate, SelectionRequest

if TYPE_CHECKING:
    from .protocols import CandidateSource

__all__ = [
    "RANGE_SHARE",
    "SHORT_RUNS",
    "MAX_FSDP_RANKS",
    "CandidateReport",
    "MemoryOption",
    "MemoryPlan",
    "Selection",
    "TuneReport",
    "TuneTrial",
    "explain_memory",
    "explain_selection",
    "format_size",
    "ranks_to_fit",
    "select",
]

RANGE_SHARE = 0.4
"""Share of each candidate's steps spent on the range test (the rest: its short runs)."""

SHORT_RUNS = 3
"""Short runs per candidate: at the steepest lr, the minimum's lr and their geometric mean."""

MAX_FSDP_RANKS = 1024
"""The most FSDP ranks a memory plan considers when nothing fits one device."""


@attrs.frozen
class CandidateReport:
    """One candidate as ``explain`` shows it.

    Attributes:
        candidate: the proposal (``provider`` filled in).
        status: ``"chosen"``, ``"outscored"``, ``"skipped"`` (not installed) or
            ``"over budget"`` (passed over by a memory budget).
        note: why it was skipped or passed over, if it was.
    """

    candidate: Candidate
    status: str
    note: str = ""


def _points(value: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    return tuple((float(lr), float(loss)) for lr, loss in value)


def _trials(value: Iterable[TuneTrial]) -> tuple[TuneTrial, ...]:
    return tuple(value)


@attrs.frozen
class TuneTrial:
    """One candidate as ``AutoOptimizer.tune`` measured it.

    Attributes:
        algorithm: the candidate's algorithm.
        hparams: the hyperparameters it ran with, learning rates tuned.
        lr: the learning rate chosen for it (its ``lr`` hyperparameter).
        lr_at_min: the lr where the range test's loss first came within 5%
            (of its whole drop) of its minimum, or None when the first point
            already diverged.
        lr_steepest: the lr where the range test's loss fell fastest (per
            unit of log lr) before its minimum, or None when too few points
            precede the minimum.
        range_test: ``(lr, smoothed training loss)`` per range-test step.
        held_out_loss: mean loss on the held-out batches after the short run
            (``inf`` when it diverged).
        steps: optimizer steps it used (range test plus short runs).
        note: what went wrong, if anything (``"diverged at step 12"``).
        short_runs: ``(lr, held-out loss)`` of each short run; ``lr`` is the best.
    """

    algorithm: str
    hparams: dict[str, Any] = attrs.field(converter=dict)
    lr: float
    lr_at_min: float | None
    lr_steepest: float | None
    range_test: tuple[tuple[float, float], ...] = attrs.field(converter=_points)
    held_out_loss: float
    steps: int
    note: str = ""
    short_runs: tuple[tuple[float, float], ...] = attrs.field(default=(), converter=_points)


@attrs.frozen
class TuneReport:
    """What ``AutoOptimizer.tune`` measured: every trial, and how the lr was picked.

    Attributes:
        trials: one per candidate, best held-out loss first.
        lr_rule: how each candidate's lr was picked from its range test.
        budget_steps: the optimizer-step budget the whole tune had.
        seed: the seed every trial started from.
        held_out_batches: how many batches the held-out loss averages.
    """

    trials: tuple[TuneTrial, ...] = attrs.field(converter=_trials)
    lr_rule: str
    budget_steps: int
    seed: int
    held_out_batches: int

    def table(self) -> str:
        """The trials as an aligned table: algorithm, lr, range test's minimum, held-out loss."""
        rows = [
            [
                t.algorithm,
                f"{t.lr:.3g}",
                "-" if t.lr_steepest is None else f"{t.lr_steepest:.3g}",
                "-" if t.lr_at_min is None else f"{t.lr_at_min:.3g}",
                " ".join(f"{lr:.3g}:{loss:.4f}" for lr, loss in t.short_runs) or "-",
                f"{t.held_out_loss:.4f}",
                t.steps,
                t.note or "-",
            ]
            for t in self.trials
        ]
        header = [
            "algorithm",
            "lr",
            "steepest lr",
            "minimum lr",
            "short runs (lr:held-out)",
            "held-out loss",
            "steps",
            "note",
        ]
        return format_table(header, rows)


@attrs.frozen
class MemoryOption:
    """One candidate at one state precision, as a memory budget counted it (bytes).

    Attributes:
        algorithm: the candidate's algorithm.
        state_precision: the ``state_precision`` counted, or None when the
            algorithm takes none (its state as it stores it).
        parameters: bytes of the parameters.
        gradients: bytes of the gradients (the trainable parameters' dtype and size).
        state: estimated bytes of the optimizer state.
        rule: the rule that proposed the candidate.
    """

    algorithm: str
    state_precision: str | None
    parameters: int
    gradients: int
    state: int
    rule: str = ""

    @property
    def total(self) -> int:
        """Parameters, gradients and state together (activations not counted)."""
        return self.parameters + self.gradients + self.state


def _options(value: Iterable[MemoryOption]) -> tuple[MemoryOption, ...]:
    return tuple(value)


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class MemoryPlan:
    """How a selection was fitted to a memory budget, and what it counts.

    Attributes:
        budget: the budget per device, in bytes.
        num_parameters: the trainable parameters counted.
        dtype: the parameters' dtype name (``"bfloat16"``).
        fits: whether the selection fits the budget; None when its state
            memory could not be estimated (the budget was then not applied).
        chosen: the selection's own option (the rules' choice, unchanged,
            when nothing fits); None when it could not be estimated.
        tried: every option counted, in the order tried, up to the one that fits.
        fsdp_ranks: when nothing fits, the fewest FSDP ranks (up to
            :data:`MAX_FSDP_RANKS`) over which ``compact`` fits; None otherwise
            or when even that many do not suffice.
        compact: when nothing fits, the option tried that needs the least memory.
        notes: what else the figures rest on (a dtype assumed, candidates
            whose state could not be estimated).
    """

    budget: int
    num_parameters: int
    dtype: str
    fits: bool | None
    chosen: MemoryOption | None
    tried: tuple[MemoryOption, ...] = attrs.field(default=(), converter=_options)
    fsdp_ranks: int | None = None
    compact: MemoryOption | None = None
    notes: tuple[str, ...] = attrs.field(default=(), converter=_strings)


def ranks_to_fit(total: int, budget: int) -> int | None:
    """The fewest FSDP ranks over which ``total`` bytes, sharded evenly, fit ``budget`` per rank.

    Args:
        total: bytes of parameters, gradients and state together.
        budget: bytes per rank (> 0).

    Returns:
        ``r`` in 1..:data:`MAX_FSDP_RANKS` with ``total / r <= budget``, or
        None when more ranks would be needed.
    """
    ranks = max(1, -(-total // budget))
    return ranks if ranks <= MAX_FSDP_RANKS else None


@attrs.frozen
class Selection(OptimizerFactory):
    """What ``AutoOptimizer`` chose: call it with parameters to build the optimizer.

    Attributes:
        schedule: the schedule paired with the choice, or None.
        reason: why the winner won.
        candidates: every candidate considered, best first.
        request: what the rules were asked.
        tuning: what ``AutoOptimizer.tune`` measured, or None for a rule's choice.
        memory: how the choice was fitted to a memory budget, or None without one.
    """

    schedule: Any = None
    reason: str = ""
    candidates: tuple[CandidateReport, ...] = ()
    request: SelectionRequest = attrs.field(factory=SelectionRequest)
    tuning: TuneReport | None = None
    memory: MemoryPlan | None = None

    # attrs writes pickling methods for each slotted class; keep the factory's,
    # which leave the registry out and accept pickles made before it existed.
    __getstate__ = OptimizerFactory.__getstate__
    __setstate__ = OptimizerFactory.__setstate__

    @property
    def optimizer(self) -> str:
        """The chosen algorithm's name."""
        return self.name

    def explain(self) -> str:
        """Every candidate, its score, its rule and its plugin, as text (and the tune's table)."""
        return explain_selection(self)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Plot each tuned candidate's range test (loss vs lr) to the image file ``path``.

        Needs ``matplotlib``. Each curve is marked at the lr chosen for it;
        the legend gives that lr and the held-out loss.

        Args:
            path: where to write the image (its suffix picks the format).

        Raises:
            TuneError: the selection was not made by ``AutoOptimizer.tune``.
            ImportError: matplotlib is not installed.
        """
        if self.tuning is None:
            raise TuneError(
                f"selection of {self.name!r} has no tuning to plot: it was chosen by rules; "
                "AutoOptimizer.tune(...) measures candidates"
            )
        plot_tuning(self.tuning, path)


def _rank_key(candidate: Candidate) -> tuple[float, str, str, str]:
    plugin = candidate.provider.plugin if candidate.provider else ""
    return (-float(candidate.score), candidate.algorithm, plugin, candidate.rule)


def select(registry: CandidateSource, request: SelectionRequest) -> Selection:
    """Collect every rule's candidates for ``request`` and pick the winner.

    Args:
        registry: where the rules and algorithms are registered.
        request: what is known about the task and model.

    Returns:
        The :class:`Selection`.

    Raises:
        OptiplugError: no rule proposed an installed algorithm.
    """
    installed = set(registry.optimizers())
    ranked = sorted((c for c, _ in registry.candidates(request)), key=_rank_key)
    usable = [c for c in ranked if c.algorithm in installed]
    if not usable:
        names = ", ".join(sorted({c.algorithm for c in ranked})) or "none"
        raise OptiplugError(
            f"no selection rule proposed an installed optimizer (proposed: {names})"
        )
    winner = usable[0]
    reports = tuple(_report(c, c is winner, installed) for c in ranked)
    return Selection(
        name=winner.algorithm,
        hparams=dict(winner.hparams),
        schedule=winner.schedule,
        reason=winner.reason,
        candidates=reports,
        request=request,
        registry=registry,
    )


def _report(candidate: Candidate, chosen: bool, installed: set[str]) -> CandidateReport:
    if candidate.algorithm not in installed:
        return CandidateReport(candidate, "skipped", f"{candidate.algorithm!r} is not installed")
    return CandidateReport(candidate, "chosen" if chosen else "outscored")


def _describe_request(request: SelectionRequest) -> str:
    count = "unknown" if request.num_parameters is None else f"{request.num_parameters:,}"
    how = "exact" if request.parameters_exact else "estimated"
    parts = [
        f"task={request.task or '-'}",
        f"N={count}" + (f" ({how})" if request.num_parameters else ""),
    ]
    if request.model_type:
        parts.append(f"model_type={request.model_type}")
    if request.stage:
        parts.append(f"stage={request.stage}")
    return ", ".join(parts)


def _effective_hparams(selection: Selection) -> dict[str, Any]:
    """The chosen algorithm's defaults (as registered) with the candidate's hyperparameters over them.

    Defaults that are None (``model``, "decide later" settings) are left out.
    The candidate's alone when the algorithm's spec cannot be looked up (a
    registry that only creates, or a name no longer registered).
    """
    registry = selection.registry if selection.registry is not None else provided_default()
    lookup = getattr(registry, "spec", None)
    defaults: dict[str, Any] = {}
    if callable(lookup):
        try:
            spec = lookup(selection.name, provider=selection.provider)
        except OptiplugError:
            spec = None
        found = getattr(spec, "hyperparameters", ())
        defaults = {h.name: h.default for h in found if h.default is not None}
    return {**defaults, **selection.hparams}


def explain_selection(selection: Selection) -> str:
    """Render a selection's candidates as an aligned table with the verdict."""
    rows = []
    for report in selection.candidates:
        c, info = report.candidate, report.candidate.provider
        origin = f"{info.plugin} ({info.distribution} {info.version})" if info else "-"
        hparams = ", ".join(f"{k}={v}" for k, v in sorted(c.hparams.items())) or "-"
        status = report.status + (f": {report.note}" if report.note else "")
        rows.append([f"{c.score:g}", c.algorithm, hparams, c.rule or "-", origin, status])
    table = format_table(["score", "algorithm", "hparams", "rule", "plugin", "status"], rows)
    lines = [f"request: {_describe_request(selection.request)}"]
    hparams = ", ".join(f"{k}={v!r}" for k, v in _effective_hparams(selection).items())
    lines.append(f"chosen: {selection.optimizer} ({hparams or 'no hyperparameters'})")
    lines.append(f"        because: {selection.reason}")
    if selection.schedule is not None:
        lines.append(f"schedule: {selection.schedule!r}")
    lines += ["", table]
    if selection.tuning is not None:
        tuning = selection.tuning
        lines += [
            "",
            f"tuned (seed {tuning.seed}, budget {tuning.budget_steps} steps, "
            f"held-out loss over {tuning.held_out_batches} batches; lr = {tuning.lr_rule}):",
            tuning.table(),
        ]
    if selection.memory is not None:
        lines += ["", *explain_memory(selection.memory)]
    return "\n".join(lines)


def format_size(size: int) -> str:
    """Bytes in decimal units, one decimal: ``"31.2 GB"``, ``"512.0 MB"``, ``"12 B"``."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _arithmetic(option: MemoryOption) -> str:
    """``"31.2 GB (parameters 14.0 GB + gradients 14.0 GB + state 3.7 GB at int4)"``."""
    precision = f" at {option.state_precision}" if option.state_precision else ""
    return (
        f"{format_size(option.total)} (parameters {format_size(option.parameters)} + gradients "
        f"{format_size(option.gradients)} + state {format_size(option.state)}{precision})"
    )


def _label(option: MemoryOption) -> str:
    precision = option.state_precision or "its own state precision (it takes no state_precision)"
    rule = f" (rule {option.rule})" if option.rule else ""
    return f"{option.algorithm}{rule} at {precision}"


def _sharded(total: int, budget: int) -> str:
    """What FSDP would need per rank for ``total`` bytes, as a sentence."""
    ranks = ranks_to_fit(total, budget)
    if ranks is None:
        return f"it does not fit even over {MAX_FSDP_RANKS} ranks with FSDP"
    return (
        f"over {ranks} ranks with FSDP (parameters, gradients and state sharded) it "
        f"needs {format_size(-(-total // ranks))} per rank, which fits"
    )


def _verdict(plan: MemoryPlan) -> list[str]:
    """The plan's verdict on the selection: fits, does not fit (and what would), or not applied."""
    chosen, budget = plan.chosen, plan.budget
    if plan.fits is None or chosen is None:
        return ["  not applied: the choice's state memory could not be estimated"]
    if plan.fits:
        return [
            f"  fits: {_label(chosen)} needs {_arithmetic(chosen)}, "
            f"{format_size(budget - chosen.total)} under the budget"
        ]
    lines = [
        f"  does not fit: the rules' choice, {_label(chosen)}, needs {_arithmetic(chosen)};"
        " returned unchanged",
        f"    {_sharded(chosen.total, budget)}",
    ]
    if plan.compact is not None and plan.compact != chosen:
        lines += [
            f"  most compact: {_label(plan.compact)} needs {_arithmetic(plan.compact)}",
            f"    {_sharded(plan.compact.total, budget)}",
        ]
    return lines


def explain_memory(plan: MemoryPlan) -> list[str]:
    """A memory plan as ``explain`` shows it: the arithmetic, the verdict, every option tried."""
    lines = [
        f"memory budget: {format_size(plan.budget)} per device for {plan.num_parameters:,} "
        f"trainable {plan.dtype} parameters (parameters + gradients + optimizer state; activations "
        "and temporary buffers are not counted)",
        *_verdict(plan),
        *(f"  note: {note}" for note in plan.notes),
    ]
    if plan.tried:
        lines.append("  tried, in order:")
    for option in plan.tried:
        over = option.total - plan.budget
        verdict = "fits" if over <= 0 else f"over by {format_size(over)}"
        lines.append(
            f"    {_label(option)}: {format_size(option.total)} "
            f"(state {format_size(option.state)}): {verdict}"
        )
    return lines


def plot_tuning(tuning: TuneReport, path: str | os.PathLike[str]) -> None:
    """Draw the range tests of ``tuning`` (log lr on x, smoothed loss on y) into ``path``."""
    from matplotlib.figure import Figure  # deferred: optional dependency

    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    for trial in tuning.trials:
        lrs = [lr for lr, _ in trial.range_test]
        losses = [loss for _, loss in trial.range_test]
        label = f"{trial.algorithm}: lr {trial.lr:.3g}, held-out {trial.held_out_loss:.3f}"
        (line,) = axes.plot(lrs, losses, linewidth=1.4, label=label)
        axes.axvline(trial.lr, color=line.get_color(), linestyle="--", linewidth=0.8)
        for lr, _ in trial.short_runs:
            axes.axvline(lr, color=line.get_color(), linestyle=":", linewidth=0.6)
    axes.set_xscale("log")
    axes.set_xlabel("learning rate (range test, increasing exponentially)")
    axes.set_ylabel("training loss (smoothed)")
    axes.set_title(
        "AutoOptimizer.tune: dotted = lrs of the short runs, dashed = chosen", fontsize=9
    )
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(os.fspath(path), dpi=120)

"""Ranking selection-rule candidates into a :class:`Selection` (what ``AutoOptimizer`` returns).

Every plugin may implement ``optiplug_select_optimizer(request)`` and return
scored :class:`~optiplug.Candidate` records. All are collected; candidates
naming an algorithm that is not installed are skipped; the highest score
wins, ties broken by algorithm name, then plugin name, then rule name (never
by installation order). The result is a :class:`Selection`, which is an
:class:`~optiplug.OptimizerFactory` that also says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .._text import format_table
from ..errors import OptiplugError
from .binding import provided_default
from .create import OptimizerFactory
from .specs import Candidate, SelectionRequest

if TYPE_CHECKING:
    from .protocols import CandidateSource

__all__ = ["CandidateReport", "Selection", "explain_selection", "select"]


@attrs.frozen
class CandidateReport:
    """One candidate as ``explain`` shows it.

    Attributes:
        candidate: the proposal (``provider`` filled in).
        status: ``"chosen"``, ``"outscored"`` or ``"skipped"``.
        note: why it was skipped, if it was.
    """

    candidate: Candidate
    status: str
    note: str = ""


@attrs.frozen
class Selection(OptimizerFactory):
    """What ``AutoOptimizer`` chose: call it with parameters to build the optimizer.

    Attributes:
        schedule: the schedule paired with the choice, or None.
        reason: why the winner won.
        candidates: every candidate considered, best first.
        request: what the rules were asked.
    """

    schedule: Any = None
    reason: str = ""
    candidates: tuple[CandidateReport, ...] = ()
    request: SelectionRequest = attrs.field(factory=SelectionRequest)

    # attrs writes pickling methods for each slotted class; keep the factory's,
    # which leave the registry out and accept pickles made before it existed.
    __getstate__ = OptimizerFactory.__getstate__
    __setstate__ = OptimizerFactory.__setstate__

    @property
    def optimizer(self) -> str:
        """The chosen algorithm's name."""
        return self.name

    def explain(self) -> str:
        """Every candidate, its score, its rule and its plugin, as text."""
        return explain_selection(self)


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
    return "\n".join([*lines, "", table])

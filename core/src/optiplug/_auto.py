"""``AutoOptimizer``: choose an optimizer by asking every plugin's selection rules.

Every plugin may implement ``optiplug_select_optimizer(request)`` and return
scored :class:`~optiplug.Candidate` records. All are collected; candidates
naming an algorithm that is not installed are skipped; the highest score
wins, ties broken by algorithm name, then plugin name, then rule name (never
by installation order). The result is a :class:`Selection`, which is an
:class:`~optiplug.OptimizerFactory` that also says why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._create import OptimizerFactory
from ._model_config import estimate_parameters, normalise_task, read_config, resolve_pretrained
from ._specs import Candidate, SelectionRequest
from .errors import ModelConfigError, OptiplugError

if TYPE_CHECKING:
    import torch

    from ._registry import Registry

__all__ = ["AutoOptimizer", "CandidateReport", "Selection", "select"]

STAGES = ("pretraining", "finetuning")


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


def select(registry: Registry, request: SelectionRequest) -> Selection:
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


def explain_selection(selection: Selection) -> str:
    """Render a selection's candidates as an aligned table with the verdict."""
    from .cli import format_table

    rows = []
    for report in selection.candidates:
        c, info = report.candidate, report.candidate.provider
        origin = f"{info.plugin} ({info.distribution} {info.version})" if info else "-"
        hparams = ", ".join(f"{k}={v}" for k, v in sorted(c.hparams.items())) or "-"
        status = report.status + (f": {report.note}" if report.note else "")
        rows.append([f"{c.score:g}", c.algorithm, hparams, c.rule or "-", origin, status])
    table = format_table(["score", "algorithm", "hparams", "rule", "plugin", "status"], rows)
    lines = [f"request: {_describe_request(selection.request)}"]
    lines.append(f"chosen: {selection.optimizer} {selection.hparams} - {selection.reason}")
    if selection.schedule is not None:
        lines.append(f"schedule: {selection.schedule!r}")
    return "\n".join([*lines, "", table])


def _check_stage(stage: str | None) -> str | None:
    if stage is None:
        return None
    folded = stage.strip().lower().replace("_", "-").replace("-", "")
    canonical = {"pretraining": "pretraining", "finetuning": "finetuning"}.get(folded)
    if canonical is None:
        raise ModelConfigError(f"stage={stage!r}: expected one of {', '.join(STAGES)}")
    return canonical


def _request_from_config(
    config: Mapping[str, Any], task: str | None, stage: str | None
) -> SelectionRequest:
    count, exact = estimate_parameters(config)
    model_type = config.get("model_type")
    return SelectionRequest(
        task=normalise_task(task),
        num_parameters=count,
        parameters_exact=exact,
        config=dict(config),
        model_type=model_type if isinstance(model_type, str) else None,
        stage=_check_stage(stage),
    )


class AutoOptimizer:
    """Pick an optimizer and hyperparameters for a task or model, and say why.

    Every constructor returns a :class:`Selection`; call it with parameters.
    ``registry=`` selects another registry than the default one.
    """

    @staticmethod
    def _registry(registry: Registry | None) -> Registry:
        from ._api import default_registry

        return registry or default_registry()

    @classmethod
    def for_task(
        cls,
        task: str | None,
        config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        num_parameters: int | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
    ) -> Selection:
        """Select for a task, optionally with a model config or a parameter count.

        Args:
            task: e.g. ``"text-classification"``; normalised; unknown tasks fall
                back to the size rules.
            config: an HF-style config mapping or path, for the parameter count.
            num_parameters: the parameter count, when no config is given.
            stage: ``"pretraining"`` or ``"finetuning"``, if known.
            registry: where to look; the default registry when None.

        Returns:
            The :class:`Selection`.

        Raises:
            ModelConfigError: an unreadable config or one lacking the needed keys.
        """
        if config is not None:
            mapping = config if isinstance(config, Mapping) else read_config(config)
            request = _request_from_config(mapping, task, stage)
        else:
            request = SelectionRequest(
                task=normalise_task(task),
                num_parameters=num_parameters,
                parameters_exact=num_parameters is not None,
                stage=_check_stage(stage),
            )
        return select(cls._registry(registry), request)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | str | os.PathLike[str],
        *,
        task: str | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
    ) -> Selection:
        """Select from a model config (a mapping or the path of a ``config.json``).

        Raises:
            ModelConfigError: an unreadable config or one lacking the needed keys.
        """
        return cls.for_task(task, config, stage=stage, registry=registry)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        task: str | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
    ) -> Selection:
        """Select from a local model directory/``config.json``, or an offline hub cache entry.

        Raises:
            ModelConfigError: nothing at that path (and not cached), no
                ``config.json`` in the directory, or invalid JSON; names the path.
        """
        config = read_config(resolve_pretrained(name_or_path))
        return cls.for_task(task, config, stage=stage, registry=registry)

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        task: str | None = None,
        *,
        stage: str | None = None,
        registry: Registry | None = None,
    ) -> Selection:
        """Select for a module, counting its trainable parameters exactly.

        Args:
            model: the module; an HF model's ``config`` is passed to the rules too.
            task: the task, if known.
            stage: ``"pretraining"`` or ``"finetuning"``, if known.
            registry: where to look.

        Returns:
            The :class:`Selection`.
        """
        count = sum(p.numel() for p in model.parameters() if p.requires_grad)
        config = getattr(model, "config", None)
        mapping = config.to_dict() if hasattr(config, "to_dict") else None
        model_type = (mapping or {}).get("model_type") or type(model).__name__
        request = SelectionRequest(
            task=normalise_task(task),
            num_parameters=count,
            parameters_exact=True,
            config=mapping,
            model_type=model_type,
            stage=_check_stage(stage),
        )
        return select(cls._registry(registry), request)

    @staticmethod
    def with_schedule(selection: Selection, schedule: Any) -> Selection:
        """Return ``selection`` paired with ``schedule``.

        Args:
            selection: a selection.
            schedule: a :class:`~optiplug.Schedule`, a schedule name, or a dict
                accepted by ``optiplug.schedule(**d)``.

        Returns:
            A new :class:`Selection`.
        """
        from ._api import schedule as build

        if isinstance(schedule, str):
            schedule = build(schedule)
        elif isinstance(schedule, Mapping):
            schedule = build(**schedule)
        return attrs.evolve(selection, schedule=schedule)

    @classmethod
    def explain(
        cls,
        task: str | None = None,
        config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        num_parameters: int | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
    ) -> str:
        """Every candidate for this request, its score, rule and plugin, as text."""
        selection = cls.for_task(
            task, config, num_parameters=num_parameters, stage=stage, registry=registry
        )
        return selection.explain()

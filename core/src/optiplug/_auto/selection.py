"""``AutoOptimizer``: turn a task, a model config or a module into a selection request.

The request goes to :meth:`optiplug.Registry.select`, which asks every
plugin's ``optiplug_select_optimizer`` rule and ranks the candidates
(:mod:`optiplug._core.selection`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .._core.registry import Registry, bound_registry
from .._core.selection import RANGE_SHARE, SHORT_RUNS, Selection
from .._core.specs import Candidate, SelectionRequest
from ..errors import HyperparameterError, ModelConfigError
from .budget import (
    Footprint,
    apply_memory_budget,
    config_footprint,
    model_footprint,
    parse_memory_budget,
)
from .evidence import Measurement, cite, compare_most_used, load_evidence, nearest_workload
from .model_config import (
    config_mapping,
    estimate_parameters,
    normalise_task,
    read_config,
    resolve_pretrained,
    task_from_architectures,
)
from .rules import pretraining_lr

if TYPE_CHECKING:
    import torch

__all__ = ["AutoOptimizer"]

STAGES = ("pretraining", "finetuning")

MemoryBudget = int | str
"""Bytes, or a size such as ``"24GB"`` (1e9 bytes) or ``"80 GiB"`` (2**30 bytes)."""


def _check_stage(stage: str | None) -> str | None:
    if stage is None:
        return None
    folded = stage.strip().lower().replace("_", "-").replace("-", "")
    canonical = {"pretraining": "pretraining", "finetuning": "finetuning"}.get(folded)
    if canonical is None:
        raise ModelConfigError(f"stage={stage!r}: expected one of {', '.join(STAGES)}")
    return canonical


def _check_steps(total_steps: int | None) -> int | None:
    if total_steps is None:
        return None
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ModelConfigError(f"total_steps={total_steps!r}: expected a positive integer or None")
    return total_steps


def _request_from_config(
    config: Mapping[str, Any], task: str | None, stage: str | None
) -> SelectionRequest:
    count, exact = estimate_parameters(config)
    model_type = config.get("model_type")
    return SelectionRequest(
        task=normalise_task(task) if task is not None else task_from_architectures(config),
        num_parameters=count,
        parameters_exact=exact,
        config=dict(config),
        model_type=model_type if isinstance(model_type, str) else None,
        stage=_check_stage(stage),
    )


def _budgeted(
    request: SelectionRequest,
    budget: int | None,
    footprint: Footprint | None,
    registry: Registry | None,
) -> Selection:
    """Select for ``request``, then fit the choice to ``budget`` bytes when there is one."""
    bound = bound_registry(registry)
    selection = bound.select(request)
    if budget is None or footprint is None:
        return selection
    return apply_memory_budget(selection, budget, footprint, bound)


def _check_budget(memory_budget: MemoryBudget | None, num_parameters: int | None) -> int | None:
    """The budget in bytes (None without one); it needs a parameter count."""
    if memory_budget is None:
        return None
    budget = parse_memory_budget(memory_budget)
    if num_parameters is None:
        raise HyperparameterError(
            "memory_budget",
            memory_budget,
            "needs the parameter count: pass num_parameters= or a config (--params or --config)",
        )
    return budget


class AutoOptimizer:
    """Pick an optimizer and hyperparameters for a task or model, and say why.

    Every constructor returns a :class:`Selection`; call it with parameters.
    ``registry=`` selects another registry than the default one.

    Attributes:
        TUNE_RANGE_SHARE: the share of each candidate's ``budget_steps``
            that :meth:`tune` spends on its lr range test.
        TUNE_SHORT_RUNS: the short runs :meth:`tune` gives each candidate
            with the rest (so each short run is ``(1 - TUNE_RANGE_SHARE) /
            TUNE_SHORT_RUNS`` of the candidate's steps).
    """

    TUNE_RANGE_SHARE: ClassVar[float] = RANGE_SHARE
    TUNE_SHORT_RUNS: ClassVar[int] = SHORT_RUNS

    @classmethod
    def for_task(
        cls,
        task: str | None,
        config: Mapping[str, Any] | Any | str | os.PathLike[str] | None = None,
        *,
        num_parameters: int | None = None,
        stage: str | None = None,
        total_steps: int | None = None,
        registry: Registry | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> Selection:
        """Select for a task, optionally with a model config or a parameter count.

        Args:
            task: e.g. ``"text-classification"``; normalised; unknown tasks fall
                back to the size rules.
            config: an HF-style config mapping, config object (``to_dict()``)
                or path, for the parameter count (and the task, from its
                ``architectures``, when ``task`` is None).
            num_parameters: the parameter count, when no config is given.
            stage: ``"pretraining"`` or ``"finetuning"``, if known.
            total_steps: the run's length in optimizer steps, if known (a
                rule may prefer a schedule-free optimizer when it is not).
            registry: where to look; the default registry when None.
            memory_budget: memory per device, in bytes or as ``"24GB"``,
                ``"80 GiB"``, ``"512MB"`` (GB = 1e9 bytes, GiB = 2**30): the
                choice must hold the parameters, gradients and optimizer
                state in it (activations are not counted). The parameters'
                dtype is the config's ``torch_dtype``, else float32. When the
                rules' choice does not fit, its state is kept at a lower
                ``state_precision`` or another candidate is chosen;
                ``selection.memory`` and ``explain()`` show the arithmetic.

        Returns:
            The :class:`Selection`.

        Raises:
            ModelConfigError: an unreadable config or one lacking the needed
                keys, or a ``total_steps`` that is not a positive integer.
            HyperparameterError: a ``memory_budget`` that is not a positive
                size, or one given without a parameter count.
        """
        mapping: Mapping[str, Any] | None = None
        if config is not None:
            if isinstance(config, (str, os.PathLike)):
                mapping = read_config(config)
            else:
                mapping = config_mapping(config)
            request = _request_from_config(mapping, task, stage)
        else:
            request = SelectionRequest(
                task=normalise_task(task),
                num_parameters=num_parameters,
                parameters_exact=num_parameters is not None,
                stage=_check_stage(stage),
            )
        request = attrs.evolve(request, total_steps=_check_steps(total_steps))
        budget = _check_budget(memory_budget, request.num_parameters)
        footprint = None
        if budget is not None and request.num_parameters is not None:
            footprint = config_footprint(mapping, request.num_parameters)
        return _budgeted(request, budget, footprint, registry)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | Any | str | os.PathLike[str],
        *,
        task: str | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> Selection:
        """Select from a model config: a mapping, a config object, or a ``config.json`` path.

        A config object is anything with ``to_dict()`` (transformers'
        ``GPT2Config``...). Without ``task``, the config's ``architectures``
        name it when they can (``...ForCausalLM``/``...LMHeadModel`` ->
        text-generation, ``...ForSequenceClassification`` ->
        text-classification, ``...ForQuestionAnswering`` ->
        question-answering, ``...ForMaskedLM`` -> fill-mask).
        ``memory_budget`` works as in :meth:`for_task`.

        Raises:
            ModelConfigError: an unreadable config or one lacking the needed keys.
            HyperparameterError: a ``memory_budget`` that is not a positive size.
        """
        return cls.for_task(
            task, config, stage=stage, registry=registry, memory_budget=memory_budget
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        task: str | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> Selection:
        """Select from a local model directory/``config.json``, or an offline hub cache entry.

        Without ``task``, the config's ``architectures`` name it when they
        can (see :meth:`from_config`). ``memory_budget`` works as in
        :meth:`for_task`.

        Raises:
            ModelConfigError: nothing at that path (and not cached), no
                ``config.json`` in the directory, or invalid JSON; names the path.
            HyperparameterError: a ``memory_budget`` that is not a positive size.
        """
        config = read_config(resolve_pretrained(name_or_path))
        return cls.for_task(
            task, config, stage=stage, registry=registry, memory_budget=memory_budget
        )

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        task: str | None = None,
        *,
        stage: str | None = None,
        total_steps: int | None = None,
        registry: Registry | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> Selection:
        """Select for a module, counting its trainable parameters exactly.

        Args:
            model: the module; an HF model's ``config`` is passed to the rules too.
            task: the task, if known.
            stage: ``"pretraining"`` or ``"finetuning"``, if known.
            total_steps: the run's length in optimizer steps, if known.
            registry: where to look.
            memory_budget: memory per device, as for :meth:`for_task`; the
                parameters' bytes are read from the module (frozen ones
                count, without gradients or state).

        Returns:
            The :class:`Selection`.

        Raises:
            HyperparameterError: a ``memory_budget`` that is not a positive size.
        """
        count = sum(p.numel() for p in model.parameters() if p.requires_grad)
        config = getattr(model, "config", None)
        mapping: dict[str, Any] | None = None
        if config is not None and hasattr(config, "to_dict"):
            mapping = config.to_dict()
        model_type = (mapping or {}).get("model_type") or type(model).__name__
        request = SelectionRequest(
            task=normalise_task(task),
            num_parameters=count,
            parameters_exact=True,
            config=mapping,
            model_type=model_type,
            stage=_check_stage(stage),
            total_steps=_check_steps(total_steps),
        )
        budget = _check_budget(memory_budget, count)
        footprint = model_footprint(model) if budget is not None else None
        return _budgeted(request, budget, footprint, registry)

    @classmethod
    def tune(
        cls,
        model: torch.nn.Module,
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        batches: Iterable[Any],
        *,
        candidates: Sequence[str | Candidate] | None = None,
        budget_steps: int = 1500,
        held_out: int | float = 0.2,
        seed: int = 0,
        task: str | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
    ) -> Selection:
        """Choose the optimizer and its learning rate by measuring them on ``model``.

        Each candidate gets an LR range test on a copy of ``model`` (its
        learning rates growing exponentially from 1e-2 to 1e3 times the
        recipe's), then short runs from the same initial weights at three
        lrs from it: the steepest-descent lr, the minimum's lr (where the
        loss first comes within 5% of its minimum) and their geometric
        mean. A candidate's lr is the smallest within 1% of its best
        held-out loss; the lowest held-out loss wins. ``model`` is never
        changed: its parameters, buffers, gradients and every RNG state are
        as before. Under ``torch.distributed`` rank 0 measures and every
        rank gets its result.

        Args:
            model: the model to tune for (copied, never stepped).
            loss_fn: ``loss_fn(model, batch)`` returning a scalar loss tensor.
            batches: the batches. A list or tuple gives its last ``held_out``
                to the held-out loss; any other iterable (a generator, a data
                loader, ``itertools.repeat``) is read only as far as the budget
                needs: the batches one trial trains on, then the held-out ones.
            candidates: algorithm names (or :class:`~optiplug.Candidate`
                recipes); None takes the installed algorithms the rules rank
                highest for this model, task and stage: one per 750 steps of
                the budget, at least one, at most three.
            budget_steps: optimizer steps for the whole tune, shared equally
                by the candidates (40% range test, 60% short runs each).
            held_out: held-out batches (an int >= 1) or their fraction (a float).
            seed: the seed every trial starts from (an integer torch accepts:
                -2**63 to 2**64 - 1); the same seed gives the same result.
            task: the task, for the rules' recipes.
            stage: ``"pretraining"`` or ``"finetuning"``, for the rules' recipes.
            registry: where to look; the default registry when None.

        Returns:
            A :class:`Selection` of the winner at its tuned lr; ``explain()``
            shows every trial and ``plot(path)`` draws the range tests.

        Raises:
            TuneError: ``batches`` not iterable or too few of them, a bad
                ``seed``, too small a budget, a loss that is not a real
                floating-point scalar tensor requiring grad, a bad candidate
                list, or every candidate diverged.
        """
        from .tune import run_tune  # deferred: imports torch

        rules = cls.for_model(model, task, stage=stage, registry=registry)
        return run_tune(
            model,
            loss_fn,
            batches,
            rules,
            candidates,
            budget_steps=budget_steps,
            held_out=held_out,
            seed=seed,
            registry=bound_registry(registry),
        )

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
        carried = selection.registry
        registry = bound_registry(carried if isinstance(carried, Registry) else None)
        if isinstance(schedule, str):
            schedule = registry.schedule(schedule)
        elif isinstance(schedule, Mapping):
            schedule = registry.schedule(**schedule)
        return attrs.evolve(selection, schedule=schedule)

    @staticmethod
    def pretraining_lr(num_parameters: int | None) -> tuple[float, str]:
        """AdamW's pretraining lr for a model of this size, and where it comes from.

        What the built-in ``pretraining:adamw`` rule proposes; a plugin's
        pretraining rule may scale its own lr from it.

        Args:
            num_parameters: the parameter count, or None (treated as small).

        Returns:
            ``(lr, source)``: 1e-3 up to 1e8 parameters (nanoGPT), else the row
            of GPT-3's Table 2.1 for the smallest model at least as large.
        """
        return pretraining_lr(num_parameters)

    @classmethod
    def explain(
        cls,
        task: str | None = None,
        config: Mapping[str, Any] | Any | str | os.PathLike[str] | None = None,
        *,
        num_parameters: int | None = None,
        stage: str | None = None,
        registry: Registry | None = None,
        memory_budget: MemoryBudget | None = None,
        evidence: Sequence[Measurement] | str | os.PathLike[str] | None = None,
    ) -> str:
        """Every candidate for this request, its score, rule and plugin, and its evidence, as text.

        With ``memory_budget`` (see :meth:`for_task`), the memory arithmetic
        too. Last comes the leaderboard's evidence (:meth:`cite`): each
        candidate's measurement on the workload nearest the request, or, for
        one without a measurement, its rule's literature source.

        Args:
            task: as for :meth:`for_task`.
            config: as for :meth:`for_task`.
            num_parameters: as for :meth:`for_task`.
            stage: as for :meth:`for_task`.
            registry: as for :meth:`for_task`.
            memory_budget: as for :meth:`for_task`.
            evidence: measurements (``optiplug_train.board_evidence(results_file)``)
                or an evidence JSON file; None: the published board's.

        Returns:
            The explanation.
        """
        selection = cls.for_task(
            task,
            config,
            num_parameters=num_parameters,
            stage=stage,
            registry=registry,
            memory_budget=memory_budget,
        )
        return "\n".join([selection.explain(), "", *cls.cite(selection, evidence)])

    @staticmethod
    def cite(
        selection: Selection,
        evidence: Sequence[Measurement] | str | os.PathLike[str] | None = None,
    ) -> list[str]:
        """The leaderboard's evidence for a selection's candidates, one line each.

        The request maps to its nearest workload (a language task or model
        to ``char-lm``, vision to ``digits``, regression to ``diabetes``,
        tabular classification to ``logistic``); a candidate measured there
        cites the measurement (``"normuon: 0.83x adamw's steps to target on
        char-lm, p = 0.003 (steps), 5 seeds"``), one that is not keeps its
        rule's literature source. Then, for comparison, the measurements
        there of the ten most-used algorithms (``optiplug._auto.evidence.MOST_USED``)
        that are not candidates.

        Args:
            selection: what :meth:`for_task` or :meth:`for_model` returned.
            evidence: measurements, an evidence JSON file, or None for the
                published board's.

        Returns:
            A heading line, then a line per candidate.
        """
        found = (
            evidence
            if evidence is not None and not isinstance(evidence, (str, os.PathLike))
            else load_evidence(evidence)
        )
        workload = nearest_workload(selection.request)
        pairs = [(r.candidate.algorithm, r.candidate.reason) for r in selection.candidates]
        return [
            f"evidence (leaderboard, nearest workload {workload}):",
            *cite(pairs, workload, found),
            f"for comparison, the most-used algorithms on {workload}:",
            *compare_most_used(workload, found, skip=[name for name, _ in pairs]),
        ]

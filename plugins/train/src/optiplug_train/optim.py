"""The run's optimizer and schedule, looked up in the registry the caller hands in.

Importing this module does not import torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from optiplug import AutoOptimizer, OptimizerFactory, Registry

from .config import TrainConfig

if TYPE_CHECKING:
    import torch

__all__ = ["effective_hparams", "make_schedule", "resolve_optimizer"]


def _accepts(factory: Any, keyword: str) -> bool:
    try:
        return keyword in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def make_schedule(config: TrainConfig, registry: Registry) -> Any:
    """The run's schedule: ``config.schedule`` over ``config.steps`` with its warm-up.

    ``total_steps`` and ``warmup_steps`` are filled in for schedules that take
    them, unless ``schedule_params`` sets them.

    Args:
        config: the run.
        registry: where the schedule is looked up.

    Returns:
        The schedule (a callable ``step -> lr multiplier``).

    Raises:
        UnknownScheduleError: no such schedule.
        HyperparameterError: a missing or invalid schedule parameter.
    """
    factory = registry.schedule_spec(config.schedule).factory
    kwargs = dict(config.schedule_params)
    if _accepts(factory, "total_steps"):
        kwargs.setdefault("total_steps", config.steps)
    if _accepts(factory, "warmup_steps"):
        kwargs.setdefault("warmup_steps", config.warmup)
    return registry.schedule(config.schedule, **kwargs)


def resolve_optimizer(
    name: str,
    model: torch.nn.Module,
    registry: Registry,
    *,
    lr: float | None = None,
    impl: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> OptimizerFactory:
    """The optimizer factory for ``name`` (``"auto"`` asks ``AutoOptimizer``).

    Args:
        name: ``"auto"`` or a registered optimizer name.
        model: the model (``auto`` counts its parameters).
        registry: where the optimizer (or the selection rules) are looked up.
        lr: overrides the learning rate, when given.
        impl: forces an implementation, when given.
        params: further hyperparameters over the optimizer's (or selection's) own.

    Returns:
        An :class:`~optiplug.OptimizerFactory` (a :class:`~optiplug.Selection` for auto).

    Raises:
        UnknownOptimizerError: ``name`` is not installed.
        HyperparameterError: ``lr`` is invalid for it.
    """
    overrides: dict[str, Any] = {**(params or {}), **({} if lr is None else {"lr": lr})}
    if name != "auto":
        return registry.factory(name, impl=impl, **overrides)
    selection = AutoOptimizer.for_model(
        model, task="causal-lm", stage="pretraining", registry=registry
    )
    hparams = {**selection.hparams, **overrides}
    registry.factory(selection.name, impl=impl, **hparams)  # validate
    return attrs.evolve(selection, hparams=hparams, impl=impl)


def effective_hparams(factory: OptimizerFactory, registry: Registry) -> dict[str, Any]:
    """The hyperparameters the optimizer runs with: its registered defaults, then the factory's.

    Defaults that are None (``model``, "decided later" settings) are left out.

    Args:
        factory: the run's optimizer factory (or ``AutoOptimizer`` selection).
        registry: where its algorithm is registered.

    Returns:
        ``{name: value}``, in the algorithm's own order, ``lr`` first.
    """
    spec = registry.spec(factory.name, provider=factory.provider)
    found = {h.name: h.default for h in spec.hyperparameters if h.default is not None}
    merged = {**found, **factory.hparams}
    return {"lr": merged.pop("lr")} | merged if "lr" in merged else merged

"""Module-level API over the process-wide default registry.

This is the only module that owns the default registry: every function here
wraps a :class:`~optiplug.Registry` method (as ``httpx.get`` wraps a
``Client``), and objects that carry no registry find this one through the
provider installed below. It also provides the built-in plugins of the layers
below it (schedules, selection rules), which every registry registers first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._auto import rules as _rules
from ._choice import new_chooser
from ._core.binding import provide_chooser_factory, provide_default_registry
from ._core.builtin import provide_builtin_plugins
from ._core.create import OptimizerFactory
from ._core.registry import Registry
from ._core.specs import OptimizerSpec, PluginInfo, Problem
from ._schedules import plugin as _schedules_plugin
from ._schedules.base import Schedule
from ._state.memory import MemoryEstimate, MemoryReport
from ._state.memory import estimate as _estimate

if TYPE_CHECKING:
    import torch

__all__ = [
    "create",
    "default_registry",
    "estimate_memory",
    "factory",
    "load_state_dict",
    "memory",
    "optimizers",
    "plugins",
    "reset_default_registry",
    "schedule",
    "schedules",
    "spec",
    "validate_state_dict",
]

_lock = threading.Lock()
_default: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry, built on first call (plugins load on first lookup)."""
    global _default
    with _lock:
        if _default is None:
            _default = Registry(autoload=True)
        return _default


def reset_default_registry() -> None:
    """Forget the default registry (re-reads environment and entry points on next use)."""
    global _default
    with _lock:
        _default = None


def create(
    name: str,
    params: Iterable[Any],
    *,
    impl: str | None = None,
    provider: str | None = None,
    **hparams: Any,
) -> torch.optim.Optimizer:
    """Create optimizer ``name`` over ``params``.

    Args:
        name: algorithm name or alias (``optiplug.optimizers()`` lists them).
        params: tensors, param-group dicts, or ``(name, tensor)`` pairs such as
            ``model.named_parameters()``.
        impl: force an implementation (``"loop"``, ``"foreach"``, ``"fused"``...);
            None picks the fastest one supporting the parameters, by measurement.
        provider: plugin or distribution to take ``name`` from when several provide it.
        **hparams: hyperparameters, validated before anything is built.

    Returns:
        A ``torch.optim.Optimizer``.

    Raises:
        UnknownOptimizerError: no plugin provides ``name`` (with a suggestion).
        OptimizerUnavailableError: its plugin failed, is disabled or unavailable.
        PluginConflictError: several plugins provide ``name`` and no ``provider``.
        HyperparameterError: an unknown or invalid hyperparameter or ``impl``.
    """
    return default_registry().create(name, params, impl=impl, provider=provider, **hparams)


def factory(
    name: str, *, impl: str | None = None, provider: str | None = None, **hparams: Any
) -> OptimizerFactory:
    """Return a frozen, picklable recipe ``params -> optimizer``.

    The name and hyperparameters are checked now, so a typo fails here rather
    than when training starts.

    Args:
        name: algorithm name or alias.
        impl: implementation to force, or None.
        provider: plugin or distribution to take ``name`` from.
        **hparams: hyperparameters.

    Returns:
        An :class:`OptimizerFactory`.

    Raises:
        UnknownOptimizerError: no plugin provides ``name`` (with a suggestion).
        OptimizerUnavailableError: its plugin failed, is disabled or unavailable.
        PluginConflictError: several plugins provide ``name`` and no ``provider``.
        HyperparameterError: an unknown or invalid hyperparameter.
    """
    return default_registry().factory(name, impl=impl, provider=provider, **hparams)


def spec(name: str, *, provider: str | None = None) -> OptimizerSpec:
    """Return the :class:`OptimizerSpec` of ``name`` (defaults, fields, slots, provider)."""
    return default_registry().spec(name, provider=provider)


def optimizers() -> list[str]:
    """Names of every available algorithm, sorted; aliases are not listed."""
    return default_registry().optimizers()


def plugins() -> list[PluginInfo]:
    """Every plugin found, with distribution, version, status and what it provides."""
    return default_registry().plugins()


def schedule(name: str, *, provider: str | None = None, **kwargs: Any) -> Schedule:
    """Build learning-rate schedule ``name`` (``optiplug.schedules()`` lists them).

    Args:
        name: schedule name, e.g. ``"cosine"``.
        provider: plugin or distribution to take ``name`` from when several provide it.
        **kwargs: the schedule's parameters, validated now.

    Returns:
        A :class:`Schedule`: ``schedule(step) -> multiplier`` of each group's base lr.

    Raises:
        UnknownScheduleError: no plugin provides ``name`` (with a suggestion).
        OptimizerUnavailableError: its plugin failed, is disabled or unavailable.
        PluginConflictError: several plugins provide ``name`` and no ``provider``.
        HyperparameterError: an unknown, missing or invalid parameter, naming
            the schedule, the field and the value.
    """
    built: Schedule = default_registry().schedule(name, provider=provider, **kwargs)
    return built


def schedules() -> list[str]:
    """Names of every available schedule, sorted; aliases are not listed."""
    return default_registry().schedules()


def validate_state_dict(optimizer: Any, state_dict: Any) -> list[Problem]:
    """Check ``state_dict`` against ``optimizer`` without loading it.

    Checks structure, group count and sizes, parameter names (when both sides
    have them), state slots against the algorithm's schema (presence, shape,
    dtype, finiteness, constraints such as non-negative second moments),
    saved hyperparameters through the constructor's validators, state of
    another algorithm, and every plugin's ``optiplug_validate_state_dict``.

    Args:
        optimizer: the ``torch.optim.Optimizer`` it would be loaded into.
        state_dict: the candidate state dict; neither is modified.

    Returns:
        Every :class:`Problem`, sorted; empty when the state dict is valid.
    """
    from ._state import load as state  # deferred: imports torch

    return state.validate_state_dict(optimizer, state_dict)


def load_state_dict(optimizer: Any, state_dict: Any, *, strict: bool = True) -> list[Problem]:
    """Validate, then load ``state_dict`` into ``optimizer`` all-or-nothing.

    State is matched by parameter name when both sides carry ``param_names``
    (reordered parameters are safe), else by position. Every tensor is
    copied. The saved hyperparameters (lr...) replace the optimizer's, as in
    torch; differences are returned as ``hyperparameter-changed`` problems.
    The optimizer keeps its own implementation flags (foreach, fused...).

    Args:
        optimizer: the ``torch.optim.Optimizer`` to load into.
        state_dict: as returned by ``state_dict()`` (here or in plain torch).
        strict: True raises on any problem; False loads what is valid and
            leaves the rest (a parameter's state, a group key) as it was.

    Returns:
        The problems skipped (``strict=False`` only) and the
        ``hyperparameter-changed`` notes, sorted.

    Raises:
        StateDictError: with ``.problems``; the optimizer is bit-for-bit
            unchanged. With ``strict=False`` only when the structure (groups,
            top-level keys) prevents loading anything.
    """
    from ._state import load as state  # deferred: imports torch

    return state.load_state_dict(optimizer, state_dict, strict=strict)


def memory(optimizer: Any) -> MemoryReport:
    """Measure the memory ``optimizer``'s state takes, by slot and by param group.

    Works for any ``torch.optim.Optimizer``: optiplug's (``multi`` reports its
    sub-optimizers' state, in its groups' order) and plain torch ones. Each
    storage counts once (views and aliases of one tensor, and state sharing a
    parameter's storage, add nothing); tensor-valued hyperparameters (a tensor
    ``lr``) count under their key. A DTensor counts this rank's shard.

    Args:
        optimizer: the optimizer to measure (typically after its first step,
            when the state exists).

    Returns:
        A :class:`MemoryReport`: ``total``, ``by_slot``, ``by_group`` (bytes),
        and the parameters' own bytes and element count.

    Raises:
        TypeError: not an optimizer (no ``state`` and ``param_groups``).
    """
    from ._state import memory as measure  # deferred: imports torch

    return measure.memory_report(optimizer)


def estimate_memory(
    name: str,
    num_parameters: float,
    *,
    dtype: str = "float32",
    num_tensors: int | None = None,
    provider: str | None = None,
    **hparams: Any,
) -> MemoryEstimate:
    """Estimate the state memory algorithm ``name`` needs, from its declared state slots.

    A parameter-shaped slot takes ``num_parameters`` elements of the
    parameter dtype (4 bytes for ``float32`` slots such as a fused ``step``);
    a scalar slot takes one element per parameter tensor (``num_tensors``;
    default one tensor per million parameters, at least one). Conditional
    slots count according to the algorithm's defaults and ``hparams``
    (``amsgrad=True`` adds AdamW's ``max_exp_avg_sq``). Nothing is built and
    torch is not imported.

    Args:
        name: algorithm name or alias.
        num_parameters: parameter elements (``7e9``).
        dtype: the parameters' dtype (``"float32"``, ``"bfloat16"``, ``"fp16"``...).
        num_tensors: parameter tensors, for scalar slots; None estimates.
        provider: plugin or distribution to take ``name`` from when several provide it.
        **hparams: hyperparameters deciding conditional slots.

    Returns:
        A :class:`MemoryEstimate` (``total`` bytes, ``by_slot``, and the slots
        ``omitted`` with why).

    Raises:
        UnknownOptimizerError: no plugin provides ``name``.
        HyperparameterError: an unknown dtype or hyperparameter name, a bad
            count, or an algorithm that declares no state slots.
    """
    found = default_registry().spec(name, provider=provider)
    return _estimate(found, num_parameters, dtype=dtype, num_tensors=num_tensors, hparams=hparams)


provide_default_registry(default_registry)
provide_chooser_factory(new_chooser)
provide_builtin_plugins((("schedules", _schedules_plugin), ("rules", _rules)))

"""Module-level API over the process-wide default registry."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from ._create import OptimizerFactory, create_optimizer, validated_hparams
from ._registry import Registry
from ._specs import OptimizerSpec, PluginInfo

__all__ = [
    "create",
    "default_registry",
    "factory",
    "optimizers",
    "plugins",
    "reset_default_registry",
    "spec",
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
) -> Any:
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
    return create_optimizer(
        default_registry(), name, params, impl=impl, provider=provider, **hparams
    )


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
        Same as :func:`create`, except nothing is built.
    """
    found = spec(name, provider=provider)
    validated_hparams(found, hparams)
    return OptimizerFactory(found.name, hparams, impl=impl, provider=provider)


def spec(name: str, *, provider: str | None = None) -> OptimizerSpec:
    """Return the :class:`OptimizerSpec` of ``name`` (defaults, fields, slots, provider)."""
    return default_registry().spec(name, provider=provider)


def optimizers() -> list[str]:
    """Names of every available algorithm, sorted; aliases are not listed."""
    return default_registry().optimizers()


def plugins() -> list[PluginInfo]:
    """Every plugin found, with distribution, version, status and what it provides."""
    return default_registry().plugins()

"""How an object that carries no registry finds one.

Factories, selections and schedules built through a :class:`~optiplug.Registry`
carry it. Objects that lost theirs (unpickled in another process) or never had
one (built directly from their class) use the registry the facade provides:
``optiplug._api`` installs its process-wide default here when it is imported,
and no other module names the default registry.
"""

from __future__ import annotations

from collections.abc import Callable

from .protocols import OptimizerCreator

__all__ = ["provide_default_registry", "provided_default"]

_default_provider: list[Callable[[], OptimizerCreator]] = []


def provide_default_registry(provider: Callable[[], OptimizerCreator]) -> None:
    """Install the function that returns the process-wide default registry (the facade's)."""
    _default_provider[:] = [provider]


def provided_default() -> OptimizerCreator:
    """The default registry the facade provides.

    Returns:
        The registry.

    Raises:
        RuntimeError: no default was provided (``optiplug`` was not imported).
    """
    if not _default_provider:
        raise RuntimeError("no default optiplug registry: import optiplug first")
    return _default_provider[0]()

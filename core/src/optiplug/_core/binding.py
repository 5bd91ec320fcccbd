"""How an object that carries no registry finds one.

Factories, selections and schedules built through a :class:`~optiplug.Registry`
carry it. Objects that lost theirs (unpickled in another process) or never had
one (built directly from their class) use the registry the facade provides:
``optiplug._api`` installs its process-wide default here when it is imported,
and no other module names the default registry.
"""

from __future__ import annotations

from collections.abc import Callable

from .protocols import ImplementationSelector, OptimizerCreator

__all__ = [
    "new_chooser",
    "provide_chooser_factory",
    "provide_default_registry",
    "provided_default",
]

_default_provider: list[Callable[[], OptimizerCreator]] = []
_chooser_factory: list[Callable[[], ImplementationSelector]] = []


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


def provide_chooser_factory(factory: Callable[[], ImplementationSelector]) -> None:
    """Install the function that makes a registry's implementation chooser (the facade's).

    The chooser lives in a layer above the registry, so the registry cannot
    name its class: the facade, which sits above both, hands the registry
    this factory, and each registry calls it once, for its own chooser.
    """
    _chooser_factory[:] = [factory]


def new_chooser() -> ImplementationSelector:
    """A new implementation chooser, from the factory the facade installed.

    Returns:
        The chooser.

    Raises:
        RuntimeError: no factory was installed (``optiplug`` was not imported).
    """
    if not _chooser_factory:
        raise RuntimeError("no optiplug implementation chooser: import optiplug first")
    return _chooser_factory[0]()

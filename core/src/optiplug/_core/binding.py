"""How an object that carries no registry finds one.

Factories, selections and schedules built through a :class:`~optiplug.Registry`
carry it. Objects that lost theirs (unpickled in another process) or never had
one (built directly from their class) use the registry the facade provides:
``optiplug._api`` installs its process-wide default here when it is imported,
and no other module names the default registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .registry import Registry

__all__ = ["bound_registry", "provide_default_registry"]

_default_provider: list[Callable[[], Registry]] = []


def provide_default_registry(provider: Callable[[], Registry]) -> None:
    """Install the function that returns the process-wide default registry (the facade's)."""
    _default_provider[:] = [provider]


def bound_registry(registry: Registry | None) -> Registry:
    """Return ``registry``, or the default registry when it is None.

    Args:
        registry: the registry an object carries, or None.

    Returns:
        A registry.

    Raises:
        RuntimeError: None was given and no default registry was provided
            (``optiplug`` was not imported).
    """
    if registry is not None:
        return registry
    if not _default_provider:
        raise RuntimeError("no default optiplug registry: import optiplug first")
    return _default_provider[0]()

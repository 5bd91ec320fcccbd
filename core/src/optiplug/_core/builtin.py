"""The core's own plugins: built-in features register through the same hooks.

Like pytest's built-in plugins, optiplug's schedules, selection rules and
commands are plugin modules of the distribution ``optiplug``. The core names
none of them: each is added by the layer that owns it, so no layer reaches up.

- The facade (``optiplug._api``) provides the schedules and selection rules
  here when it is imported (:func:`provide_builtin_plugins`); every
  :class:`~optiplug.Registry` registers them first.
- The commands (``list``, ``show``...) are entry points of the ``optiplug``
  distribution, loaded with the other plugins; the command line loads them
  (and the applications' commands, from their own distributions) into the
  registry it uses even without autoload
  (:meth:`~optiplug.Registry.load_distribution`).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

__all__ = ["DISTRIBUTION", "builtin_plugins", "provide_builtin_plugins", "version"]

DISTRIBUTION = "optiplug"
"""The core distribution, which ships the built-in plugins."""

_provided: list[tuple[str, object]] = []


def provide_builtin_plugins(plugins: Iterable[tuple[str, object]]) -> None:
    """Install the ``(name, plugin module)`` pairs every registry registers first.

    Args:
        plugins: the built-in plugins, in registration order (the facade's).
    """
    _provided[:] = list(plugins)


def builtin_plugins() -> tuple[tuple[str, object], ...]:
    """The ``(name, plugin module)`` pairs provided so far, in registration order."""
    return tuple(_provided)


def version() -> str:
    """The installed version of the core distribution."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"

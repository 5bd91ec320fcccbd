"""The core's own plugins: built-in features register through the same hooks.

Like pytest's built-in plugins, the core's schedules and selection rules are
plugin modules registered first in every :class:`~optiplug.Registry`, under
the distribution ``optiplug``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterator
from types import ModuleType

__all__ = ["BUILTIN_PLUGINS", "plugins", "version"]

BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("schedules", "optiplug._schedules.plugin"),
    ("rules", "optiplug._auto.rules"),
    ("commands", "optiplug.cli.plugin"),
    ("train", "optiplug._train.plugin"),
)
"""``(plugin name, module)`` of each built-in plugin, in registration order."""


def plugins() -> Iterator[tuple[str, ModuleType]]:
    """Yield ``(name, module)`` for each built-in plugin (imports them)."""
    for name, module in BUILTIN_PLUGINS:
        yield name, importlib.import_module(module)


def version() -> str:
    """The installed version of the core distribution."""
    try:
        return importlib.metadata.version("optiplug")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"

"""Loading one plugin: its API version, its records, and the record of a plugin that did not load.

The :class:`~optiplug.Registry` calls these under its lock and keeps what
they return; none of them touches a registry.
"""

from __future__ import annotations

import os
import warnings
from typing import TypeVar

import attrs
import pluggy

from ..errors import PluginUnavailable, PluginWarning
from .catalog import Contributions
from .hookcalls import UnknownHooks, failure_text, plugin_managers, unknown_hooks
from .hooks import PLUGIN_API_VERSION
from .specs import (
    CommandSpec,
    ImplementationSpec,
    OptimizerSpec,
    PluginInfo,
    ProviderInfo,
    ScheduleSpec,
)

__all__ = [
    "Incompatible",
    "check_api",
    "env_list",
    "interrupted",
    "not_loaded",
    "plugin_records",
]

_Record = TypeVar("_Record", OptimizerSpec, ImplementationSpec, ScheduleSpec, CommandSpec)


class Incompatible(Exception):
    """A plugin targets a plugin API major version this core does not speak."""


def env_list(name: str) -> frozenset[str]:
    """The comma-separated names of environment variable ``name`` (blank parts dropped)."""
    return frozenset(part.strip() for part in os.environ.get(name, "").split(",") if part.strip())


def check_api(plugin: object) -> None:
    """Raise :class:`Incompatible` unless ``plugin``'s ``OPTIPLUG_API`` (if any) is this core's major."""
    declared = getattr(plugin, "OPTIPLUG_API", None)
    if declared is None:
        return
    try:
        major = int(str(declared).split(".")[0])
    except ValueError:
        raise Incompatible(f"OPTIPLUG_API={declared!r} is not a version number") from None
    if major != PLUGIN_API_VERSION:
        raise Incompatible(
            f"targets plugin API {major}, this optiplug speaks API {PLUGIN_API_VERSION}; "
            "upgrade or downgrade the plugin or optiplug"
        )


def plugin_records(
    plugin: object, name: str, provider: ProviderInfo
) -> tuple[Contributions, pluggy.PluginManager, pluggy.PluginManager | None]:
    """Ask ``plugin`` alone (its own wrappers included) for its records.

    Returns:
        Its records, and its own managers (see :func:`.hookcalls.plugin_managers`).

    Raises:
        UnknownHooks: it has ``optiplug_*`` functions that are not hooks.
        TypeError: a hook returned something else than its records.
    """
    unknown = unknown_hooks(plugin)
    if unknown:
        raise UnknownHooks(unknown)
    alone, plain, wrapping = plugin_managers(plugin, name)
    contributions = Contributions(
        optimizers=_records(alone, "optiplug_optimizers", OptimizerSpec, provider),
        implementations=_records(alone, "optiplug_implementations", ImplementationSpec, provider),
        schedules=_records(alone, "optiplug_schedules", ScheduleSpec, provider),
        commands=_records(alone, "optiplug_cli_commands", CommandSpec, provider),
    )
    return contributions, plain, wrapping


def _records(
    manager: pluggy.PluginManager, hook_name: str, kind: type[_Record], provider: ProviderInfo
) -> list[_Record]:
    """The ``kind`` records ``manager``'s plugin returns from ``hook_name``, with ``provider``.

    Raises:
        TypeError: it returned anything else (and whatever its hook raised).
    """
    found: list[_Record] = []
    for returned in getattr(manager.hook, hook_name)():
        for record in returned:
            if not isinstance(record, kind):
                raise TypeError(
                    f"{hook_name} returned {type(record).__name__}, expected {kind.__name__}"
                )
            found.append(attrs.evolve(record, provider=provider))
    return found


def not_loaded(base: PluginInfo, error: BaseException) -> PluginInfo:
    """The record of a plugin whose import, API check or registration hooks raised.

    A ``KeyboardInterrupt`` (perhaps the user's Ctrl-C) gets a ``failed``
    record and no warning: the caller records it, then raises it again with
    a message naming the plugin. Any other exception, ``SystemExit``
    included, only fails this plugin, with a :class:`PluginWarning`.
    """
    if isinstance(error, PluginUnavailable):
        return attrs.evolve(base, status="unavailable", provides=error.provides, error=error.reason)
    if isinstance(error, Incompatible):
        return attrs.evolve(base, status="incompatible", error=str(error))
    text = failure_text(error, "loading")
    if not isinstance(error, KeyboardInterrupt):
        warnings.warn(
            f"optiplug plugin {_origin(base)} failed to load and is skipped ({text}); "
            "other plugins keep working",
            PluginWarning,
            stacklevel=4,
        )
    return attrs.evolve(base, status="failed", error=text)


def _origin(info: PluginInfo) -> str:
    return f"{info.name!r} ({info.distribution} {info.version})"


def interrupted(base: PluginInfo) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` to raise again, naming the plugin it interrupted."""
    return KeyboardInterrupt(f"interrupted while loading optiplug plugin {_origin(base)}")

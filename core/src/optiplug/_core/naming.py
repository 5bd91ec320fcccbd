"""How names resolve: loose matching, ``plugin:name`` qualifiers, native names before bridged ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..errors import PluginConflictError
from .specs import OptimizerSpec, PluginInfo, ScheduleSpec

__all__ = [
    "QUALIFIER",
    "folded_name",
    "loosely_named",
    "native_or_conflict",
    "provider_names",
    "provider_tuple",
    "provides",
    "qualified_name",
    "split_qualified",
]

Named = TypeVar("Named", OptimizerSpec, ScheduleSpec)
"""Records looked up by name or alias."""


def folded_name(name: str) -> str:
    """``name`` as lookups compare it loosely: lower case, without ``_``, ``-``, spaces or dots.

    ``"AdamW"``, ``"adam_w"`` and ``"Adam-W"`` all fold to ``"adamw"``.
    """
    return "".join(char for char in name.lower() if char.isalnum())


def loosely_named(table: Mapping[str, list[Named]], name: str) -> list[Named]:
    """The records whose name or an alias folds like ``name`` (:func:`folded_name`).

    Exact names and aliases are tried first (by the caller); this runs only
    when neither matched. When several names fold alike, the records of the
    one that is a canonical name win; if it is still ambiguous, nothing matches.
    """
    folded = folded_name(name)
    if not folded:
        return []
    canonical = [n for n in table if folded_name(n) == folded]
    if len(canonical) == 1:
        return list(table[canonical[0]])
    if canonical:
        return []
    by_alias = {
        rec.name: rec
        for recs in table.values()
        for rec in recs
        if any(folded_name(alias) == folded for alias in rec.aliases)
    }
    if len(by_alias) == 1:
        return list(table[next(iter(by_alias))])
    return []


QUALIFIER = ":"
"""Separates a provider from a name: ``"heavyball:soap"`` is ``soap`` from plugin ``heavyball``."""


def split_qualified(name: str) -> tuple[str | None, str]:
    """``("heavyball", "soap")`` for ``"heavyball:soap"``; ``(None, name)`` for a plain name.

    Args:
        name: a plain or qualified name.

    Returns:
        ``(provider or None, plain name)``.
    """
    provider, separator, plain = name.partition(QUALIFIER)
    return (provider.strip() or None, plain.strip()) if separator else (None, name)


def qualified_name(record: Any) -> str:
    """``"plugin:name"`` for a record with a provider, else its plain name.

    Args:
        record: an :class:`OptimizerSpec` or :class:`ScheduleSpec` from a registry.

    Returns:
        The name :meth:`Registry.spec` resolves to exactly this record.
    """
    info = record.provider
    return f"{info.plugin}{QUALIFIER}{record.name}" if info is not None else record.name


def native_or_conflict(name: str, entries: Sequence[Named]) -> Named:
    """The one native record among ``entries`` (not bridged from another library), else a conflict.

    Raises:
        PluginConflictError: none or several of them are native.
    """
    native = [rec for rec in entries if getattr(rec, "origin", None) is None]
    if len(native) == 1:
        return native[0]
    raise PluginConflictError(
        name,
        [provider_tuple(rec) for rec in entries],
        qualified=[qualified_name(rec) for rec in entries],
    )


def provider_names(record: Any) -> set[str]:
    info = record.provider
    return {info.plugin, info.distribution} if info is not None else set()


def provider_tuple(record: Any) -> tuple[str, str, str]:
    info = record.provider
    return (info.plugin, info.distribution, info.version) if info else ("?", "?", "?")


def provides(info: PluginInfo, name: str) -> bool:
    return any(item == name or item.partition(":")[2] == name for item in info.provides)

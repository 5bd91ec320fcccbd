"""Finding plugins: the entry points of optiplug's group, each once, in a stable order."""

from __future__ import annotations

import importlib.metadata

__all__ = ["ENTRY_POINT_GROUP", "distribution_entry_points", "entry_points"]

ENTRY_POINT_GROUP = "optiplug.plugins"
"""The entry-point group plugins register under."""


def entry_points() -> list[importlib.metadata.EntryPoint]:
    seen: set[tuple[str, str, str]] = set()
    unique = []
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = entry_point.dist.name if entry_point.dist is not None else ""
        key = (entry_point.name, entry_point.value, dist)
        if key not in seen:
            seen.add(key)
            unique.append(entry_point)
    return sorted(unique, key=lambda ep: (ep.name, ep.value))


def distribution_entry_points(name: str) -> list[importlib.metadata.EntryPoint]:
    """The entry points of the group that distribution ``name`` declares, sorted."""
    try:
        declared = importlib.metadata.distribution(name).entry_points
    except importlib.metadata.PackageNotFoundError:
        return []
    return sorted(declared.select(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.name, ep.value))

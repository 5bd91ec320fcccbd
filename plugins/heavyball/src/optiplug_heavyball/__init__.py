"""heavyball's optimizers in optiplug's registry (``optiplug.create("heavyball:soap", ...)``).

The entry point (:mod:`optiplug_heavyball.plugin`) registers every optimizer
of the static catalogue (:mod:`optiplug_heavyball.catalog`) lazily: importing
this package imports neither torch nor heavyball. The classes, in
:mod:`optiplug_heavyball.optimizers`, import both.
"""

from __future__ import annotations

from typing import Any

from .catalog import CATALOG, EXCLUDED, LIBRARY_DEFAULT, VERSION

__all__ = ["CATALOG", "EXCLUDED", "LIBRARY_DEFAULT", "VERSION"]


def __getattr__(name: str) -> Any:
    """The optimizer classes (``optiplug_heavyball.SOAP``), built on first access."""
    if name[:1].isupper():
        from . import optimizers  # deferred: imports torch

        if name in vars(optimizers):
            return getattr(optimizers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Module paths of optiplug 0.1.0, kept importable for this release.

Objects pickled by 0.1.0 name the flat private modules of that layout
(``optiplug._create.OptimizerFactory``). A finder on ``sys.meta_path`` maps
each old path to the module that now holds the code, so those pickles still
load; importing an old path warns with a ``DeprecationWarning``. New pickles
name public paths (``optiplug.OptimizerFactory``). Removed in 0.2.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["RENAMED_MODULES", "install"]

RENAMED_MODULES: dict[str, str] = {
    "optiplug._specs": "optiplug._core.specs",
    "optiplug._hooks": "optiplug._core.hooks",
    "optiplug._builtin": "optiplug._core.builtin",
    "optiplug._registry": "optiplug._core.registry",
    "optiplug._create": "optiplug._core.create",
    "optiplug._autotune": "optiplug._core.autotune",
    "optiplug._ranks": "optiplug._core.ranks",
    "optiplug._implementations": "optiplug._core.implementations",
    "optiplug._routing": "optiplug._core.routing",
    "optiplug._builtin_schedules": "optiplug._schedules.plugin",
    "optiplug._state_check": "optiplug._state.check",
    "optiplug._state_values": "optiplug._state.values",
    "optiplug._checkpoint_format": "optiplug._checkpoint.format",
    "optiplug._checkpoint_io": "optiplug._checkpoint.io",
    "optiplug._checkpoint_state": "optiplug._checkpoint.state",
    "optiplug._model_config": "optiplug._auto.model_config",
    "optiplug._builtin_rules": "optiplug._auto.rules",
    "optiplug._cli_auto": "optiplug.cli.auto",
    "optiplug._cli_check": "optiplug.cli.check",
    "optiplug._cli_schedule": "optiplug.cli.schedule",
}
"""Old module path -> the module that holds its code now. (Old paths that are
packages now, ``optiplug._schedules`` and ``optiplug._auto``, re-export their
pickled classes themselves.)"""


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the new module object itself (one module, two names)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is an optiplug 0.1.0 module path; it now lives in {self.target} "
            "(use the public names in optiplug instead); the old path goes in 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module is already imported."""


class _RenamedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`RENAMED_MODULES`, and nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = RENAMED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _RenamedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_RenamedModuleFinder())

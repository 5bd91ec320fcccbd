"""Module paths of optiplug 0.1.0, and public paths that moved to other distributions.

Objects pickled by 0.1.0 name the flat private modules of that layout
(``optiplug._create.OptimizerFactory``). A finder on ``sys.meta_path`` maps
each old path to the module that now holds the code, so those pickles still
load; importing an old path warns with a ``DeprecationWarning``. New pickles
name public paths (``optiplug.OptimizerFactory``). Removed in 0.2.

The training application and the framework integrations are distributions
of their own now (``optiplug-train``, ``optiplug-integrations``): their old
paths (``optiplug.integrations.transformers``, ``optiplug.leaderboard``)
still work for this release where the new distribution is installed, with a
``DeprecationWarning``, and name what to install where it is not.

It also allowlists optiplug's picklable records for
``torch.load(..., weights_only=True)`` (under both paths) without importing
torch: see :func:`allow_in_weights_only_load`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "MOVED_MODULES",
    "RENAMED_MODULES",
    "allow_in_weights_only_load",
    "install",
    "moved",
    "publish",
    "weights_only_globals",
]

RENAMED_MODULES: dict[str, str] = {
    "optiplug._specs": "optiplug._core.specs",
    "optiplug._hooks": "optiplug._core.hooks",
    "optiplug._builtin": "optiplug._core.builtin",
    "optiplug._registry": "optiplug._core.registry",
    "optiplug._create": "optiplug._core.create",
    "optiplug._autotune": "optiplug._choice.timing",
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

MOVED_MODULES: dict[str, str] = {
    f"optiplug.integrations.{name}": f"optiplug_integrations.{name}"
    for name in ("transformers", "lightning", "timm", "layerwise")
}
"""Public module path of 0.1.0 -> its module in another distribution now."""


def _distribution(module: str) -> str:
    """The distribution that provides first-party package ``module`` (``optiplug_train`` -> ``optiplug-train``)."""
    return module.partition(".")[0].replace("_", "-")


def _import_moved(old: str, new: str, stacklevel: int) -> ModuleType:
    """Import ``new``, which ``old`` names now, with a DeprecationWarning; name what to install."""
    distribution = _distribution(new)
    warnings.warn(
        f"{old} moved to {new} (distribution {distribution}); the old path goes in 0.2",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    try:
        return importlib.import_module(new)
    except ModuleNotFoundError as error:
        if error.name is None or not new.startswith(error.name):
            raise
        raise ModuleNotFoundError(
            f"{old} moved to {new}, which is not installed; install it with: "
            f"pip install {distribution}",
            name=error.name,
        ) from None


def moved(old: str, package: str, name: str) -> Any:
    """The object ``old`` named, now ``package.name``, with a DeprecationWarning.

    Raises:
        AttributeError: ``package`` is not installed (saying what to install).
    """
    try:
        return getattr(_import_moved(old, package, stacklevel=4), name)
    except ModuleNotFoundError as error:
        raise AttributeError(str(error), name=name) from None


def publish(module: str, namespace: Mapping[str, Any], names: Iterable[str]) -> None:
    """Report ``module`` as the ``__module__`` of each class and function among ``names``.

    Pickles, ``torch.serialization.add_safe_globals`` and docs then name the
    public path (``optiplug.OptimizerFactory``), which survives moving code
    between private modules.

    Args:
        module: the public module's name.
        namespace: its globals.
        names: the public names to report there (other values are left alone).
    """
    for name in names:
        value = namespace[name]
        if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
            value.__module__ = module


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the new module object itself (one module, two names)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if spec.name in MOVED_MODULES:
            return _import_moved(spec.name, self.target, stacklevel=2)
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
    """Finds the old paths of :data:`RENAMED_MODULES` and :data:`MOVED_MODULES`, and nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = RENAMED_MODULES.get(fullname) or MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _RenamedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_RenamedModuleFinder())


# ------------------------------------------------------- torch.load(weights_only=True)
_safe_globals: list[Any] = []
"""What :func:`allow_in_weights_only_load` was given, plus the 0.1.0 path of each."""

_LEGACY_PACKAGES = ("optiplug._schedules", "optiplug._auto")
"""0.1.0 paths that are packages now and re-export their pickled classes themselves."""


def _legacy_paths(obj: Any) -> list[tuple[Any, str]]:
    """``(obj, "old.module.Name")`` for each 0.1.0 module path ``obj`` was pickled under.

    An old path is one of :data:`RENAMED_MODULES` whose new module holds
    ``obj``, or a package of :data:`_LEGACY_PACKAGES` that re-exports it.
    Only modules already imported are looked at (this imports nothing).
    """
    name = obj.__qualname__
    olds = [old for old, new in RENAMED_MODULES.items() if _holds(new, name, obj)]
    olds += [package for package in _LEGACY_PACKAGES if _holds(package, name, obj)]
    return [(obj, f"{old}.{name}") for old in olds]


def _holds(module: str, name: str, obj: Any) -> bool:
    return getattr(sys.modules.get(module), name, None) is obj


def weights_only_globals() -> list[Any]:
    """Everything optiplug allowlists for ``torch.load(..., weights_only=True)``.

    Returns:
        Classes (found by their public path, e.g. ``optiplug.OptimizerFactory``)
        and ``(class, "optiplug._create.OptimizerFactory")`` pairs for the
        paths optiplug 0.1.0 pickled them under; the form
        ``torch.serialization.add_safe_globals`` takes.
    """
    return list(_safe_globals)


def allow_in_weights_only_load(objects: Iterable[Any]) -> None:
    """Let ``torch.load(..., weights_only=True)`` rebuild ``objects`` without the user's help.

    ``import optiplug`` must not import torch, so the allowlist is handed to
    ``torch.serialization.add_safe_globals`` at the first moment torch exists:

    * torch already imported (``import torch`` before ``import optiplug``):
      now;
    * otherwise: right after ``import torch`` finishes, by a one-shot finder
      at the front of ``sys.meta_path`` that wraps the loader of the
      ``torch`` module (and restores it once torch is imported, then removes
      itself). It finds nothing itself: it asks the finders behind it.

    Either way ``import optiplug, torch; torch.load(path, weights_only=True)``
    works in a fresh process, in both import orders. The objects must be
    safe to rebuild from data: classes whose ``__setstate__`` (or
    ``__new__`` + slot assignment) runs no code named by the pickle.

    Args:
        objects: classes to allowlist under their ``__module__.__qualname__``;
            their 0.1.0 paths are allowlisted too.
    """
    for obj in objects:
        for entry in (obj, *_legacy_paths(obj)):
            if entry not in _safe_globals:
                _safe_globals.append(entry)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(getattr(torch, "serialization", None), "add_safe_globals"):
        _register_with_torch()
    elif not any(isinstance(finder, _TorchImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportHook())


def _register_with_torch() -> None:
    """Hand :data:`_safe_globals` to torch (idempotent: torch keeps a set)."""
    sys.modules["torch"].serialization.add_safe_globals(list(_safe_globals))


class _RegisteringLoader(importlib.abc.Loader):
    """Runs torch's own loader, then registers optiplug's safe globals."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:  # get_data, is_package, get_resource_reader...
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self.loader.exec_module(module)
        finally:  # torch sees its own loader from now on
            module.__loader__ = self.loader
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchImportHook)]
        _register_with_torch()


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``torch`` so optiplug's safe globals follow ``import torch``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None

"""optiplug: a plugin-based optimizer registry for PyTorch.

Optimizers live in plugin distributions found through the ``optiplug.plugins``
entry-point group; this package defines the contract (records, hooks, errors)
and resolves names at run time::

    import optiplug
    opt = optiplug.create("adamw", model.named_parameters(), lr=3e-4)

Importing this package scans no entry points, imports no plugin and does not
import torch; discovery happens once, on first need.
"""

from __future__ import annotations

from . import errors, validators
from ._api import (
    create,
    default_registry,
    factory,
    optimizers,
    plugins,
    reset_default_registry,
    spec,
)
from ._builtin import version as _version
from ._create import OptimizerFactory
from ._hooks import PLUGIN_API_VERSION, hookimpl, hookspec
from ._implementations import torch_implementations
from ._lazy import LazyCallable, lazy
from ._registry import ENTRY_POINT_GROUP, PluginWarning, Registry
from ._specs import (
    Candidate,
    ImplementationSpec,
    OptimizerSpec,
    PluginInfo,
    Problem,
    ProviderInfo,
    ScheduleSpec,
    SelectionRequest,
    StateSlot,
)

__version__ = _version()

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGIN_API_VERSION",
    "Candidate",
    "ImplementationSpec",
    "LazyCallable",
    "OptimizerFactory",
    "OptimizerSpec",
    "PluginInfo",
    "PluginWarning",
    "Problem",
    "ProviderInfo",
    "Registry",
    "ScheduleSpec",
    "SelectionRequest",
    "StateSlot",
    "__version__",
    "create",
    "default_registry",
    "errors",
    "factory",
    "hookimpl",
    "hookspec",
    "lazy",
    "optimizers",
    "plugins",
    "reset_default_registry",
    "spec",
    "torch_implementations",
    "validators",
]

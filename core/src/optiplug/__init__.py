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

import importlib
from typing import TYPE_CHECKING

from . import _compat, errors, validators
from ._api import (
    create,
    default_registry,
    estimate_memory,
    factory,
    load_state_dict,
    memory,
    optimizers,
    plugins,
    reset_default_registry,
    schedule,
    schedules,
    spec,
    validate_state_dict,
)
from ._auto.evidence import Measurement
from ._auto.selection import AutoOptimizer
from ._core.builtin import version as _version
from ._core.create import OptimizerFactory
from ._core.hooks import PLUGIN_API_VERSION, hookimpl, hookspec
from ._core.implementations import torch_implementations
from ._core.record import OptimizerRecord, record_of
from ._core.registry import ENTRY_POINT_GROUP, PluginWarning, Registry
from ._core.routing import ParameterRoute, Routing
from ._core.selection import (
    CandidateReport,
    MemoryOption,
    MemoryPlan,
    Selection,
    TuneReport,
    TuneTrial,
)
from ._core.specs import (
    Candidate,
    CommandSpec,
    HFName,
    ImplementationSpec,
    OptimizerSpec,
    Origin,
    PluginInfo,
    Problem,
    ProviderInfo,
    ScheduleSpec,
    SelectionRequest,
    StateSlot,
)
from ._lazy import LazyCallable, lazy
from ._schedules.base import Schedule
from ._schedules.shapes import BUILTIN_SCHEDULES as _BUILTIN_SCHEDULES
from ._state.memory import MemoryEstimate, MemoryReport

if TYPE_CHECKING:  # imported on first access at run time (they import torch): see __getattr__
    from . import checkpoint
    from ._graph.graph import Graph

__version__ = _version()

__all__ = [
    "AutoOptimizer",
    "ENTRY_POINT_GROUP",
    "Graph",
    "PLUGIN_API_VERSION",
    "Candidate",
    "CandidateReport",
    "MemoryOption",
    "MemoryPlan",
    "CommandSpec",
    "HFName",
    "ImplementationSpec",
    "LazyCallable",
    "Measurement",
    "MemoryEstimate",
    "MemoryReport",
    "OptimizerFactory",
    "OptimizerRecord",
    "OptimizerSpec",
    "Origin",
    "ParameterRoute",
    "PluginInfo",
    "PluginWarning",
    "Problem",
    "ProviderInfo",
    "Registry",
    "Routing",
    "Schedule",
    "ScheduleSpec",
    "Selection",
    "SelectionRequest",
    "StateSlot",
    "TuneReport",
    "TuneTrial",
    "__version__",
    "checkpoint",
    "create",
    "default_registry",
    "estimate_memory",
    "errors",
    "factory",
    "hookimpl",
    "hookspec",
    "lazy",
    "load_state_dict",
    "memory",
    "optimizers",
    "plugins",
    "record_of",
    "reset_default_registry",
    "schedule",
    "schedules",
    "spec",
    "torch_implementations",
    "validate_state_dict",
    "validators",
]

_compat.install()


_compat.publish(
    __name__, globals(), (name for name in __all__ if name in globals() and not name.isupper())
)

# What users keep in checkpoints (factories, selections, schedules, and the
# records a selection holds) loads under torch.load(..., weights_only=True):
# allowlisted now if torch is imported, else right after `import torch`.
_compat.allow_in_weights_only_load(
    [
        OptimizerFactory,
        Selection,
        CandidateReport,
        MemoryOption,
        MemoryPlan,
        TuneReport,
        TuneTrial,
        Candidate,
        SelectionRequest,
        ProviderInfo,
        Schedule,
        *_BUILTIN_SCHEDULES,
    ]
)

_LAZY_SUBMODULES = frozenset({"checkpoint"})
"""Public submodules that import torch, imported on first attribute access."""


_LAZY_ATTRIBUTES = {"Graph": "._graph.graph"}
"""Public names whose modules import torch, imported on first attribute access."""

_MOVED = {
    "Board": "optiplug_train",
    "leaderboard": "optiplug_train",
    "board_evidence": "optiplug_train",
}
"""Names this package published before they moved to a distribution of their own."""


def __getattr__(name: str) -> object:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_ATTRIBUTES:
        return getattr(importlib.import_module(_LAZY_ATTRIBUTES[name], __name__), name)
    if name in _MOVED:
        return _compat.moved(f"{__name__}.{name}", _MOVED[name], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

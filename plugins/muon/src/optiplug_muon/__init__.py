"""optiplug-muon: Muon for hidden matrices, with an auxiliary AdamW for everything else.

``Muon`` routes embeddings, output heads and non-matrix parameters to AdamW
(by module type with ``model=``, else by name) and reports the routing with
``optimizer.routing()``. FSDP2 (``DTensor``) parameters are orthogonalised
whole on owner ranks; ``optimizer.last_step_report()`` says what a step did.
Importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

from .config import DEFAULT_AUX_PATTERNS, MUON_STATE, MuonConfig
from .report import StepReport

__all__ = [
    "DEFAULT_AUX_PATTERNS",
    "MUON_STATE",
    "Muon",
    "MuonConfig",
    "RoutingWarning",
    "StepReport",
    "UnsupportedPlacementError",
]


def __getattr__(name: str) -> Any:
    if name in {"Muon", "RoutingWarning", "UnsupportedPlacementError"}:
        from . import optimizer  # deferred: imports torch

        return getattr(optimizer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

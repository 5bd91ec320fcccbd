"""optiplug-muon: Muon for hidden matrices, with an auxiliary AdamW for everything else.

``Muon`` routes embeddings, output heads and non-matrix parameters to AdamW
(by module type with ``model=``, else by name) and reports the routing with
``optimizer.routing()``. Importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

from .config import DEFAULT_AUX_PATTERNS, MUON_STATE, MuonConfig

__all__ = ["DEFAULT_AUX_PATTERNS", "MUON_STATE", "Muon", "MuonConfig", "RoutingWarning"]


def __getattr__(name: str) -> Any:
    if name in {"Muon", "RoutingWarning"}:
        from . import optimizer  # deferred: imports torch

        return getattr(optimizer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""optiplug-muon: Muon and NorMuon for hidden matrices, with an auxiliary AdamW for the rest.

``Muon`` routes embeddings, output heads and non-matrix parameters to AdamW
(by module type with ``model=``, else by name) and reports the routing with
``optimizer.routing()``. ``NorMuon`` (arXiv 2510.05491) adds a neuron-wise
normalisation of the orthogonalised update; ``ns_coefficients="polar_express"``
(arXiv 2505.16932) and ``weight_decay_mode="cautious"`` apply to both, and
:func:`orthogonalize` exposes the orthogonalisation itself. FSDP2 (``DTensor``) parameters are orthogonalised
whole on owner ranks; ``optimizer.last_step_report()`` says what a step did.
Importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .coefficients import NS_COEFFICIENTS
from .config import (
    DEFAULT_AUX_PATTERNS,
    MUON_STATE,
    NORMUON_STATE,
    WEIGHT_DECAY_MODES,
    MuonConfig,
    NorMuonConfig,
)
from .report import StepReport

__all__ = [
    "DEFAULT_AUX_PATTERNS",
    "MUON_STATE",
    "NORMUON_STATE",
    "NS_COEFFICIENTS",
    "WEIGHT_DECAY_MODES",
    "Muon",
    "MuonConfig",
    "NorMuon",
    "NorMuonConfig",
    "RoutingWarning",
    "StepReport",
    "UnsupportedPlacementError",
    "orthogonalize",
]

_DEFERRED = {  # name -> module; these import torch
    "Muon": "optimizer",
    "RoutingWarning": "optimizer",
    "UnsupportedPlacementError": "optimizer",
    "NorMuon": "normuon",
    "orthogonalize": "newton_schulz",
}


def __getattr__(name: str) -> Any:
    module = _DEFERRED.get(name)
    if module is not None:
        return getattr(importlib.import_module(f".{module}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

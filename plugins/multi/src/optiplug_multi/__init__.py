"""optiplug-multi: run several algorithms over disjoint parameter sets as one optimizer.

``optiplug.create("multi", model.named_parameters(), routes=[...])``; each
route names a registered algorithm, a matcher and that algorithm's
hyperparameters; the first matching route wins. Importing this package does
not import torch.
"""

from __future__ import annotations

from typing import Any

from .routes import Route

__all__ = ["MultiOptimizer", "Route"]


def __getattr__(name: str) -> Any:
    if name == "MultiOptimizer":
        from .optimizer import MultiOptimizer  # deferred: imports torch

        return MultiOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

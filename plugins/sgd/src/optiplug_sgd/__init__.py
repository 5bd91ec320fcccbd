"""optiplug-sgd: stochastic gradient descent (with momentum and Nesterov) for optiplug.

``SGD`` is ``torch.optim.SGD`` with validated hyperparameters and a measured
choice of implementation; import it from here or create it by name with
``optiplug.create("sgd", params)``. Importing this package does not import
torch: ``SGD`` is imported on first access (:mod:`.optimizer`).
"""

from __future__ import annotations

from typing import Any

from .plugin import SGD_STATE, SGDConfig

__all__ = ["SGD", "SGD_STATE", "SGDConfig"]


def __getattr__(name: str) -> Any:
    if name != "SGD":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .optimizer import SGD  # deferred: imports torch

    return SGD

"""optiplug-lion: the Lion optimizer (sign momentum) for optiplug.

``Lion`` is a ``torch.optim.Optimizer`` with three implementations sharing
one state layout: ``loop`` (per-tensor torch ops), ``foreach``
(``torch._foreach_*``) and ``fused`` (one ``torch.compile``d kernel per
tensor). Importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

from .config import LION_STATE, LionConfig

__all__ = ["LION_STATE", "Lion", "LionConfig"]


def __getattr__(name: str) -> Any:
    if name == "Lion":
        from .optimizer import Lion  # deferred: imports torch

        return Lion
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

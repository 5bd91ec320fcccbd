"""optiplug-fused: Triton multi-tensor kernels for adamw, adam, sgd and lion.

Registers an implementation named ``triton`` for each of the four
algorithms (``optiplug.create("adamw", params, impl="triton")``). The
optimizer classes are importable from here (``optiplug_fused.TritonAdamW``);
importing this package imports neither torch nor triton until a class is
asked for.
"""

from __future__ import annotations

from typing import Any

from .availability import triton_supported, unavailable_reason

__all__ = [
    "TritonAdam",
    "TritonAdamW",
    "TritonLion",
    "TritonSGD",
    "triton_supported",
    "unavailable_reason",
]

_CLASSES = frozenset({"TritonAdam", "TritonAdamW", "TritonLion", "TritonSGD"})


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        from . import optimizers  # deferred: imports torch

        return getattr(optimizers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Implementation records for torch-backed optimizers, without importing torch."""

from __future__ import annotations

from .._lazy import lazy
from .specs import ImplementationSpec

__all__ = [
    "TORCH_IMPLEMENTATION_FLAGS",
    "TORCH_IMPLEMENTATION_PRIORITY",
    "torch_implementations",
]

TORCH_IMPLEMENTATION_FLAGS: dict[str, dict[str, bool]] = {
    "loop": {"foreach": False, "fused": False},
    "foreach": {"foreach": True, "fused": False},
    "fused": {"foreach": False, "fused": True},
}
"""The torch constructor flags that select each implementation."""

TORCH_IMPLEMENTATION_PRIORITY = {"fused": 2, "foreach": 1, "loop": 0}
"""Order used when implementations are not measured (``OPTIPLUG_AUTOTUNE=0``)."""

_DESCRIPTIONS = {
    "loop": "torch's per-tensor loop (for-loop over parameters)",
    "foreach": "torch's multi-tensor foreach kernels",
    "fused": "torch's fused kernel (one kernel per step)",
}


def torch_implementations(algorithm: str, target: str) -> tuple[ImplementationSpec, ...]:
    """Implementation records for a :class:`optiplug.base.TorchBackedOptimizer` class.

    Args:
        algorithm: the algorithm's name.
        target: ``"module:Class"`` of the optimizer class, imported lazily.

    Returns:
        ``loop``, ``foreach`` and ``fused`` records whose factories force that
        implementation and whose ``supports`` checks device, dtype and layout.
    """
    supports = {
        "fused": lazy("optiplug.base:fused_supported"),
        "foreach": lazy("optiplug.base:foreach_supported"),
    }
    return tuple(
        ImplementationSpec(
            algorithm,
            name,
            lazy(target, impl=name),
            supports=supports.get(name),
            priority=TORCH_IMPLEMENTATION_PRIORITY[name],
            description=_DESCRIPTIONS[name],
        )
        for name in TORCH_IMPLEMENTATION_FLAGS
    )

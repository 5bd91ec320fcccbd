"""Implementation records for torch-backed optimizers, without importing torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._lazy import lazy
from .specs import ImplementationSpec

if TYPE_CHECKING:
    import torch

__all__ = [
    "TORCH_IMPLEMENTATION_FLAGS",
    "TORCH_IMPLEMENTATION_PRIORITY",
    "foreach_supported",
    "fused_supported",
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


def fused_supported(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's fused kernels can run ``params``.

    They need dense floating tensors (fp16, bf16, fp32, fp64) all on one
    device of a type torch has fused kernels for (CPU, CUDA, MPS, XPU...),
    and plain tensors: not distributed DTensors (FSDP's sharded
    parameters), since not every fused kernel has a DTensor sharding rule
    (torch 2.13's fused SGD has none) and this check is shared by every
    torch-backed algorithm; their foreach and loop paths run DTensors.

    Args:
        params: the parameter tensors.

    Returns:
        True when every tensor qualifies.
    """
    import torch  # deferred: imports torch

    # torch's own check; torch.optim.optimizer does not list it in __all__
    from torch.optim.optimizer import (  # type: ignore[attr-defined]
        _get_fused_kernels_supported_devices,
    )  # deferred: imports torch

    if len({p.device for p in params}) > 1:
        return False
    supported = set(_get_fused_kernels_supported_devices())
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    return all(
        p.device.type in supported
        and p.dtype in dtypes
        and p.layout is torch.strided
        and not _distributed(p)
        for p in params
    )


def _distributed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a distributed tensor (a ``DTensor``: it has ``to_local``)."""
    return hasattr(tensor, "to_local")


def foreach_supported(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's foreach (multi-tensor) paths can run ``params`` (dense tensors).

    Args:
        params: the parameter tensors.

    Returns:
        True when every tensor is dense (strided).
    """
    import torch  # deferred: imports torch

    return all(p.layout is torch.strided for p in params)


# These are public as optiplug.base.* (the plugin toolkit); report that home.
for _public in (fused_supported, foreach_supported):
    _public.__module__ = "optiplug.base"

_SUPPORTS: dict[str, Callable[[Sequence[torch.Tensor]], bool]] = {
    "fused": fused_supported,
    "foreach": foreach_supported,
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
    return tuple(
        ImplementationSpec(
            algorithm,
            name,
            lazy(target, impl=name),
            supports=_SUPPORTS.get(name),
            priority=TORCH_IMPLEMENTATION_PRIORITY[name],
            description=_DESCRIPTIONS[name],
        )
        for name in TORCH_IMPLEMENTATION_FLAGS
    )

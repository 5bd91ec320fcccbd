"""Lion's implementation records (torch-free, for the entry-point module)."""

from __future__ import annotations

import optiplug

__all__ = ["IMPLEMENTATIONS", "lion_implementations"]

_TARGET = "optiplug_lion.optimizer:Lion"

IMPLEMENTATIONS: dict[str, tuple[int, str]] = {
    "fused": (2, "one torch.compile'd kernel per tensor (20 bytes/param); falls back to foreach"),
    "foreach": (1, "torch._foreach_* ops over all tensors"),
    "loop": (0, "per-tensor torch ops"),
}
"""name -> (priority when not measured, description)."""

_SUPPORTS = {
    "fused": "optiplug_lion.optimizer:fused_supported",
    "foreach": "optiplug.base:foreach_supported",
}


def lion_implementations() -> tuple[optiplug.ImplementationSpec, ...]:
    """The ``fused``, ``foreach`` and ``loop`` records of ``lion``.

    Returns:
        One :class:`optiplug.ImplementationSpec` per implementation; each
        factory builds :class:`~optiplug_lion.optimizer.Lion` forced to it.
    """
    return tuple(
        optiplug.ImplementationSpec(
            "lion",
            name,
            optiplug.lazy(_TARGET, impl=name),
            supports=optiplug.lazy(_SUPPORTS[name]) if name in _SUPPORTS else None,
            priority=priority,
            description=description,
        )
        for name, (priority, description) in IMPLEMENTATIONS.items()
    )

"""A Graph's gradient clipping: ``clip_grad_norm_`` in its two halves, the norm kept."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from ..errors import HyperparameterError

__all__ = ["GradClip"]


class GradClip:
    """The clipping setting of a Graph and the norm its last step measured."""

    def __init__(self) -> None:
        self.setting: tuple[float, float] | None = None  # (max_norm, norm_type)
        self.last_norm: float | None = None

    def set(self, max_norm: float | None, norm_type: float) -> None:
        """Validate and keep ``(max_norm, norm_type)``; ``max_norm=None`` disables clipping.

        Raises:
            HyperparameterError: ``max_norm`` not None and not > 0, or
                ``norm_type`` not > 0 (NaN included).
        """
        if max_norm is None:
            self.setting = None
            return
        for name, value in (("max_norm", max_norm), ("norm_type", norm_type)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise HyperparameterError(
                    name, value, "must be a number > 0 (math.inf allowed)", algorithm="Graph"
                )
        self.setting = (float(max_norm), float(norm_type))

    def total_norm(self, parameters: list[torch.nn.Parameter]) -> torch.Tensor | None:
        """The global norm of the gradients (the same on every rank), or None when off."""
        if self.setting is None:
            return None
        grads = [p.grad for p in parameters if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, self.setting[1], error_if_nonfinite=False)
        if isinstance(norm, DTensor):  # FSDP: reduced over the shards, replicated on every rank
            norm = norm.full_tensor()
        return norm

    def clip(self, parameters: list[torch.nn.Parameter], norm: torch.Tensor | None = None) -> None:
        """Scale the gradients by ``norm`` (measured now when None), kept in :attr:`last_norm`.

        A no-op when clipping is off.
        """
        if norm is None:
            norm = self.total_norm(parameters)
        if self.setting is None or norm is None:
            return
        self.last_norm = float(norm)
        if math.isfinite(self.setting[0]):
            torch.nn.utils.clip_grads_with_norm_(parameters, self.setting[0], norm)

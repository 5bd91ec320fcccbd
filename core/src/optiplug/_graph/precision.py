"""A Graph's mixed precision: autocast for the forward, fp16's GradScaler for the step.

Under ``parallel="fsdp"`` the precision is FSDP2's ``MixedPrecisionPolicy``
(applied by the sharded module, so no autocast here) and fp16's scaler is
``ShardedGradScaler``, whose inf check spans every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from ..errors import HyperparameterError

__all__ = ["PRECISIONS", "Precision", "check_precision"]

PRECISIONS: dict[str | None, torch.dtype | None] = {
    None: None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
"""The precisions a Graph accepts, and their compute dtypes."""


def check_precision(precision: Any) -> str | None:
    """Validate a Graph's ``precision`` argument.

    Returns:
        ``precision``.

    Raises:
        HyperparameterError: not None, ``"bf16"`` or ``"fp16"``.
    """
    if precision not in PRECISIONS:
        raise HyperparameterError(
            "precision", precision, "must be None, 'bf16' or 'fp16'", algorithm="Graph"
        )
    result: str | None = precision
    return result


class Precision:
    """Autocast and loss scaling for one Graph.

    Args:
        precision: ``None``, ``"bf16"`` or ``"fp16"``.
        device: the training device.
        parallel: ``"ddp"`` or ``"fsdp"``.

    Raises:
        HyperparameterError: an unknown ``precision``.
    """

    def __init__(self, precision: str | None, device: torch.device, parallel: str) -> None:
        self.name = check_precision(precision)
        self.dtype = PRECISIONS[precision]
        self._device = device
        self._parallel = parallel
        self.scaler = self._grad_scaler() if precision == "fp16" else None

    def _grad_scaler(self) -> torch.amp.GradScaler:
        """fp16's loss scaler; under FSDP the sharded one, whose inf check spans every rank."""
        if self._parallel == "fsdp":
            return ShardedGradScaler(self._device.type)
        return torch.amp.GradScaler(self._device.type)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context (a no-op without a precision, and under FSDP)."""
        if self.dtype is None or self._parallel == "fsdp":
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` multiplied by fp16's loss scale (unchanged without a scaler)."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def step(
        self, optimizer: torch.optim.Optimizer, clip: Callable[[], None], unscale: bool
    ) -> bool:
        """Clip and step; with fp16, unscale first (when clipping) and let the scaler step.

        Args:
            optimizer: the optimizer to step.
            clip: clips the gradients (a no-op when clipping is off).
            unscale: whether ``clip`` needs the true, unscaled gradients.

        Returns:
            Whether the optimizer stepped (False: the scaler skipped it).
        """
        if self.scaler is None:
            clip()
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        if unscale:
            self.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            clip()
        self.scaler.step(optimizer)  # knows they are unscaled; skips on inf/NaN as ever
        self.scaler.update()
        return self.scaler.get_scale() >= before

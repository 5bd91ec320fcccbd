"""A Graph's learning rates: base lrs, schedule and lr scale, applied to the optimizer's groups."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from .._api import schedule as build_schedule
from .._schedules.base import Schedule
from ..errors import HyperparameterError

__all__ = ["LearningRates"]


class LearningRates:
    """Each group's lr as ``base * schedule(training_step) * scale``."""

    def __init__(self) -> None:
        self.schedule: Schedule | None = None
        self.base_lrs: list[float] = []
        self.scale = 1.0

    def set_schedule(self, schedule: Schedule | str | Mapping[str, Any] | None) -> None:
        """Keep a schedule given as an object, a name, or a dict for ``optiplug.schedule``.

        Raises:
            HyperparameterError: anything else.
        """
        if isinstance(schedule, str):
            schedule = build_schedule(schedule)
        elif isinstance(schedule, Mapping):
            schedule = build_schedule(**schedule)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise HyperparameterError(
                "schedule",
                schedule,
                "must be an optiplug Schedule, a name or a dict",
                algorithm="Graph",
            )
        self.schedule = schedule

    def set_scale(self, scale: float) -> None:
        """Keep the lr multiplier.

        Raises:
            HyperparameterError: ``scale`` not finite and > 0.
        """
        if not _finite_number(scale) or scale <= 0:
            raise HyperparameterError(
                "lr_scale", scale, "must be a finite number > 0", algorithm="Graph"
            )
        self.scale = float(scale)

    def set_base(self, lr: float, groups: int) -> None:
        """Make ``lr`` the base lr of all ``groups``.

        Raises:
            HyperparameterError: ``lr`` not finite and >= 0.
        """
        if not _finite_number(lr) or lr < 0:
            raise HyperparameterError("lr", lr, "must be a finite number >= 0", algorithm="Graph")
        self.base_lrs = [float(lr)] * groups

    def current(self, step: int) -> list[float]:
        """The lr each group gets at training step ``step``."""
        factor = self.schedule(step) if self.schedule is not None else 1.0
        return [base * factor * self.scale for base in self.base_lrs]

    def apply(self, optimizer: torch.optim.Optimizer | None, step: int) -> None:
        """Set each group's lr to :meth:`current` (nothing without an optimizer)."""
        if optimizer is None:
            return
        for group, lr in zip(optimizer.param_groups, self.current(step), strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)

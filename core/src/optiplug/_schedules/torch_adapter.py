"""``Schedule.as_torch``: a torch ``LRScheduler`` driven by an optiplug schedule (imports torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.optim.lr_scheduler import LRScheduler

from .groups import initial_lrs, set_lr

__all__ = ["ScheduleLR"]


class ScheduleLR(LRScheduler):
    """A torch ``LRScheduler`` driven by an optiplug :class:`Schedule`.

    ``lr = base_lr * schedule(last_epoch)``. Its state dict holds only
    plain data (the schedule is construction configuration, like
    ``LambdaLR``'s function); :meth:`load_state_dict` also re-applies the
    restored step's lrs to the optimizer, so load order does not matter.
    """

    def __init__(
        self, optimizer: Any, schedule: Callable[[int], float], last_epoch: int = -1
    ) -> None:
        if not callable(schedule):
            raise TypeError(f"schedule must be callable, got {type(schedule).__name__}")
        self.schedule = schedule
        initial_lrs(optimizer.param_groups)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[Any]:
        factor = self.schedule(self.last_epoch)
        return [base * factor for base in self.base_lrs]

    _get_closed_form_lr = get_lr

    def state_dict(self) -> dict[str, Any]:
        skip = ("optimizer", "schedule")
        return {key: value for key, value in self.__dict__.items() if key not in skip}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "schedule"})
        groups = self.optimizer.param_groups
        for group, lr in zip(groups, self.get_lr(), strict=True):
            set_lr(group, float(lr))


ScheduleLR.__module__ = "optiplug.builtin_schedules"

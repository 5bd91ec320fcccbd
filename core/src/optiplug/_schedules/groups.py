"""Reading and setting the lr of an optimizer's param groups (tensor lrs kept in place)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["initial_lrs", "set_lr"]


def initial_lrs(groups: Sequence[dict[str, Any]]) -> list[Any]:
    """Each group's ``initial_lr``, set from its current lr when missing (torch's convention)."""
    for group in groups:
        if "initial_lr" not in group:
            lr = group["lr"]
            group["initial_lr"] = lr.clone() if hasattr(lr, "clone") else lr
    return [group["initial_lr"] for group in groups]


def set_lr(group: dict[str, Any], value: float) -> None:
    """Set a group's lr in place (a tensor lr keeps its identity)."""
    lr = group["lr"]
    if hasattr(lr, "fill_"):  # a tensor lr: a compiled step keeps reading the same tensor
        lr.fill_(value)
    else:
        group["lr"] = value

"""Helpers every optimizer's ``step`` repeats: the closure, and warnings aimed at the user's line."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch

__all__ = ["caller_stacklevel", "closure_loss", "warn_at_caller"]

_OWN_PACKAGES = frozenset({"optiplug", "torch"})


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """Evaluate an ``Optimizer.step`` closure with gradients enabled (None gives None).

    ``step`` runs under ``torch.no_grad()``; the closure recomputes the loss
    and its gradients, so it needs them back on.

    Args:
        closure: the closure given to ``step``, or None.

    Returns:
        What the closure returned (the loss), or None.
    """
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def caller_stacklevel(packages: Iterable[str] = ()) -> int:
    """The ``stacklevel`` that points a warning at the first frame outside the library.

    Call it in the function that calls :func:`warnings.warn`; frames of
    ``optiplug``, ``torch`` and ``packages`` (top-level package names, e.g.
    your plugin's) are skipped, so the warning names the user's line however
    deep inside ``step()`` it was raised.

    Args:
        packages: further top-level packages to look through.

    Returns:
        The value for ``warnings.warn(..., stacklevel=...)``.
    """
    return _stacklevel(sys._getframe(1), packages)


def warn_at_caller(
    message: str, category: type[Warning] = UserWarning, *, packages: Iterable[str] = ()
) -> None:
    """``warnings.warn`` pointed at the first frame outside the library.

    Args:
        message: the warning's text.
        category: its class.
        packages: further top-level packages to look through (your plugin's);
            ``optiplug`` and ``torch`` always are.
    """
    warnings.warn(message, category, stacklevel=_stacklevel(sys._getframe(0), packages))


def _stacklevel(frame: FrameType | None, packages: Iterable[str]) -> int:
    """Levels from ``frame`` (level 1) up to the first frame outside the skipped packages."""
    own = _OWN_PACKAGES | set(packages)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in own:
        frame, level = frame.f_back, level + 1
    return level

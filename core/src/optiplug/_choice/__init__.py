"""Implementation choice: which implementation of an algorithm runs these parameters fastest.

A layer of its own above the registry kernel (:mod:`optiplug._core`), which
never imports it: a :class:`~optiplug.Registry` owns one
:class:`~optiplug._choice.chooser.ImplementationChooser` (``registry.chooser``),
made by the function the facade hands it (:func:`new_chooser`), and creation
receives that chooser from the registry. Importing this package is cheap;
its modules import torch:

* :mod:`.timing`: synthetic parameters, budgets, timing one step (stateless);
* :mod:`.rounds`: the decision from paired timed rounds, robust to
  contention, over an injectable timer and clock (pure; no torch);
* :mod:`.questions`: one choice to make, and the pure rules around it;
* :mod:`.warmup`: warming a candidate up in a worker thread;
* :mod:`.chooser`: the chooser, its records, background measurement and the
  agreement across ranks;
* :mod:`.cache`: measured choices kept on disk per machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .chooser import ImplementationChooser

__all__ = ["new_chooser"]


def new_chooser() -> ImplementationChooser:
    """A new, empty chooser (imports torch).

    Returns:
        The chooser a registry will own.
    """
    from .chooser import ImplementationChooser  # deferred: imports torch

    return ImplementationChooser()

"""The step pipeline: small pieces an optimizer class declares, run around its kernel.

In the spirit of optax's ``chain(...)``: a step is its kernel (the update
over the param groups of the optimizer it is given) wrapped by the pieces
of the class's :attr:`~optiplug.base.KernelTableOptimizer.step_pipeline`,
outermost first. A piece is any callable ``piece(optimizer, run)`` that
calls ``run`` on the optimizer or on a :func:`stepping_view` of it (the
same optimizer with other param groups, sharing its state), and may work
on the parameters before and after. No piece changes the optimizer's own
``param_groups``. Two pieces come with optiplug:

* :data:`cautious_decay`, the weight-decay rule of groups with
  ``weight_decay_mode="cautious"`` (other groups keep the kernel's own,
  decoupled or none);
* :data:`state_codec`, which runs each group in its ``state_precision``
  (fp32, bf16, int8, int4, low-rank factors) and takes the C step on the
  stored codes where the class declares one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from .._state.codec import StepRun, run_in_state_precision, stepping_view

__all__ = [
    "StepPiece",
    "StepRun",
    "cautious_decay",
    "cautious_weight_decay",
    "run_pipeline",
    "state_codec",
    "stepping_view",
]


class StepPiece(Protocol):
    """``piece(optimizer, run)``: one link of a step pipeline (see the module)."""

    def __call__(self, optimizer: Any, run: StepRun, /) -> None:
        """Run ``run`` on ``optimizer`` or on a view of it, with this piece's effect."""


def run_pipeline(optimizer: Any, pieces: Sequence[StepPiece], kernel: StepRun) -> None:
    """Run ``kernel`` on ``optimizer`` through ``pieces``, the first outermost.

    Args:
        optimizer: the optimizer stepping.
        pieces: the pipeline, as the class declares it.
        kernel: the update over the groups of the optimizer (or view) given.
    """
    if not pieces:
        kernel(optimizer)
        return
    first, rest = pieces[0], pieces[1:]
    first(optimizer, lambda view: run_pipeline(view, rest, kernel))


def cautious_decay(optimizer: Any, run: StepRun) -> None:
    """Cautious weight decay in the groups that ask for it; the others as the kernel decays.

    A group with ``weight_decay_mode="cautious"`` and a non-zero decoupled
    ``weight_decay`` steps without decay (a view of its group with
    ``weight_decay=0``), then decays only the coordinates where the step's
    update ``u`` (``p -= lr * u``) and the parameter agree in sign:
    ``p -= lr * wd * p_old * [u * p_old >= 0]`` (Chen et al. 2025,
    "Cautious Weight Decay", arXiv 2510.12402; a zero product counts as
    agreement). It costs a copy of those groups' parameters during the step.

    Args:
        optimizer: an optimizer whose ``weight_decay`` is decoupled
            (``p *= 1 - lr * wd``, as ``torch.optim.AdamW``).
        run: the rest of the pipeline.
    """
    groups = optimizer.param_groups
    cautious = [
        index
        for index, group in enumerate(groups)
        if group.get("weight_decay_mode") == "cautious" and group["weight_decay"] != 0
    ]
    if not cautious:
        run(optimizer)
        return
    before = {i: [p.detach().clone() for p in groups[i]["params"]] for i in cautious}
    undecayed = [{**g, "weight_decay": 0.0} if i in before else g for i, g in enumerate(groups)]
    run(stepping_view(optimizer, undecayed))
    with torch.no_grad():
        for index, olds in before.items():
            rate = groups[index]["lr"] * groups[index]["weight_decay"]
            for param, old in zip(groups[index]["params"], olds, strict=True):
                agree = (param - old) * old <= 0  # u = (old - new) / lr agrees with old
                param.sub_(old * agree * rate)


def state_codec(optimizer: Any, run: StepRun) -> None:
    """Each param group in its ``state_precision``; the C step on stored codes where declared.

    The slot tables are the optimizer class's
    (:attr:`~optiplug.base.ValidatedLoading.second_moments`,
    ``linear_slots``, ``low_rank_slots``); the C step is its
    ``stored_state_step(optimizer, group, param)`` when it has one (a
    :class:`~optiplug.base.KernelTableOptimizer` with a ``state_kernel``, a
    :class:`~optiplug.base.TorchBackedOptimizer` with a ``state_step``).

    Args:
        optimizer: the optimizer (or a view of it).
        run: the rest of the pipeline.
    """
    tables = (optimizer.second_moments, optimizer.linear_slots, optimizer.low_rank_slots)
    stored_step = getattr(type(optimizer), "stored_state_step", None)
    run_in_state_precision(optimizer, run, tables, stored_step)


def cautious_weight_decay(optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> Any:
    """Deprecated: :data:`cautious_decay` around a closure over ``optimizer.param_groups``.

    Kept for plugins written against it: ``step`` reads the optimizer's own
    ``param_groups``, so the decay-free groups are put there for the call
    and the originals restored after. New code declares
    :data:`cautious_decay` in its step pipeline, which never changes them.

    Returns:
        What ``step`` returns.
    """
    groups, found = optimizer.param_groups, []

    def run(view: Any) -> None:
        optimizer.param_groups = view.param_groups
        try:
            found.append(step())
        finally:
            optimizer.param_groups = groups

    cautious_decay(optimizer, run)
    return found[0] if found else None

"""``Graph.tune_optimizer``: ``AutoOptimizer.tune`` on copies of a Graph's module."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .._auto.selection import AutoOptimizer
from .._auto.tune import preserved_rng
from .._core.selection import Selection
from .._core.specs import Candidate
from ..errors import GraphError
from .data import DataFeed

__all__ = ["tune_selection"]


def tune_selection(
    module: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    batches: Iterable[Any] | None,
    *,
    parallel: str,
    feed: DataFeed,
    max_batches: int,
    candidates: Sequence[str | Candidate] | None,
    budget_steps: int,
    held_out: int | float,
    seed: int,
    task: str | None,
    stage: str | None,
) -> Selection:
    """Measure candidates on copies of ``module`` and return the selection (see the Graph's method).

    Raises:
        GraphError: the module is sharded, or ``batches`` is None and no
            loader is bound.
        TuneError: as ``AutoOptimizer.tune`` raises it.
    """
    if parallel == "fsdp":
        raise GraphError(
            "tune_optimizer trains whole copies of the module, and this Graph's is sharded "
            "(parallel='fsdp'): tune the unsharded model with AutoOptimizer.tune(...) "
            "before building the Graph, then pass the selection to set_optimizer"
        )
    if batches is None:
        batches = loader_batches(feed, max_batches)
    return AutoOptimizer.tune(
        module,
        loss_fn,
        batches,
        candidates=candidates,
        budget_steps=budget_steps,
        held_out=held_out,
        seed=seed,
        task=task,
        stage=stage,
    )


def loader_batches(feed: DataFeed, max_batches: int) -> list[Any]:
    """The first ``max_batches`` of the bound loader, on the device, its random state kept.

    Raises:
        GraphError: no loader bound.
    """
    binding = feed.require("tune_optimizer")
    with preserved_rng():
        return [feed.to_device(batch) for batch in itertools.islice(binding.loader, max_batches)]

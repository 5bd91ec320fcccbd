"""One choice to make, and the pure rules around it: the candidates' order, a forced one, the cache key.

Split from :mod:`.chooser` (which asks these questions and keeps the
answers): nothing here keeps state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from .._core import decision as _decision
from .._core import ranks as _ranks
from .._core.specs import ImplementationSpec
from ..errors import HyperparameterError, OptimizerUnavailableError
from . import cache as _stored
from .timing import availability_reason, tensor_kinds

__all__ = [
    "Question",
    "cache_key",
    "forced",
    "plugin_of",
    "ranked",
    "slowest_rank",
    "switchable",
]


@attrs.frozen(eq=False)
class Question:
    """One choice to make: which of ``ranked`` runs ``params`` fastest.

    Attributes:
        key: ``(algorithm, device type, dtype, candidate names)``.
        algorithm: the algorithm's name.
        ranked: the candidates, by declared priority then name.
        params: the user's parameter tensors (only their metadata is read).
        hparams: hyperparameters to time with.
        config: their validated config instance, or None.
    """

    key: tuple[Any, ...]
    algorithm: str
    ranked: tuple[ImplementationSpec, ...]
    params: tuple[torch.Tensor, ...]
    hparams: Mapping[str, Any]
    config: Any = None

    def named(self, name: str) -> ImplementationSpec:
        """The candidate called ``name``."""
        return next(impl for impl in self.ranked if impl.name == name)


def ranked(candidates: Sequence[ImplementationSpec]) -> tuple[ImplementationSpec, ...]:
    return tuple(sorted(candidates, key=lambda impl: (-impl.priority, impl.name)))


def plugin_of(impl: ImplementationSpec) -> str:
    return impl.provider.plugin if impl.provider is not None else ""


def forced(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    impl: str,
    params: Sequence[torch.Tensor],
) -> ImplementationSpec:
    """The forced implementation ``impl``, checked: it exists, is available and runs ``params``."""
    chosen = next((c for c in candidates if c.name == impl), None)
    if chosen is None:
        names = ", ".join(sorted(c.name for c in candidates)) or "none registered"
        raise HyperparameterError(
            "impl", impl, f"no such implementation; available: {names}", algorithm=algorithm
        )
    reason = availability_reason(chosen)
    if reason is not None:
        origin = f" from plugin {chosen.provider}" if chosen.provider is not None else ""
        raise OptimizerUnavailableError(
            f"{algorithm}: implementation {impl!r}{origin} (impl={impl!r}) is unavailable "
            f"on this machine: {reason}"
        )
    if not chosen.can_run(params):
        raise HyperparameterError(
            "impl",
            impl,
            f"does not support these parameters ({tensor_kinds(params)})",
            algorithm=algorithm,
        )
    return chosen


def switchable(ranked: Sequence[ImplementationSpec]) -> bool:
    """Whether every candidate is one optimizer class, which can switch between them."""
    try:
        classes = {_decision.prepared_class(impl.factory) for impl in ranked}
    except Exception:  # a factory that cannot be imported: measured (and reported) as before
        return False
    (found,) = classes if len(classes) == 1 else (None,)
    return found is not None and callable(getattr(found, "switch_implementation", None))


def cache_key(question: Question) -> tuple[dict[str, Any], Path] | None:
    """This choice's key in the cache file, and the file; None when it is not used.

    It is not used when ``OPTIPLUG_AUTOTUNE_CACHE`` is off, under several
    ranks, or when no cache directory can be named (no home directory).

    Raises:
        EnvironmentVariableError: ``OPTIPLUG_AUTOTUNE_CACHE`` is not a boolean word.
    """
    if not _stored.enabled() or _ranks.world_size() > 1:
        return None
    try:
        file = _stored.cache_path()
    except (RuntimeError, KeyError):  # Path.home() without a home directory
        return None
    first = question.params[0]
    names = [impl.name for impl in question.ranked]
    shapes = [tuple(p.shape) for p in question.params]
    return _stored.key_fields(question.algorithm, names, shapes, first.dtype, first.device), file


def slowest_rank(timings: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each implementation's time on the slowest rank (one MAX all-reduce).

    MAX is exact, so every rank gets bit-identical times and the same winner.
    """
    names = list(timings)
    values = torch.tensor([timings[name] for name in names], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
    return dict(zip(names, values.tolist(), strict=True))

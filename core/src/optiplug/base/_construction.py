"""Construction: the one sequence that validates, groups and chooses, whoever builds the optimizer.

:func:`prepare` is what every optimizer class of :mod:`optiplug.base` calls
first in ``__init__``. Given a :class:`~optiplug.base.Prepared` (what
:func:`optiplug.create`, :meth:`optiplug.Registry.factory`, a
:class:`~optiplug.Graph` and the AutoOptimizer hand over), it returns it as
it is; given raw arguments (a class built directly), it validates them and
chooses the implementation with the same routines, once. torch.optim's
kernel keywords (``fused=``, ``foreach=``, ``capturable=``,
``differentiable=``, Adam's ``decoupled_weight_decay=``) are read there as
:func:`optiplug.create` reads them, so ``AdamW(params, fused=True)`` is
``AdamW(params, impl="fused")`` whichever way the class is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch

from .._choice import timing as _timing
from .._choice.chooser import chooser_of
from .._core import decision as _decision
from .._core.decision import Prepared
from .._core.params import parameter_tensors
from .._core.specs import ImplementationSpec
from .._core.torch_flags import (
    KERNEL_FLAGS,
    REFUSED_FLAGS,
    all_on_cuda,
    fixed_decoupling,
    torch_flag_spellings,
)
from ..errors import HyperparameterError
from ..validators import known_hyperparameters
from ._contract import ValidatedLoading

__all__ = [
    "UNSET",
    "choose_implementation",
    "excluded_implementations",
    "prepare",
    "validated_config",
]

_DECOUPLED = "decoupled_weight_decay"

UNSET: Any = object()
"""The default of ``lr``: not given (it may come as a keyword, or from a :class:`Prepared`)."""


def validated_config(
    algorithm: str, config_class: type, params: Sequence[Any], hparams: Mapping[str, Any]
) -> Any:
    """Validate ``hparams``, and each param group's overrides merged over them.

    Args:
        algorithm: the algorithm's name, for error messages.
        config_class: the attrs class validating its hyperparameters.
        params: the (materialised) ``params`` argument.
        hparams: the constructor's keywords.

    Returns:
        The ``config_class`` instance of ``hparams``.

    Raises:
        HyperparameterError: naming the algorithm, field and value.
    """
    return _decision.validate(algorithm, hparams, params, config=config_class)


def excluded_implementations() -> dict[tuple[str, str], dict[str, str]]:
    """The implementations ``impl=None`` left out in this process, and why.

    Keyed by ``(algorithm, tensor kinds)``, e.g. ``("adamw", "cpu/torch.float32
    DTensor")`` for FSDP2's sharded parameters; each value maps an
    implementation to its reason ("needs a CUDA device", "does not support
    these parameters (...)"). The latest choice per key is kept.

    Returns:
        A copy of the record.
    """
    return chooser_of().exclusions()


def choose_implementation(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    params: Iterable[Any],
    hparams: Mapping[str, Any],
) -> ImplementationSpec:
    """The implementation :func:`optiplug.create` would choose among ``candidates``.

    Only candidates that can run the parameters (``candidate.can_run``) take
    part. Among them the fastest wins, timed once by the default registry's
    chooser (``optiplug.default_registry().chooser``) on synthetic tensors
    shaped like ``params`` (never on them; the global RNG is left alone) and
    kept per algorithm, device type and dtype. With
    ``OPTIPLUG_AUTOTUNE=0``, a single runnable candidate or no parameters,
    nothing is timed: the highest ``priority`` wins (then the name).

    Args:
        algorithm: the algorithm's name (part of the cache key).
        candidates: its implementation records; each ``factory`` builds the
            optimizer forced to that implementation (used for timing).
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        hparams: hyperparameters to time with.

    Returns:
        The chosen record.

    Raises:
        HyperparameterError: (field ``impl``) no candidate can run ``params``.
    """
    made = Prepared(algorithm, list(params), dict(hparams))
    return _chosen(made, candidates, None).implementation  # type: ignore[return-value]


def prepare(
    cls: type[ValidatedLoading],
    params: Iterable[Any] | Prepared,
    lr: Any = UNSET,
    impl: str | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> Prepared:
    """The finished decision for building ``cls``: validated once, implementation chosen once.

    A :class:`Prepared` that ``cls`` takes (same algorithm, its config) and
    that names one of its implementations is returned as it is; a class
    without ``implementation_specs`` (one way to step) only validates. Otherwise
    what is missing is done here: validation with ``cls.validated``, then
    the choice by the creating registry's chooser (the default registry's
    for a class built directly), ``impl`` when forced. For a class built
    directly, torch.optim's ``fused=``/``foreach=`` are first read as
    ``impl`` exactly as :func:`optiplug.create` reads them (where the
    class's implementations carry torch's names and its config does not
    name the flags): ``fused=True`` is ``impl="fused"``, ``foreach=False``
    ``impl="loop"``, and so on.

    Args:
        cls: the optimizer class being built.
        params: tensors, param-group dicts, ``(name, tensor)`` pairs, or a
            :class:`Prepared` given alone.
        lr: the learning rate, if given positionally.
        impl: the implementation to force, or None to choose.
        hparams: the other keywords.

    Returns:
        The decision, with its ``implementation`` set.

    Raises:
        TypeError: a :class:`Prepared` given with keywords.
        HyperparameterError: a bad keyword or value, an ``impl`` that does
            not exist or cannot run the parameters, or one that contradicts
            ``fused=``/``foreach=`` (naming both).
    """
    specs = getattr(cls, "implementation_specs", None)
    candidates = specs() if specs is not None else ()
    names = [candidate.name for candidate in candidates]
    impl, made = _given(cls, params, lr, impl, dict(hparams or {}), names)
    if not cls.takes_decision(made):
        made = attrs.evolve(made, config=cls.validated(made.params, made.hparams))
    elif made.implementation is not None and made.impl in {c.name for c in candidates}:
        return made
    if not candidates:  # one way to step: nothing to choose
        return made
    forced = impl if made.implementation is None else made.implementation.name
    if forced is None and not getattr(cls, "measured", True):
        return _by_priority(made, candidates)
    return _chosen(made, candidates, forced)


def _by_priority(made: Prepared, candidates: Sequence[ImplementationSpec]) -> Prepared:
    """``made`` with the highest-priority candidate that can run its parameters, unmeasured."""
    ranked = sorted(candidates, key=lambda c: (-c.priority, c.name))
    ranked = [c for c in ranked if c.priority >= 0] or ranked  # below zero: only when asked
    for candidate in ranked[:-1]:
        with contextlib.suppress(HyperparameterError):
            return _chosen(made, [candidate], None)
    return _chosen(made, ranked[-1:], None)


def _given(
    cls: type,
    params: Iterable[Any] | Prepared,
    lr: Any,
    impl: str | None,
    hparams: dict[str, Any],
    implementations: Sequence[str],
) -> tuple[str | None, Prepared]:
    """``impl`` and ``params`` with the keywords as a :class:`Prepared` (one given alone is taken as it is)."""
    if isinstance(params, Prepared):
        if lr is not UNSET or impl is not None or hparams:
            raise TypeError(f"{cls.__qualname__}: a Prepared is given alone, without keywords")
        return impl, params
    if lr is not UNSET:
        hparams["lr"] = lr
    listed = list(params)
    impl, hparams = _torch_spelled(cls, listed, impl, hparams, implementations)
    return impl, Prepared(getattr(cls, "algorithm", ""), listed, hparams, config=UNSET)


def _torch_spelled(
    cls: type,
    params: Sequence[Any],
    impl: str | None,
    hparams: dict[str, Any],
    implementations: Sequence[str],
) -> tuple[str | None, dict[str, Any]]:
    """``impl`` and the keywords with torch's kernel keywords read as ``impl`` (as ``create`` does)."""
    if not any(flag in hparams for flag in (*KERNEL_FLAGS, *REFUSED_FLAGS, _DECOUPLED)):
        return impl, hparams
    known = known_hyperparameters(getattr(cls, "config_class", None))
    on_cuda = all_on_cuda(parameter_tensors(params))
    decoupled = fixed_decoupling(cls) if _DECOUPLED in hparams else None
    algorithm = getattr(cls, "algorithm", "") or cls.__qualname__
    return torch_flag_spellings(
        algorithm, implementations, known, impl, hparams, on_cuda, decoupled
    )


def _chosen(made: Prepared, candidates: Sequence[ImplementationSpec], impl: str | None) -> Prepared:
    """``made`` with the implementation ``impl`` (checked) or the one measured fastest."""
    chooser = made.chooser if made.chooser is not None else chooser_of()
    tensors: Sequence[torch.Tensor] = parameter_tensors(made.params)
    config = None if made.config is UNSET else made.config
    follow: list[Any] = []
    chosen = chooser.select(
        made.algorithm, candidates, impl, tensors, made.hparams, config=config, follow=follow
    )
    if chosen is None:
        names = ", ".join(sorted(c.name for c in candidates)) or "none given"
        raise HyperparameterError(
            "impl",
            impl,
            f"no implementation supports these parameters ({_timing.tensor_kinds(tensors)}); "
            f"candidates: {names}",
            algorithm=made.algorithm,
        )
    tuning = follow[-1] if follow else made.tuning
    return attrs.evolve(made, config=config, implementation=chosen, tuning=tuning)

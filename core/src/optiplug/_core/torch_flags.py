"""torch.optim's kernel keywords as spellings of ``impl``: code ported from torch runs as is.

``torch.optim.AdamW(params, fused=True)`` chooses its kernel with two flags;
optiplug chooses it with one keyword, ``impl``. For an algorithm whose
implementations carry torch's names (``loop``, ``foreach``, ``fused``) and
whose own hyperparameters do not name the flags, the flags are read as torch
reads them and become ``impl``:

* ``fused=True``: ``"fused"``; ``foreach=True``: ``"foreach"``; both: refused,
  as torch refuses them;
* ``foreach=False`` (with ``fused`` not True): ``"loop"``;
* ``fused=False`` alone: torch's default kernel, ``"foreach"`` where every
  parameter is on CUDA, else ``"loop"``;
* ``None`` (torch's default): not given, so optiplug measures and chooses.

An ``impl`` that names another kernel than the flags is refused. torch's
``capturable=True`` and ``differentiable=True`` are refused with the reason
(``False``, their default, is accepted and dropped). Adam's
``decoupled_weight_decay`` is fixed by the class (``adam`` False, ``adamw``
True): the class's own value is accepted and dropped, the other one refused,
naming the algorithm that has it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from .._lazy import LazyCallable
from ..errors import HyperparameterError

__all__ = [
    "KERNEL_FLAGS",
    "REFUSED_FLAGS",
    "all_on_cuda",
    "fixed_decoupling",
    "torch_flag_spellings",
]

KERNEL_FLAGS = ("fused", "foreach")
"""torch.optim's keywords that choose a kernel."""

REFUSED_FLAGS = {
    "capturable": "CUDA-graph capture is torch's own kernels' concern: optiplug times and "
    "switches kernels while training, which a captured graph cannot follow; build "
    "torch.optim's class directly to capture its step",
    "differentiable": "optiplug's steps run under torch.no_grad(), as torch's do unless "
    "differentiable=True asks for a graph through the update; build torch.optim's class "
    "directly to differentiate through it",
}
"""torch.optim's keywords a True value of which is refused, with why."""


def torch_flag_spellings(
    algorithm: str,
    implementations: Collection[str],
    known: Collection[str] | None,
    impl: str | None,
    hparams: Mapping[str, Any],
    on_cuda: bool,
    decoupled: bool | None = None,
) -> tuple[str | None, dict[str, Any]]:
    """``(impl, hparams)`` with torch's kernel flags read as ``impl`` (see the module).

    Args:
        algorithm: named in errors.
        implementations: the algorithm's implementation names.
        known: its hyperparameters (None: it takes any keyword).
        impl: the ``impl`` given, or None.
        hparams: the keywords given.
        on_cuda: whether every parameter is on a CUDA device (torch's
            default kernel is then ``foreach``).
        decoupled: the ``decoupled_weight_decay`` the algorithm's class fixes
            (None: it has none, and the keyword is left to validation).

    Returns:
        The implementation to force (or None) and the keywords without the flags.

    Raises:
        HyperparameterError: both flags True, a flag that is not a bool or
            None, a flag contradicting ``impl``, or a refused flag set True.
    """
    hparams = _decoupled(algorithm, known, hparams, decoupled)
    if known is None or not {"foreach", "fused"} & set(implementations):
        return impl, dict(hparams)
    flags = [
        name for name in (*KERNEL_FLAGS, *REFUSED_FLAGS) if name in hparams and name not in known
    ]
    if not flags:
        return impl, dict(hparams)
    given = {name: hparams[name] for name in flags}
    rest = {k: v for k, v in hparams.items() if k not in given}
    for name, value in given.items():
        if value is not None and not isinstance(value, bool):
            raise HyperparameterError(
                name, value, "must be True, False or None", algorithm=algorithm
            )
    _refuse(algorithm, given)
    spelled = _kernel_of(algorithm, given.get("fused"), given.get("foreach"), on_cuda)
    if spelled is None or spelled == impl:
        return impl, rest
    if impl is not None:
        shown = ", ".join(f"{k}={v!r}" for k, v in given.items() if k in KERNEL_FLAGS)
        reason = f"contradicts {shown}, which asks for impl={spelled!r}; give one of them"
        raise HyperparameterError("impl", impl, reason, algorithm=algorithm)
    if spelled not in implementations:
        reason = f"asks for impl={spelled!r}, which {algorithm} does not have"
        raise HyperparameterError(next(iter(given)), True, reason, algorithm=algorithm)
    return spelled, rest


def _decoupled(
    algorithm: str, known: Collection[str] | None, hparams: Mapping[str, Any], fixed: bool | None
) -> Mapping[str, Any]:
    """``hparams`` without ``decoupled_weight_decay`` when it is the class's own value."""
    key = "decoupled_weight_decay"
    if fixed is None or key not in hparams or (known is not None and key in known):
        return hparams
    value = hparams[key]
    if value is not fixed:
        other = "adamw" if value is True else "adam"
        reason = (
            f"{algorithm}'s weight decay is fixed at {key}={fixed!r}; {key}={value!r} is {other!r}"
        )
        raise HyperparameterError(key, value, reason, algorithm=algorithm)
    return {k: v for k, v in hparams.items() if k != key}


def fixed_decoupling(factory: Any) -> bool | None:
    """The ``decoupled_weight_decay`` a torch Adam class fixes (AdamW: True); None for others."""
    import torch  # deferred: imports torch

    target = factory.resolve() if isinstance(factory, LazyCallable) else factory
    if isinstance(target, type) and issubclass(target, torch.optim.Adam):
        return issubclass(target, torch.optim.AdamW)
    return None


def _refuse(algorithm: str, given: Mapping[str, Any]) -> None:
    for name, reason in REFUSED_FLAGS.items():
        if given.get(name) is True:
            raise HyperparameterError(name, True, reason, algorithm=algorithm)


def _kernel_of(algorithm: str, fused: Any, foreach: Any, on_cuda: bool) -> str | None:
    """The kernel torch runs for these flags; None when both are None (torch's default: ours)."""
    if fused is True and foreach is True:
        reason = "cannot be True with foreach=True (torch refuses both, too)"
        raise HyperparameterError("fused", True, reason, algorithm=algorithm)
    if fused is True:
        return "fused"
    if foreach is True:
        return "foreach"
    if foreach is False:
        return "loop"
    if fused is False:
        return "foreach" if on_cuda else "loop"
    return None


def all_on_cuda(tensors: Iterable[Any]) -> bool:
    """Whether every tensor is on a CUDA device (and there is one)."""
    devices = [getattr(getattr(t, "device", None), "type", None) for t in tensors]
    return bool(devices) and all(device == "cuda" for device in devices)

"""The Lion update over lists of tensors, in three implementations.

All three compute, per parameter ``p`` with gradient ``g`` and momentum ``m``
(``g`` negated when maximizing)::

    c = beta1 * m + (1 - beta1) * g
    p = p * (1 - lr * weight_decay) - lr * sign(c)
    m = beta2 * m + (1 - beta2) * g

and keep the same state (``m``), so a state dict moves freely between them.

* :func:`lion_loop` runs a few torch ops per tensor.
* :func:`lion_foreach` runs ``torch._foreach_*`` ops over all tensors; on a
  GPU that saves launches, on a CPU each op streams every tensor through
  memory once, so it is slower than the loop.
* :func:`lion_fused` runs one fused kernel per tensor: it reads ``p``, ``g``,
  ``m`` once and writes ``p``, ``m`` once (20 bytes per fp32 parameter, the
  memory-traffic floor). On a CPU the kernel is C (:mod:`.native`), built
  with the system's C compiler in 0.1-0.2 s and kept per machine;
  elsewhere (CUDA, or no C compiler) it is compiled by ``torch.compile``
  once per (device type, dtype) with dynamic shapes. Both work on flat
  views, so new shapes do not rebuild. Tensors under
  :data:`MIN_KERNEL_NUMEL` elements (where a kernel call costs more than it
  saves) and non-contiguous ones take the loop. If building fails, or the
  kernel's first run disagrees with the eager update of the same tensors
  (checked once per device and dtype), it warns once and uses
  :func:`lion_foreach`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from optiplug.base import warn_at_caller
from optiplug.errors import NativeBuildError

from .native import NATIVE_DTYPES, native_kernel

__all__ = [
    "MIN_KERNEL_NUMEL",
    "FusedFallbackWarning",
    "LionHyper",
    "kernel_status",
    "lion_foreach",
    "lion_fused",
    "lion_loop",
]

MIN_KERNEL_NUMEL = 1 << 15
"""Smaller tensors take the loop: a compiled call costs ~20 us, more than it saves."""

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_lock = threading.Lock()
_kernels: dict[tuple[str, torch.dtype], Callable[..., None] | None] = {}


class FusedFallbackWarning(UserWarning):
    """The fused Lion kernel could not be compiled; foreach is used instead."""


class LionHyper(NamedTuple):
    """One param group's hyperparameters, as the update functions take them.

    A ``NamedTuple`` rather than an attrs class: it is built inside ``step``,
    and ``torch.compile`` traces a tuple's construction, but not the
    ``object.__setattr__`` with which a frozen attrs class initialises itself
    (a graph break on every step).

    Attributes:
        lr: learning rate (float or 0-d tensor).
        beta1: interpolation factor of the update direction.
        beta2: momentum decay.
        weight_decay: decoupled weight decay.
        maximize: negate the gradient.
        cautious: decay only where the update and the parameter agree in sign.
    """

    lr: float | Tensor
    beta1: float
    beta2: float
    weight_decay: float
    maximize: bool
    cautious: bool = False

    @classmethod
    def from_group(cls, group: dict[str, Any]) -> LionHyper:
        """Read the hyperparameters of a param group."""
        beta1, beta2 = group["betas"]
        cautious = group.get("weight_decay_mode", "decoupled") == "cautious"
        return cls(group["lr"], beta1, beta2, group["weight_decay"], group["maximize"], cautious)


def _decay(param: Tensor, update: Tensor, hyper: LionHyper) -> None:
    """``p *= 1 - lr*wd``, or under cautious decay only where ``update * p >= 0``."""
    if hyper.weight_decay == 0:
        return
    if not hyper.cautious:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
        return
    agree = (update * param >= 0).to(param.dtype)
    param.mul_(1 - hyper.lr * hyper.weight_decay * agree)


def _descend(param: Tensor, update: Tensor, lr: float | Tensor) -> None:
    """``param -= lr * update`` (``update`` may be overwritten)."""
    if isinstance(lr, Tensor):
        param.sub_(update.mul_(lr))
    else:
        param.add_(update, alpha=-lr)


def _lion_one(param: Tensor, grad: Tensor, exp_avg: Tensor, hyper: LionHyper) -> None:
    if hyper.maximize:
        grad = grad.neg()
    update = exp_avg.mul(hyper.beta1).add_(grad, alpha=1 - hyper.beta1).sign_()
    _decay(param, update, hyper)
    _descend(param, update, hyper.lr)
    exp_avg.lerp_(grad, 1 - hyper.beta2)


def lion_loop(
    params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor], hyper: LionHyper
) -> None:
    """Apply one Lion step tensor by tensor.

    Args:
        params: parameters, updated in place.
        grads: their gradients.
        exp_avgs: their momentum buffers, updated in place.
        hyper: the group's hyperparameters.
    """
    for param, grad, exp_avg in zip(params, grads, exp_avgs, strict=True):
        _lion_one(param, grad, exp_avg, hyper)


def _foreach_descend(params: list[Tensor], updates: list[Tensor], lr: float | Tensor) -> None:
    if isinstance(lr, Tensor):
        torch._foreach_mul_(updates, lr)
        torch._foreach_sub_(params, updates)
    else:
        torch._foreach_add_(params, updates, alpha=-lr)


def _foreach_same_kind(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], hyper: LionHyper
) -> None:
    if hyper.maximize:
        grads = list(torch._foreach_neg(grads))
    updates = list(torch._foreach_mul(exp_avgs, hyper.beta1))
    torch._foreach_add_(updates, grads, alpha=1 - hyper.beta1)
    torch._foreach_sign_(updates)
    if hyper.weight_decay != 0 and not hyper.cautious:
        torch._foreach_mul_(params, 1 - hyper.lr * hyper.weight_decay)
    elif hyper.weight_decay != 0:  # the mask is per element: one tensor at a time
        for param, update in zip(params, updates, strict=True):
            _decay(param, update, hyper)
    _foreach_descend(params, updates, hyper.lr)
    torch._foreach_lerp_(exp_avgs, grads, 1 - hyper.beta2)


def lion_foreach(
    params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor], hyper: LionHyper
) -> None:
    """Apply one Lion step with ``torch._foreach_*`` ops, per (device, dtype).

    Args:
        params: parameters, updated in place.
        grads: their gradients.
        exp_avgs: their momentum buffers, updated in place.
        hyper: the group's hyperparameters.
    """
    lists: list[list[Tensor | None]] = [list(params), list(grads), list(exp_avgs)]
    grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype(lists)
    for (ps, gs, ms), _ in grouped.values():
        _foreach_same_kind(ps, gs, ms, hyper)  # type: ignore[arg-type]


def _lion_kernel(param: Tensor, grad: Tensor, exp_avg: Tensor, hyper: Tensor) -> None:
    """The whole update of one flat tensor; ``hyper`` = (lr, wd, beta1, beta2, +-1, cautious)."""
    lr, weight_decay, beta1, beta2, direction, cautious = hyper.unbind()
    g = grad.to(hyper.dtype) * direction
    m = exp_avg.to(hyper.dtype)
    update = torch.sign(m * beta1 + g * (1 - beta1))
    p = param.to(hyper.dtype)
    # cautious: decay only where update * p >= 0 (the mask is 1 everywhere when not cautious)
    mask = torch.where(update * p >= 0, 1.0, 1.0 - cautious)
    param.copy_(p * (1 - lr * weight_decay * mask) - lr * update)
    exp_avg.copy_(m + (1 - beta2) * (g - m))


def _compiled_kernel(device_type: str, dtype: torch.dtype) -> Callable[..., None] | None:
    """The fused kernel for ``(device_type, dtype)``; None after a failure.

    On a CPU it is the C kernel (:mod:`.native`), built in 0.1-0.2 s;
    elsewhere, or where no C compiler builds it, the update compiled by
    ``torch.compile``.
    """
    key = (device_type, dtype)
    with _lock:
        if key not in _kernels:
            _kernels[key] = _native_kernel(device_type, dtype) or _torch_compiled(key)
        return _kernels[key]


def _native_kernel(device_type: str, dtype: torch.dtype) -> Callable[..., None] | None:
    """The C kernel, or None where it does not apply or cannot be built."""
    if device_type != "cpu" or dtype not in NATIVE_DTYPES:
        return None
    try:
        return native_kernel(dtype)
    except NativeBuildError:  # no compiler, or switched off: torch.compile builds it instead
        return None


def _torch_compiled(key: tuple[str, torch.dtype]) -> Callable[..., None] | None:
    """``torch.compile`` of :func:`_lion_kernel` (compiled on its first call); None if refused."""
    try:
        return torch.compile(_lion_kernel, dynamic=True, fullgraph=True)
    except Exception as error:  # e.g. torch.compile unsupported on this Python
        _warn_fallback(key, error)
        return None


def _warn_fallback(key: tuple[str, torch.dtype], error: BaseException) -> None:
    device_type, dtype = key
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    warn_at_caller(
        f"lion: the fused kernel could not be compiled for {device_type}/{dtype} "
        f"({type(error).__name__}: {message}); using the foreach implementation instead",
        FusedFallbackWarning,
        packages=("optiplug_lion",),
    )


def _disable_kernel(key: tuple[str, torch.dtype], error: BaseException) -> None:
    with _lock:
        already_failed = key in _kernels and _kernels[key] is None
        _kernels[key] = None
    if not already_failed:
        _warn_fallback(key, error)


def kernel_status() -> dict[tuple[str, torch.dtype], bool]:
    """Which compiled kernels exist: (device type, dtype) -> compiled and working."""
    with _lock:
        return {key: kernel is not None for key, kernel in _kernels.items()}


def _kernel_eligible(param: Tensor, grad: Tensor, exp_avg: Tensor) -> bool:
    if param.numel() < MIN_KERNEL_NUMEL or param.dtype not in _KERNEL_DTYPES:
        return False
    if torch.compiler.is_compiling():  # inside a user's compiled step: plain ops fuse there
        return False
    same = grad.dtype == exp_avg.dtype == param.dtype and grad.device == param.device
    return same and all(
        t.is_contiguous() and t.layout is torch.strided for t in (param, grad, exp_avg)
    )


def _hyper_tensor(hyper: LionHyper, param: Tensor) -> Tensor:
    dtype = torch.promote_types(param.dtype, torch.float32)
    direction = -1.0 if hyper.maximize else 1.0
    values = [0.0, hyper.weight_decay, hyper.beta1, hyper.beta2, direction, float(hyper.cautious)]
    packed = torch.tensor(values, dtype=dtype, device=param.device)
    packed[0] = hyper.lr  # a float, or a 0-d tensor copied without a host sync
    return packed


def _run_kernel(param: Tensor, grad: Tensor, exp_avg: Tensor, packed: Tensor) -> bool:
    """Run the compiled kernel on one tensor; False if it is unavailable (nothing changed).

    A kernel's first run per (device, dtype) is checked against the eager
    update of the same tensors (:func:`_agrees_with_eager`).
    """
    key = (param.device.type, param.dtype)
    kernel = _compiled_kernel(*key)
    if kernel is None:
        return False
    flat_param, flat_avg = param.detach().view(-1), exp_avg.view(-1)
    before = None if key in _verified else (flat_param.clone(), flat_avg.clone())
    try:
        kernel(flat_param, grad.view(-1), flat_avg, packed)
    except Exception as error:  # compile errors surface on the first call
        _disable_kernel(key, error)
        return False
    return before is None or _agrees_with_eager(
        key, before, flat_param, grad.view(-1), flat_avg, packed
    )


_verified: set[tuple[str, torch.dtype]] = set()
"""Kernels whose first run agreed with the eager update."""

MAX_DISAGREEMENT = 1e-3
"""The share of elements a compiled kernel's first run may differ on from the eager update
(a sign taken at a rounding-level tie); more disables it. Seen: torch's on-disk compile cache
holding a kernel built for AVX-512 reused by a process running AVX2 code
(``ATEN_CPU_CAPABILITY=avx2``) left every other run of eight float64 elements unchanged."""


def _agrees_with_eager(
    key: tuple[str, torch.dtype],
    before: tuple[Tensor, Tensor],
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    packed: Tensor,
) -> bool:
    """Whether the kernel's first run matches the eager update from ``before``.

    On a disagreement the tensors are put back to ``before`` (the caller's
    fallback steps them again), the kernel is disabled for ``key`` (warning
    once) and False returned.
    """
    eager_param, eager_avg = before[0].clone(), before[1].clone()
    _lion_kernel(eager_param, grad, eager_avg, packed)
    differing = _share_differing(param, eager_param) + _share_differing(exp_avg, eager_avg)
    if differing > MAX_DISAGREEMENT:
        param.copy_(before[0])
        exp_avg.copy_(before[1])
        _disable_kernel(key, RuntimeError("its results disagree with the eager update"))
        return False
    with _lock:
        _verified.add(key)
    return True


def _share_differing(got: Tensor, expected: Tensor) -> float:
    """The share of elements differing by more than a few units in the last place."""
    tolerance = 8 * torch.finfo(expected.dtype).eps * expected.abs().clamp_min(1.0)
    return float(((got - expected).abs() > tolerance).float().mean())


def lion_fused(
    params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor], hyper: LionHyper
) -> None:
    """Apply one Lion step with one compiled kernel per (large, contiguous) tensor.

    Args:
        params: parameters, updated in place.
        grads: their gradients.
        exp_avgs: their momentum buffers, updated in place.
        hyper: the group's hyperparameters.
    """
    packed: dict[tuple[torch.device, torch.dtype], Tensor] = {}
    leftover: list[int] = []
    for index, (param, grad, exp_avg) in enumerate(zip(params, grads, exp_avgs, strict=True)):
        if not _kernel_eligible(param, grad, exp_avg):
            _lion_one(param, grad, exp_avg, hyper)
            continue
        key = (param.device, param.dtype)
        if key not in packed:
            packed[key] = _hyper_tensor(hyper, param)
        if not _run_kernel(param, grad, exp_avg, packed[key]):
            leftover.append(index)
    if leftover:
        rest_params, rest_grads, rest_avgs = (
            [seq[i] for i in leftover] for seq in (params, grads, exp_avgs)
        )
        lion_foreach(rest_params, rest_grads, rest_avgs, hyper)

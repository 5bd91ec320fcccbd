"""The Lion optimizer: a ``torch.optim.Optimizer`` with three implementations."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch
from torch import Tensor

from optiplug._core import autotune as _autotune
from optiplug.base import (
    ValidatedLoading,
    closure_loss,
    foreach_supported,
    group_overrides,
    parameter_tensors,
)
from optiplug.errors import HyperparameterError
from optiplug.validators import validate_hyperparameters

from .config import LionConfig
from .functional import LionHyper, lion_foreach, lion_fused, lion_loop
from .implementations import IMPLEMENTATIONS, lion_implementations

__all__ = ["Lion", "fused_supported"]

_UNSET: Any = object()
_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_STEPS: dict[str, Callable[..., None]] = {
    "loop": lion_loop,
    "foreach": lion_foreach,
    "fused": lion_fused,
}


def fused_supported(params: Sequence[Tensor]) -> bool:
    """Whether the fused implementation can run ``params`` (dense fp16/bf16/fp32/fp64)."""
    return all(p.layout is torch.strided and p.dtype in _FLOATING for p in params)


def _check_impl(impl: str, params: Sequence[Tensor]) -> None:
    if impl not in IMPLEMENTATIONS:
        choices = ", ".join(sorted(IMPLEMENTATIONS))
        raise HyperparameterError(
            "impl",
            impl,
            f"not an implementation of lion; choose one of {choices}",
            algorithm="lion",
        )
    supported = {"fused": fused_supported, "foreach": foreach_supported}.get(impl)
    if supported is not None and params and not supported(params):
        kinds = ", ".join(sorted({f"{p.device.type}/{p.dtype}" for p in params}))
        raise HyperparameterError(
            "impl", impl, f"does not support these parameters ({kinds})", algorithm="lion"
        )


class Lion(ValidatedLoading, torch.optim.Optimizer):
    """Lion (Chen et al., 2023): a sign update of interpolated momentum.

    Per parameter, with gradient ``g`` (negated when ``maximize``) and
    momentum ``m`` (state slot ``exp_avg``)::

        c = beta1 * m + (1 - beta1) * g
        p = p * (1 - lr * weight_decay) - lr * sign(c)
        m = beta2 * m + (1 - beta2) * g

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: learning rate (default 1e-4); a float or a 0-d tensor.
        impl: ``"fused"``, ``"foreach"``, ``"loop"``, or None to pick the
            fastest supported one by measurement (cached per process).
        **hparams: ``betas`` (default (0.9, 0.99)), ``weight_decay``
            (default 0), ``maximize`` (default False).

    Raises:
        HyperparameterError: an unknown keyword, a bad value (naming field and
            value), or an ``impl`` that does not exist or cannot run ``params``.
    """

    algorithm: ClassVar[str] = "lion"

    def __init__(
        self, params: Iterable[Any], lr: Any = _UNSET, *, impl: str | None = None, **hparams: Any
    ) -> None:
        if lr is not _UNSET:
            hparams["lr"] = lr
        config = validate_hyperparameters(self.algorithm, hparams, config=LionConfig)
        params = list(params)
        for override in group_overrides(params):
            validate_hyperparameters(self.algorithm, {**hparams, **override}, config=LionConfig)
        tensors = parameter_tensors(params)
        impl = impl if impl is not None else self._fastest(tensors, hparams)
        _check_impl(impl, tensors)
        self._impl = impl
        super().__init__(params, attrs.asdict(config, recurse=False))

    @classmethod
    def _fastest(cls, tensors: Sequence[Tensor], hparams: Mapping[str, Any]) -> str:
        candidates = [impl for impl in lion_implementations() if impl.can_run(tensors)]
        return _autotune.choose(cls.algorithm, candidates, tensors, hparams).name

    @property
    def impl(self) -> str:
        """The implementation in use: ``"fused"``, ``"foreach"`` or ``"loop"``."""
        return self._impl

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_impl": self._impl}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_impl", "loop")

    def _init_group(self, group: dict[str, Any]) -> tuple[list[Tensor], ...]:
        params, grads, exp_avgs = [], [], []
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.is_sparse:
                raise RuntimeError("Lion does not support sparse gradients")
            if torch.is_complex(param):
                raise RuntimeError("Lion does not support complex parameters")
            state = self.state[param]
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            params.append(param)
            grads.append(param.grad)
            exp_avgs.append(state["exp_avg"])
        return params, grads, exp_avgs

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step.

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        loss = closure_loss(closure)
        update = _STEPS[self._impl]
        for group in self.param_groups:
            params, grads, exp_avgs = self._init_group(group)
            if params:
                update(params, grads, exp_avgs, LionHyper.from_group(group))
        return loss

"""Building blocks for optimizers backed by torch's own kernels.

Where torch already ships the fastest correct kernel (fused/foreach Adam,
AdamW, SGD), an optiplug optimizer *is* torch's optimizer with three things
added: hyperparameters validated by an attrs config class, an ``impl``
(``"loop"``, ``"foreach"``, ``"fused"``) chosen by measurement unless forced,
and state loading that keeps the optimizer's implementation (a checkpoint
moves freely between implementations)::

    class Adam(TorchBackedOptimizer, torch.optim.Adam):
        algorithm = "adam"
        config_class = AdamConfig

This module imports torch; plugin entry-point modules should refer to
optimizer classes lazily (:func:`optiplug.lazy`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch

from ._core import autotune as _autotune
from ._core.implementations import TORCH_IMPLEMENTATION_FLAGS, torch_implementations
from ._core.params import group_overrides, parameter_tensors
from ._core.specs import ImplementationSpec
from .errors import HyperparameterError
from .validators import validate_hyperparameters

__all__ = [
    "TorchBackedOptimizer",
    "ValidatedLoading",
    "closure_loss",
    "foreach_supported",
    "fused_supported",
    "group_overrides",
    "parameter_tensors",
]

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_UNSET: Any = object()


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """Evaluate an ``Optimizer.step`` closure with gradients enabled (None gives None).

    ``step`` runs under ``torch.no_grad()``; the closure recomputes the loss
    and its gradients, so it needs them back on.
    """
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def fused_supported(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's fused kernels can run ``params``.

    They need dense floating tensors (fp16, bf16, fp32, fp64) all on one
    device of a type torch has fused kernels for (CPU, CUDA, MPS, XPU...).
    """
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = {p.device for p in params}
    if len(devices) > 1:
        return False
    supported = set(_get_fused_kernels_supported_devices())
    return all(
        p.device.type in supported and p.dtype in _FUSED_DTYPES and p.layout is torch.strided
        for p in params
    )


def foreach_supported(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's foreach (multi-tensor) paths can run ``params`` (dense tensors)."""
    return all(p.layout is torch.strided for p in params)


def _checked(impl: str, name: str, params: Sequence[torch.Tensor]) -> None:
    if impl not in TORCH_IMPLEMENTATION_FLAGS:
        choices = ", ".join(sorted(TORCH_IMPLEMENTATION_FLAGS))
        raise HyperparameterError(
            "impl",
            impl,
            f"not an implementation of {name}; choose one of {choices}",
            algorithm=name,
        )
    supported = {"fused": fused_supported, "foreach": foreach_supported}.get(impl)
    if supported is not None and params and not supported(params):
        kinds = sorted({f"{p.device.type}/{p.dtype}" for p in params})
        raise HyperparameterError(
            "impl", impl, f"does not support these parameters ({', '.join(kinds)})", algorithm=name
        )


class ValidatedLoading(torch.optim.Optimizer):
    """Mixin: ``load_state_dict`` validates first and loads all-or-nothing.

    Same rules as :func:`optiplug.load_state_dict` with ``strict=True``: state
    is matched by parameter name when both sides have names, every tensor is
    copied (never aliased), and on any problem nothing changes. The
    optimizer keeps its own implementation flags
    (``foreach``/``fused``/``capturable``/``differentiable``): they describe
    how the saving optimizer ran, not the state.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Validate ``state_dict``, then load it all-or-nothing.

        Args:
            state_dict: as returned by ``state_dict()`` here or in torch.

        Raises:
            StateDictError: with ``.problems``, every problem found.
        """
        from ._state.load import load_state_dict

        load_state_dict(self, state_dict, strict=True)


class TorchBackedOptimizer(ValidatedLoading, torch.optim.Optimizer):
    """Mixin for an optimizer that is torch's own class plus optiplug's contract.

    Subclasses list it before the torch class and set :attr:`algorithm` and
    :attr:`config_class`. Hyperparameters are keyword arguments (``lr`` may
    also be positional); ``impl`` picks ``"loop"``, ``"foreach"`` or
    ``"fused"``, or, when None, the fastest supported one by measurement.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword).
        impl: implementation name, or None to measure.
        **hparams: the algorithm's other hyperparameters.

    Raises:
        HyperparameterError: an unknown keyword, a bad value, or an ``impl``
            that does not exist or cannot run these parameters.
    """

    algorithm: ClassVar[str] = ""
    config_class: ClassVar[type]

    def __init__(
        self, params: Iterable[Any], lr: Any = _UNSET, *, impl: str | None = None, **hparams: Any
    ) -> None:
        if lr is not _UNSET:
            hparams["lr"] = lr
        config = validate_hyperparameters(self.algorithm, hparams, config=self.config_class)
        params = list(params)
        for override in group_overrides(params):
            validate_hyperparameters(
                self.algorithm, {**hparams, **override}, config=self.config_class
            )
        tensors = parameter_tensors(params)
        impl = impl if impl is not None else self._fastest(tensors, hparams)
        _checked(impl, self.algorithm, tensors)
        values = attrs.asdict(config, recurse=False)
        super().__init__(params, **values, **TORCH_IMPLEMENTATION_FLAGS[impl])

    @classmethod
    def implementation_specs(cls) -> tuple[ImplementationSpec, ...]:
        """This class's implementations as records (``loop``, ``foreach``, ``fused``)."""
        return torch_implementations(cls.algorithm, f"{cls.__module__}:{cls.__qualname__}")

    @classmethod
    def _fastest(cls, tensors: Sequence[torch.Tensor], hparams: Mapping[str, Any]) -> str:
        candidates = [impl for impl in cls.implementation_specs() if impl.can_run(tensors)]
        return _autotune.choose(cls.algorithm, candidates, tensors, hparams).name

    @property
    def impl(self) -> str:
        """The implementation in use: ``"fused"``, ``"foreach"`` or ``"loop"``."""
        group = self.param_groups[0] if self.param_groups else {}
        if group.get("fused"):
            return "fused"
        return "foreach" if group.get("foreach") else "loop"

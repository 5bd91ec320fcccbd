"""The torchao optimizer classes with optiplug's contract (imports torch and torchao).

Each class is :func:`optiplug.base.external_optimizer` over the torchao class:
keywords validated by the entry's config class, only the keywords the
class names passed on, an honest ``impl`` (torchao's step is its own
compiled kernel: ``"default"``) and validated, all-or-nothing state loading.
``CPUOffloadOptimizer`` wraps another optimizer class and is built by
:func:`cpu_offload`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torchao.optim  # type: ignore[import-untyped]  # torchao ships no py.typed

from optiplug.base import ExternalOptimizer, external_optimizer
from optiplug.errors import HyperparameterError, OptimizerUnavailableError

from .catalog import CATALOG, Entry
from .config import CONFIGS

__all__ = ["CLASSES", "cpu_offload"]


_INSTANCE_ATTRIBUTES = ("block_size", "bf16_stochastic_round", "is_adamw", "_optiplug_impl")
"""What torchao's ``_AdamBase`` keeps on the instance, outside torch's pickled state."""


def _is_subclass(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and hasattr(type(value), "__tensor_flatten__")


def _rebuilt(
    cls: Any, inner: dict[str, torch.Tensor], dtypes: dict[str, str], context: Any, size: Any
) -> torch.Tensor:
    """A quantized state tensor from its inner tensors (byte views back to their dtypes)."""
    tensors = {name: t.view(getattr(torch, dtypes[name])) for name, t in inner.items()}
    rebuilt: torch.Tensor = cls.__tensor_unflatten__(tensors, context, torch.Size(size), None)
    return rebuilt


class _Portable:
    """Stands for a quantized state tensor in a pickle or deep copy.

    It reduces to :func:`_rebuilt` over the inner tensors, so unpickling (or
    copying) yields the tensor itself. One-byte floats travel as ``uint8``
    views: torch cannot unpickle a ``float8`` storage (``UntypedStorage has
    no attribute dtype``), and torchao's state tensors have no ``clone``,
    which ``copy.deepcopy`` calls.
    """

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        names, context = self.value.__tensor_flatten__()  # type: ignore[attr-defined]
        inner = {name: getattr(self.value, name) for name in names}
        dtypes = {name: str(t.dtype).removeprefix("torch.") for name, t in inner.items()}
        portable = {
            name: t.view(torch.uint8) if t.is_floating_point() and t.element_size() == 1 else t
            for name, t in inner.items()
        }
        size = tuple(self.value.shape)
        return (_rebuilt, (type(self.value), portable, dtypes, context, size))


class _CopyableState(torch.optim.Optimizer):
    """Mixin: torchao optimizers that survive ``pickle`` and ``copy.deepcopy``.

    torch's ``Optimizer.__getstate__`` keeps only defaults, state and param
    groups, so a torchao optimizer loses ``block_size``, ``is_adamw`` and
    ``bf16_stochastic_round`` when pickled or copied and cannot step
    afterwards; and its quantized state tensors neither deep-copy nor (FP8)
    unpickle. Both are kept here; the live optimizer is not touched.
    """

    def __getstate__(self) -> dict[str, Any]:
        """torch's state with portable quantized tensors, plus torchao's instance attributes."""
        kept = {k: self.__dict__[k] for k in _INSTANCE_ATTRIBUTES if k in self.__dict__}
        state: defaultdict[Any, dict[str, Any]] = defaultdict(dict)
        for param, slots in self.state.items():
            state[param] = {k: _Portable(v) if _is_subclass(v) else v for k, v in slots.items()}
        return {**super().__getstate__(), "state": state, **kept}


def _wrapped(item: Entry) -> type[ExternalOptimizer]:
    library_class = getattr(torchao.optim, item.cls)
    name = item.cls.lstrip("_")
    namespace = {
        "__module__": __name__,
        "__qualname__": f"_{name}",
        "__doc__": library_class.__doc__,
    }
    cls = type(f"_{name}", (_CopyableState, library_class), namespace)
    return external_optimizer(
        item.name,
        cls,
        CONFIGS[item.name],
        name=name,
        module=__name__,
        doc=f"torchao's {item.cls} with optiplug's contract ({item.name}). {item.description}",
    )


CLASSES: dict[str, type[ExternalOptimizer]] = {
    item.name: _wrapped(item) for item in CATALOG if not item.limitation
}
"""Registered name -> the wrapped class."""

globals().update({cls.__name__: cls for cls in CLASSES.values()})  # lazy targets; they pickle


def _device_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return torch.cuda.is_available() or bool(xpu is not None and xpu.is_available())


def cpu_offload(
    params: Any,
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
    *,
    offload_gradients: bool = False,
    minimal_size: int = 4096,
    **hparams: Any,
) -> torch.optim.Optimizer:
    """torchao's ``CPUOffloadOptimizer``: ``optimizer_class`` stepping CPU copies of the parameters.

    Args:
        params: tensors or param-group dicts on a CUDA or XPU device.
        optimizer_class: the optimizer run on the CPU copies.
        offload_gradients: free device gradients once copied to the CPU.
        minimal_size: parameters with fewer elements stay on the device.
        **hparams: keywords for ``optimizer_class`` (``lr``, ``weight_decay``...).

    Returns:
        The offloading optimizer.

    Raises:
        OptimizerUnavailableError: no CUDA or XPU device here.
        HyperparameterError: ``optimizer_class`` is no optimizer class.
    """
    if not _device_available():
        raise OptimizerUnavailableError(
            "torchao:cpu_offload needs a CUDA or XPU device (it offloads device parameters)"
        )
    if not (
        isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)
    ):
        raise HyperparameterError(
            "optimizer_class", optimizer_class, "must be a torch.optim.Optimizer subclass"
        )
    offloading: torch.optim.Optimizer = torchao.optim.CPUOffloadOptimizer(
        params,
        optimizer_class,
        offload_gradients=offload_gradients,
        minimal_size=minimal_size,
        **hparams,
    )
    return offloading

"""torch.optim's classes with optiplug's contract (imports torch).

``optimizers.Adagrad`` is ``torch.optim.Adagrad`` built through
:func:`optiplug.base.external_optimizer`: validated keywords (the
catalogue's schema), ``foreach``/``fused`` chosen by ``impl``, an honest
``impl`` and validated, all-or-nothing state loading. Beyond that, the
bridge refuses up front, with a typed error naming what is wrong, what
torch's class would refuse later or half-way:

* L-BFGS takes one param group (its two-loop recursion runs over one flat
  vector of every parameter): more raise :class:`HyperparameterError`
  (``params``) before anything is built; its ``step`` needs a closure
  (:class:`~optiplug.errors.ClosureRequiredError` without one);
* torch's Muon updates 2-D parameters only and has no second optimizer for
  the rest: any other parameter raises :class:`HyperparameterError`
  (``params``, naming it and its shape); route vectors to another
  optimizer (``optiplug.create("multi", ...)``, or optiplug's own ``muon``);
* SparseAdam takes dense parameters with sparse gradients
  (``nn.Embedding(sparse=True)``): a sparse parameter is refused when
  built, a dense gradient by :class:`SparseGradientRequired` before any
  parameter changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from optiplug.base import (
    ExternalOptimizer,
    Prepared,
    external_optimizer,
)
from optiplug.errors import HyperparameterError, OptiplugError

from .catalog import ENTRIES, Entry
from .config import CONFIGS
from .plugin import PLUGIN

__all__ = ["CLASSES", "SparseGradientRequired", "TorchOptimizer"]


class SparseGradientRequired(OptiplugError, TypeError):
    """SparseAdam was stepped with a dense gradient (it updates sparse gradients only)."""

    def __init__(self, algorithm: str, index: int, shape: tuple[int, ...]) -> None:
        self.algorithm = algorithm
        self.index = index
        super().__init__(
            f"{algorithm}: parameter {index} of shape {shape} has a dense gradient; SparseAdam "
            "takes sparse gradients only (nn.Embedding(sparse=True)): give dense parameters to "
            "another optimizer (optiplug.create('multi', ...))"
        )


class TorchOptimizer(ExternalOptimizer):
    """Mixin: a torch class's refusals checked before it is built (see the module docstring)."""

    catalog_entry: ClassVar[Entry]

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        """The validated keywords, after checking the parameters the class takes.

        Raises:
            HyperparameterError: ``params`` that the class refuses (see the module).
        """
        entry = self.catalog_entry
        groups = [item for item in made.params if isinstance(item, dict)]
        if entry.closure and len(groups) > 1:
            raise HyperparameterError(
                "params",
                f"{len(groups)} param groups",
                "must be one group: L-BFGS runs over one flat vector of every parameter",
                algorithm=self.algorithm,
            )
        for name, tensor in _named_tensors(made.params):
            _check_parameter(entry, self.algorithm, name, tensor)
        return super()._keywords(made)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """torch's step (SparseAdam's refuses a dense gradient before any update)."""
        if self.catalog_entry.sparse:
            self._require_sparse_gradients()
        return super().step(closure)

    def _require_sparse_gradients(self) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        for index, param in enumerate(params):
            if param.grad is not None and not param.grad.is_sparse:
                raise SparseGradientRequired(self.algorithm, index, tuple(param.shape))


def _named_tensors(params: Iterable[Any]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every parameter: its own name, else its position."""
    found: list[tuple[str, torch.Tensor]] = []
    for item in params:
        if isinstance(item, dict):
            names = item.get("param_names") or [None] * len(item["params"])
            pairs = [(n, p) for n, p in zip(names, item["params"], strict=False)]
        else:
            pairs = [item if isinstance(item, tuple) else (None, item)]
        for name, tensor in pairs:
            if isinstance(name, str):
                found.append((name, tensor))
            else:
                found.append((str(len(found)), tensor))
    return found


def _check_parameter(entry: Entry, algorithm: str, name: str, tensor: torch.Tensor) -> None:
    """Raise :class:`HyperparameterError` for a parameter the class does not take."""
    if entry.matrices and tensor.ndim != 2:
        raise HyperparameterError(
            "params",
            f"{name} of shape {tuple(tensor.shape)}",
            "must be 2-D: torch's Muon orthogonalises matrices only; give the other parameters "
            "to another optimizer (optiplug's own muon routes them to AdamW)",
            algorithm=algorithm,
        )
    if entry.sparse and tensor.is_sparse:
        raise HyperparameterError(
            "params",
            f"{name} (a sparse tensor)",
            "must be dense: SparseAdam takes dense parameters with sparse gradients",
            algorithm=algorithm,
        )


def _bridge(entry: Entry) -> type[TorchOptimizer]:
    """The optiplug class of one catalogue entry."""
    torch_class = getattr(torch.optim, entry.class_name)
    base = external_optimizer(
        f"{PLUGIN}:{entry.name}",
        torch_class,
        CONFIGS[entry.name],
        name=entry.class_name,
        module=__name__,
        needs_closure=entry.closure,
    )
    namespace = {
        "__module__": __name__,
        "__qualname__": entry.class_name,
        "__doc__": f"torch.optim.{entry.class_name} with optiplug's contract ({entry.summary}).",
        "__signature__": base.__dict__["__signature__"],
        "catalog_entry": entry,
    }
    return type(entry.class_name, (TorchOptimizer, base), namespace)


CLASSES: dict[str, type[TorchOptimizer]] = {entry.name: _bridge(entry) for entry in ENTRIES}
"""Registered name -> class."""

globals().update({cls.__name__: cls for cls in CLASSES.values()})

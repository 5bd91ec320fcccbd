"""The schedule-free optimizer classes with optiplug's contract (imports torch and schedulefree).

Each class is :func:`optiplug.base.external_optimizer` over the library
class: keywords validated by the entry's config class, an honest ``impl``
(``loop``/``foreach`` from the class's ``foreach`` flag), its group state
declared for loading, validated all-or-nothing state loading, and the
class's own ``train()``/``eval()``.
"""

from __future__ import annotations

import inspect
from typing import Any

import schedulefree  # type: ignore[import-untyped]  # schedulefree ships no py.typed
import torch

from optiplug.base import ExternalOptimizer, external_optimizer
from optiplug.errors import OptimizerUnavailableError

from .catalog import CATALOG, Entry
from .config import CONFIGS

__all__ = ["CLASSES", "schedulefree_wrapper", "schedulefree_wrapper_reference"]


def _without_foreach(library_class: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``library_class`` minus its ``foreach`` keyword, which its step ignores.

    The reference classes take ``foreach`` but have one step: without the
    keyword, ``impl`` reports ``"default"`` instead of a ``foreach`` that
    does not run.
    """
    signature = inspect.signature(library_class.__init__)
    kept = [p for p in signature.parameters.values() if p.name != "foreach"]

    def __init__(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        library_class.__init__(self, params, *args, **kwargs)

    __init__.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    namespace = {"__init__": __init__, "__module__": __name__, "__doc__": library_class.__doc__}
    namespace["__qualname__"] = f"_{library_class.__name__}"
    return type(f"_{library_class.__name__}", (library_class,), namespace)


def _wrapped(item: Entry) -> type[ExternalOptimizer]:
    library_class = getattr(schedulefree, item.cls)
    if not item.implementations:
        library_class = _without_foreach(library_class)
    return external_optimizer(
        item.name,
        library_class,
        CONFIGS[item.name],
        group_state=item.group_state,
        name=item.cls,
        module=__name__,
        doc=f"schedulefree's {item.cls} with optiplug's contract ({item.name}). "
        + item.description,
        needs_closure=item.step_closure,
    )


_WRAPPERS = ("ScheduleFreeWrapper", "ScheduleFreeWrapperReference")

CLASSES: dict[str, type[ExternalOptimizer]] = {
    item.name: _wrapped(item) for item in CATALOG if item.cls not in _WRAPPERS
}
"""Registered name -> the wrapped class (every entry but the two wrappers)."""

globals().update({cls.__name__: cls for cls in CLASSES.values()})  # lazy targets; they pickle


def _refuse_wrapper(name: str, cls: str) -> OptimizerUnavailableError:
    return OptimizerUnavailableError(
        f"schedulefree:{name} wraps an optimizer object, not parameters: build the base "
        f"optimizer (optiplug.create(...)), then schedulefree.{cls}(base, ...)"
    )


def schedulefree_wrapper(
    params: Any,
    *,
    weight_decay_at_y: float = 0.0,
    momentum: float = 0.9,
    weight_lr_power: float = 2,
    r: float = 0,
) -> Any:
    """schedulefree's ``ScheduleFreeWrapper`` takes an optimizer, not parameters.

    Raises:
        OptimizerUnavailableError: always, saying how to build it.
    """
    raise _refuse_wrapper("schedulefree_wrapper", "ScheduleFreeWrapper")


def schedulefree_wrapper_reference(
    params: Any,
    *,
    momentum: float = 0.9,
    weight_decay_at_y: float = 0.0,
    r: float = 0,
    weight_lr_power: float = 2,
) -> Any:
    """schedulefree's ``ScheduleFreeWrapperReference`` takes an optimizer, not parameters.

    Raises:
        OptimizerUnavailableError: always, saying how to build it.
    """
    raise _refuse_wrapper("schedulefree_wrapper_reference", "ScheduleFreeWrapperReference")

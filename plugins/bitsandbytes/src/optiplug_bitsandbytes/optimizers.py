"""The bitsandbytes optimizer classes with optiplug's contract (imports torch and bitsandbytes).

Each class is :func:`optiplug.base.external_optimizer` over the bitsandbytes
class: keywords validated by the entry's config class, only the keywords
the class names passed on, an honest ``impl`` (bitsandbytes' step is its
own kernel: ``"default"``) and validated, all-or-nothing state loading.

State dicts are flat: bitsandbytes' own ``state_dict()`` moves the codes,
scales and maps of each parameter (``state1``, ``absmax1``, ``qmap1``...)
into one nested dict under ``"__bnb_optimizer_quant_state__"`` (so that
FSDP does not cast them); optiplug's checkpoint format stores and checks
one value per slot, so the bridge's ``state_dict()`` keeps the live layout,
slot by slot. Loading accepts both forms: a load pre-hook unnests
bitsandbytes' own before validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import bitsandbytes.functional
import bitsandbytes.optim
import torch
from bitsandbytes.optim.optimizer import GlobalOptimManager

from optiplug.base import ExternalOptimizer, Prepared, external_optimizer
from optiplug.errors import OptimizerUnavailableError

from .catalog import CATALOG, Entry
from .config import CONFIGS, momentum_required

__all__ = ["CLASSES", "NESTED_KEY", "flat_state_dict", "unavailable"]

NESTED_KEY = "__bnb_optimizer_quant_state__"
"""The key under which bitsandbytes' ``state_dict()`` nests each parameter's codes and maps."""

_INSTANCE_ATTRIBUTES = (
    "args",
    "optimizer_name",
    "name2qmap",
    "is_paged",
    "non_castable_tensor_keys",
)
"""What bitsandbytes' ``Optimizer8bit`` keeps on the instance, outside torch's pickled state."""


def flat_state_dict(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """``state_dict`` with bitsandbytes' nested entries put back as slots (a shallow copy).

    Args:
        state_dict: a state dict in either form.

    Returns:
        The flat form: ``state[id][slot]`` for every slot.
    """
    state = {
        key: _unnested(entry) if isinstance(entry, Mapping) else entry
        for key, entry in state_dict.get("state", {}).items()
    }
    return {**state_dict, "state": state}


def _unnested(entry: Mapping[str, Any]) -> dict[str, Any]:
    nested = entry.get(NESTED_KEY)
    flat = {k: v for k, v in entry.items() if k != NESTED_KEY}
    return {**flat, **nested} if isinstance(nested, Mapping) else flat


class _FlatState(torch.optim.Optimizer):
    """Mixin: flat state dicts (see the module), and copies and pickles that step.

    torch's ``Optimizer.__getstate__`` keeps only defaults, state and param
    groups; bitsandbytes' step also reads ``args`` (bits, ``min_8bit_size``,
    ``max_unorm``) and ``optimizer_name`` from the instance, so they are kept.
    It defines no ``__init__``: the library class's signature is the one read.
    """

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict of the live state: one entry per slot, none nested."""
        return flat_state_dict(super().state_dict())

    def __getstate__(self) -> dict[str, Any]:
        """torch's state plus what bitsandbytes' step reads from the instance."""
        kept = {k: self.__dict__[k] for k in _INSTANCE_ATTRIBUTES if k in self.__dict__}
        return {**super().__getstate__(), **kept}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's ``__setstate__``; bitsandbytes' process-wide managers are looked up again."""
        super().__setstate__(state)
        self.__dict__.setdefault("initialized", False)
        if "mng" not in self.__dict__:
            self.mng = GlobalOptimManager.get_instance()  # type: ignore[no-untyped-call]
            self.page_mng = bitsandbytes.functional.GlobalPageManager.get_instance()  # type: ignore[no-untyped-call]


class _Unnesting(torch.optim.Optimizer):
    """Mixin below the library class: registers the pre-hook that unnests on load."""

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        self.register_load_state_dict_pre_hook(_unnest_hook)


def _unnest_hook(_: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    return flat_state_dict(state_dict)


class _WithMomentum(ExternalOptimizer):
    """Mixin of SGD and LARS: a zero momentum, their library default, is refused when built."""

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        """The validated keywords, once momentum > 0 holds for the defaults and every group.

        Raises:
            HyperparameterError: a zero momentum (bitsandbytes' step raises
                ``NotImplementedError`` on it); nothing was built.
        """
        momentum_required(made.config.momentum, self.algorithm)
        for group in made.params:
            if isinstance(group, Mapping) and "momentum" in group:
                momentum_required(group["momentum"], self.algorithm)
        return super()._keywords(made)


def _wrapped(item: Entry) -> type[ExternalOptimizer]:
    library_class = getattr(bitsandbytes.optim, item.cls)
    namespace = {
        "__module__": __name__,
        "__qualname__": f"_{item.cls}",
        "__doc__": library_class.__doc__,
    }
    cls = type(f"_{item.cls}", (_FlatState, library_class, _Unnesting), namespace)
    wrapped = external_optimizer(
        item.name,
        cls,
        CONFIGS[item.name],
        name=item.cls,
        module=__name__,
        doc=f"bitsandbytes' {item.cls} with optiplug's contract ({item.name}). {item.description}",
    )
    if not any(p.check == "momentum_required" for p in item.params):
        return wrapped
    bases = (_WithMomentum, wrapped)
    return type(item.cls, bases, {"__module__": __name__, "__qualname__": item.cls})


CLASSES: dict[str, type[ExternalOptimizer]] = {
    item.name: _wrapped(item) for item in CATALOG if not item.limitation
}
"""Registered name -> the wrapped class."""

globals().update({cls.__name__: cls for cls in CLASSES.values()})  # lazy targets; they pickle


def unavailable(params: Any, *, entry: str, **hparams: Any) -> NoReturn:
    """The factory of a limited entry: refuses before anything is built, saying why.

    Args:
        params: the parameters (unused).
        entry: the entry's registered name.
        **hparams: its keywords (unused).

    Raises:
        OptimizerUnavailableError: always, with the entry's limitation.
    """
    reason = next(item.limitation for item in CATALOG if item.name == entry)
    raise OptimizerUnavailableError(f"bitsandbytes:{entry} cannot run: {reason}")

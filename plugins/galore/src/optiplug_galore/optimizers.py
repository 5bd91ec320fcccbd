"""The GaLore optimizer classes with optiplug's contract (imports torch and galore_torch).

Each class is :func:`optiplug.base.external_optimizer` over the library
class: keywords validated by the entry's config class, the projection keys
of every group with a ``rank`` checked before anything is built
(:func:`~optiplug_galore.config.check_projection_groups`), other group keys
passed through untouched, and validated, all-or-nothing state loading.

**The projector in checkpoints.** The library keeps a ``GaLoreProjector``
object in each projected parameter's state (its rank, gap, scale, type,
verbosity and the current projection matrix). An object is no checkpoint
value (``torch.load(weights_only=True)`` refuses it, and optiplug's
checkpoint stores tensors, numbers, strings, None and lists), so
``state_dict()`` stores it as plain slots, ``projector_<attribute>`` for
each of :data:`~optiplug_galore.catalog.PROJECTOR_FIELDS` (the matrix as a
list: ``[P]``, or ``[P, Q]`` for ``proj_type="full"``), and loading (which
ends in ``__setstate__``) rebuilds the object from them. A projector holding
an attribute this bridge does not know (another library release) is refused
at save with a :class:`~optiplug.errors.CheckpointError`, never written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import galore_torch  # type: ignore[import-untyped]  # galore-torch ships no py.typed
import torch
from galore_torch.galore_projector import GaLoreProjector  # type: ignore[import-untyped]

from optiplug.base import ExternalOptimizer, Prepared, external_optimizer
from optiplug.errors import CheckpointError

from .catalog import CATALOG, PROJECTOR_FIELDS, Entry
from .config import CONFIGS, check_projection_groups

__all__ = ["CLASSES", "restore_projector", "stored_projector", "without_cuda_synchronize"]

_KEY = "projector"
_PREFIX = "projector_"
_NESTED = "__bnb_optimizer_quant_state__"
"""Where bitsandbytes' ``state_dict()`` nests the 8-bit codes and maps of a parameter."""
_BNB_ATTRIBUTES = ("args", "optimizer_name", "name2qmap", "is_paged", "non_castable_tensor_keys")
"""What bitsandbytes' ``Optimizer8bit`` keeps on the instance and its step reads."""


def stored_projector(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One parameter's state with its projector object as plain ``projector_*`` slots.

    Args:
        entry: the parameter's state (not changed).
        where: the parameter's place, for the error.

    Returns:
        A new dict (the same dict's items when there is no projector object).

    Raises:
        CheckpointError: the projector holds attributes this bridge does not know.
    """
    projector = entry.get(_KEY)
    if projector is None:
        return dict(entry)
    found = dict(vars(projector))
    if set(found) != set(PROJECTOR_FIELDS):
        unknown = sorted(set(found) ^ set(PROJECTOR_FIELDS))
        raise CheckpointError(
            f"cannot save {where}: its {type(projector).__name__} has attributes "
            f"{unknown} this bridge does not store (written for galore-torch's)"
        )
    stored = {key: value for key, value in entry.items() if key != _KEY}
    for name in PROJECTOR_FIELDS:
        value = found[name]
        if name == "ortho_matrix":
            value = [] if value is None else list(value) if isinstance(value, list) else [value]
        stored[_PREFIX + name] = value
    return stored


def restore_projector(entry: dict[str, Any]) -> None:
    """Put back the projector object of a state :func:`stored_projector` wrote (in place)."""
    if _PREFIX + "rank" not in entry:
        return
    values = {name: entry.pop(_PREFIX + name) for name in PROJECTOR_FIELDS}
    matrices = list(values["ortho_matrix"])
    if not matrices:
        values["ortho_matrix"] = None
    else:
        values["ortho_matrix"] = matrices if values["proj_type"] == "full" else matrices[0]
    projector = object.__new__(GaLoreProjector)  # no __init__: the attributes come from the state
    vars(projector).update(values)
    entry[_KEY] = projector


class _Projected(ExternalOptimizer):
    """Mixin: projection keys checked when built; projectors stored as plain slots."""

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        """The validated keywords, once every projected group's keys hold.

        Raises:
            HyperparameterError: a bad projection key of a group; nothing was built.
        """
        check_projection_groups(self.algorithm, made.params)
        return super()._keywords(made)

    def state_dict(self) -> dict[str, Any]:
        """The class's state dict, each projector stored as ``projector_*`` slots.

        Raises:
            CheckpointError: a projector this bridge cannot store (nothing is returned).
        """
        saved = super().state_dict()
        saved["state"] = {
            index: stored_projector(entry, f"state {index}")
            if isinstance(entry, Mapping)
            else entry
            for index, entry in saved["state"].items()
        }
        return saved

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's ``__setstate__`` (a load ends here), then the projectors rebuilt."""
        super().__setstate__(state)
        for entry in self.state.values():
            restore_projector(entry)


class _FlatQuantState(torch.optim.Optimizer):
    """Mixin of the 8-bit class: bitsandbytes' nested state flattened, its attributes kept.

    bitsandbytes' ``state_dict()`` nests each parameter's codes and maps under
    one key; optiplug stores and checks one value per slot, so the saved
    form is the live one. Copies and pickles keep what its step reads from
    the instance.
    """

    def state_dict(self) -> dict[str, Any]:
        """The state dict with bitsandbytes' nested entries put back as slots."""
        saved = super().state_dict()
        for index, entry in list(saved["state"].items()):
            nested = entry.get(_NESTED) if isinstance(entry, Mapping) else None
            if isinstance(nested, Mapping):
                flat = {k: v for k, v in entry.items() if k != _NESTED}
                saved["state"][index] = {**flat, **nested}
        return saved

    def __getstate__(self) -> dict[str, Any]:
        """torch's state plus what bitsandbytes' step reads from the instance."""
        kept = {k: self.__dict__[k] for k in _BNB_ATTRIBUTES if k in self.__dict__}
        return {**super().__getstate__(), **kept}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's ``__setstate__``; bitsandbytes' process-wide managers looked up again."""
        super().__setstate__(state)
        self.__dict__.setdefault("initialized", False)
        if "mng" not in self.__dict__:
            from bitsandbytes.functional import GlobalPageManager  # deferred: imports torch
            from bitsandbytes.optim.optimizer import GlobalOptimManager  # deferred: imports torch

            self.mng = GlobalOptimManager.get_instance()  # type: ignore[no-untyped-call]
            self.page_mng = GlobalPageManager.get_instance()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def without_cuda_synchronize() -> Iterator[None]:
    """``torch.cuda.synchronize`` as a no-op inside, on a machine without CUDA (else nothing).

    galore-torch's ``GaLoreAdamW8bit`` calls it in every step, unconditionally;
    a CPU-only torch raises there, though with no device there is nothing to
    wait for. Where CUDA is available the real synchronisation runs.
    """
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.synchronize
    torch.cuda.synchronize = _no_device_to_wait_for
    try:
        yield
    finally:
        torch.cuda.synchronize = original


def _no_device_to_wait_for(device: Any = None) -> None:
    """What synchronising CUDA means on a machine without it: nothing."""


class _SynchronizesCuda(ExternalOptimizer):
    """Mixin of the 8-bit class: its step runs on the CPU too (:func:`without_cuda_synchronize`)."""

    def step(self, closure: Any = None) -> Any:
        """The library's step; on a machine without CUDA its synchronisations do nothing."""
        with without_cuda_synchronize():
            return super().step(closure)


def _wrapped(item: Entry) -> type[ExternalOptimizer]:
    library_class = getattr(galore_torch, item.cls)
    if item.name == "galore_adamw_8bit":
        namespace = {"__module__": __name__, "__qualname__": f"_{item.cls}Flat"}
        library_class = type(f"_{item.cls}Flat", (_FlatQuantState, library_class), namespace)
    wrapped = external_optimizer(
        item.name,
        library_class,
        CONFIGS[item.name],
        name=f"_{item.cls}",
        module=__name__,
        doc=f"galore_torch's {item.cls} with optiplug's contract ({item.name}). "
        + item.description,
    )
    eight_bit = item.name == "galore_adamw_8bit"
    bases = (_SynchronizesCuda, _Projected, wrapped) if eight_bit else (_Projected, wrapped)
    namespace = {"__module__": __name__, "__qualname__": item.cls, "__doc__": wrapped.__doc__ or ""}
    return type(item.cls, bases, namespace)


CLASSES: dict[str, type[ExternalOptimizer]] = {item.name: _wrapped(item) for item in CATALOG}
"""Registered name -> the wrapped class."""

globals().update({cls.__name__: cls for cls in CLASSES.values()})  # lazy targets; they pickle

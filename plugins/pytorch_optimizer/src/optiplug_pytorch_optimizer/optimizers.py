"""The wrapper classes: each library class with optiplug's contract (imports torch).

``optimizers.Adan`` is ``pytorch_optimizer.Adan`` built through
:func:`optiplug.base.external_optimizer`: validated keywords (the
catalogue's schema), only the keywords the class names passed on, an honest
``impl`` and validated, all-or-nothing state loading. Classes are built on
first access and cached, so they pickle by reference.

Three adaptations, each for a way the library departs from
``torch.optim.Optimizer``'s conventions (listed in the bridge's docs):

* a step when no parameter has a gradient does nothing, as torch's
  optimizers do (some classes raise ``ZeroParameterSizeError`` there);
* param-group keys the class keeps as 1-element tensors (D-Adaptation's
  ``d``, Prodigy's ``d_numerator``...) are saved as 0-d tensors, which
  optiplug's group-state checks accept, and reshaped back before the next
  step; group values that are a ``torch.dtype`` (ROSE's ``compute_dtype``)
  or a dict (SCION's ``norm_kwargs``) are saved as flat tuples
  (``("torch.dtype", "float64")``, ``("dict", key, value, ...)``) and
  decoded before the next step;
* state the class keeps in ``optimizer.state`` under a key that is no
  parameter (MADGRAD's step count ``k``, EmoNavi's loss averages ``ema``)
  is saved in the first param group as ``global:<key>`` (a running group
  key) and put back before the next step;
* the Muon family requires a ``use_muon`` key in every group: groups
  without one are split, matrices (2-D and up) on Muon and the rest on the
  class's AdamW, the rule the library's ``prepare_muon_parameters`` applies;
  every group also gets ``use_adamw`` (``not use_muon``, which the library
  ignores), so the state schema can say which slots each group keeps.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import attrs
import torch

from optiplug.base import ExternalOptimizer, Prepared, external_optimizer
from optiplug.errors import HyperparameterError

from .catalog import ENTRIES
from .plugin import PLUGIN, class_name
from .schema import config_class
from .table import REQUIRED, Entry, LibraryDefault

__all__ = ["BridgedOptimizer", "wrapper"]

_ENTRIES: dict[str, Entry] = {class_name(entry): entry for entry in ENTRIES}
_BUILT: dict[str, type[ExternalOptimizer]] = {}


class BridgedOptimizer(ExternalOptimizer):
    """A pytorch-optimizer class with optiplug's contract (see the module docstring).

    Keywords whose default is the library's own (a dtype, a function: no
    literal in the catalogue) are passed only when given; a keyword the
    class requires (``num_iterations`` of Ranger21) must be given.
    """

    catalog_entry: ClassVar[Entry]

    def __init__(self, params: Iterable[Any] | Prepared, *args: Any, **kwargs: Any) -> None:
        if self.catalog_entry.muon_groups:
            params = _with_use_muon(params)
        super().__init__(params, *args, **kwargs)

    def _validated(self, params: list[Any], hparams: dict[str, Any]) -> dict[str, Any]:
        keywords = super()._validated(params, hparams)
        for name, value in keywords.items():
            if value is REQUIRED:
                raise HyperparameterError(
                    name,
                    None,
                    f"is required by {self.catalog_entry.name}",
                    algorithm=self.algorithm,
                )
        return {k: v for k, v in keywords.items() if not isinstance(v, LibraryDefault)}

    def state_dict(self) -> dict[str, Any]:
        """The class's state dict in the form optiplug stores (see the module docstring)."""
        state = super().state_dict()
        shapes = dict(self.catalog_entry.group_tensors)
        for group in state["param_groups"]:
            for key, value in list(group.items()):
                if key in shapes and isinstance(value, torch.Tensor) and value.numel() == 1:
                    group[key] = value.reshape(())
                elif isinstance(value, (torch.dtype, dict)):
                    group[key] = _encoded(value)
        for key, _, _ in self.catalog_entry.global_state:
            if key in state["state"] and state["param_groups"]:
                value = state["state"].pop(key)
                stored = value.reshape(()) if isinstance(value, torch.Tensor) else _encoded(value)
                state["param_groups"][0][f"global:{key}"] = stored
        return state

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The class's step; nothing when no parameter has a gradient and there is no closure."""
        if closure is None and not any(
            p.grad is not None for group in self.param_groups for p in group["params"]
        ):
            return None
        self._restore()
        return super().step(closure)

    def _restore(self) -> None:
        """Undo :meth:`state_dict`'s storage forms in a loaded optimizer (a no-op otherwise)."""
        shapes = dict(self.catalog_entry.group_tensors)
        for group in self.param_groups:
            for key, value in list(group.items()):
                shape = shapes.get(key)
                if shape is not None and isinstance(value, torch.Tensor):
                    if tuple(value.shape) != shape and value.numel() == math.prod(shape):
                        group[key] = value.reshape(shape)
                elif _is_encoded(value) and not key.startswith("global:"):
                    group[key] = _decoded(value)
        state: dict[Any, Any] = self.state  # the library keys its global state by name
        for key, kind, shape in self.catalog_entry.global_state:
            stored = self.param_groups[0].pop(f"global:{key}", None) if self.param_groups else None
            if stored is not None:
                state[key] = stored.reshape(shape) if kind == "tensor" else _decoded(stored)


def _encoded(value: torch.dtype | dict[str, Any]) -> tuple[Any, ...]:
    """A dtype or a dict of plain values as a flat tuple of plain values."""
    if isinstance(value, torch.dtype):
        return ("torch.dtype", str(value).removeprefix("torch."))
    return ("dict", *(item for pair in sorted(value.items()) for item in pair))


def _is_encoded(value: Any) -> bool:
    return isinstance(value, tuple) and value[:1] in (("torch.dtype",), ("dict",))


def _decoded(value: tuple[Any, ...]) -> Any:
    """The dtype or dict :func:`_encoded` stored."""
    if value[0] == "torch.dtype":
        return getattr(torch, value[1])
    items = value[1:]
    return dict(zip(items[0::2], items[1::2], strict=True))


def _with_use_muon(params: Iterable[Any] | Prepared) -> Any:
    """``params`` with every group carrying ``use_muon`` (split by dimension where absent)."""
    if isinstance(params, Prepared):
        return attrs.evolve(params, params=_with_use_muon(params.params))
    groups: list[dict[str, Any]] = []
    loose: list[Any] = []
    for item in params:
        if isinstance(item, dict):
            role = {"use_adamw": not item["use_muon"]} if "use_muon" in item else {}
            groups += [{**item, **role}] if role else _split(item)
        else:
            loose.append(item)
    if loose:
        named = all(isinstance(item, tuple) for item in loose)
        group: dict[str, Any] = {"params": [item[1] if named else item for item in loose]}
        if named:
            group["param_names"] = [item[0] for item in loose]
        groups += _split(group)
    return groups


def _split(group: dict[str, Any]) -> list[dict[str, Any]]:
    items = list(group["params"])
    named = items and all(isinstance(item, tuple) for item in items)
    tensors = [item[1] for item in items] if named else items
    names = [item[0] for item in items] if named else group.get("param_names")
    result = []
    for use_muon in (True, False):
        chosen = [i for i, p in enumerate(tensors) if (p.ndim >= 2) == use_muon]
        if chosen:
            part = {
                **group,
                "params": [tensors[i] for i in chosen],
                "use_muon": use_muon,
                "use_adamw": not use_muon,
            }
            if names is not None:
                part["param_names"] = [names[i] for i in chosen]
            result.append(part)
    return result


def wrapper(entry: Entry) -> type[ExternalOptimizer]:
    """The (cached) wrapper class of ``entry``."""
    name = class_name(entry)
    if name not in _BUILT:
        module, _, qualname = entry.target.partition(":")
        library_class = getattr(importlib.import_module(module), qualname)
        base = external_optimizer(
            f"{PLUGIN}:{entry.name}",
            library_class,
            config_class(entry),
            group_state=entry.group_state,
            name=name,
            module=__name__,
        )
        namespace = {
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": base.__doc__,
            "__signature__": base.__dict__["__signature__"],
            "catalog_entry": entry,
        }
        _BUILT[name] = type(name, (BridgedOptimizer, base), namespace)
    return _BUILT[name]


def __getattr__(name: str) -> Any:
    entry = _ENTRIES.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return wrapper(entry)

"""APOLLO's ``APOLLOAdamW`` with optiplug's contract (imports torch and apollo_torch).

:func:`optiplug.base.external_optimizer` over the library class: keywords
validated by its config class, the projection keys of every group with a
``rank`` checked before anything is built
(:func:`~optiplug_apollo.config.check_projection_groups`), other group keys
passed through untouched, and validated, all-or-nothing state loading.

**The projector in checkpoints.** The library keeps a projector object in
each projected parameter's state: a ``GradientProjector`` (``proj="random"``:
its rank, gap, scale, type, the seed of its next random matrix and the
current one) or a ``GaLoreProjector`` (``proj="svd"``). An object is no
checkpoint value (``torch.load(weights_only=True)`` refuses it; optiplug's
checkpoint stores tensors, numbers, strings, None and lists), so
``state_dict()`` stores its attributes as plain slots
(``projector_kind`` naming the class, ``projector_<attribute>`` for each
attribute of :data:`~optiplug_apollo.catalog.PROJECTORS`, the matrix as
``[P]``), and loading (which ends in ``__setstate__``) rebuilds it. A
projector of another class, or with attributes this bridge does not know,
is refused at save with a :class:`~optiplug.errors.CheckpointError`, never
written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import apollo_torch  # type: ignore[import-untyped]  # apollo-torch ships no py.typed
from apollo_torch.random_projector import GradientProjector  # type: ignore[import-untyped]
from apollo_torch.svd_projector import GaLoreProjector  # type: ignore[import-untyped]

from optiplug.base import Prepared, external_optimizer
from optiplug.errors import CheckpointError

from .catalog import NAME, PROJECTORS
from .config import APOLLOAdamWConfig, check_projection_groups

__all__ = ["APOLLOAdamW", "restore_projector", "stored_projector"]

_KEY = "projector"
_PREFIX = "projector_"
_CLASSES: dict[str, type] = {
    "GradientProjector": GradientProjector,
    "GaLoreProjector": GaLoreProjector,
}
"""The projector classes a checkpoint may name (by these names, never by an import path)."""
_FIELDS = {kind: fields for kind, fields in PROJECTORS.values()}


def stored_projector(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One parameter's state with its projector object as plain ``projector_*`` slots.

    Args:
        entry: the parameter's state (not changed).
        where: the parameter's place, for the error.

    Returns:
        A new dict (the same items when there is no projector object).

    Raises:
        CheckpointError: a projector of another class, or with unknown attributes.
    """
    projector = entry.get(_KEY)
    if projector is None:
        return dict(entry)
    kind = type(projector).__name__
    if _CLASSES.get(kind) is not type(projector):
        raise CheckpointError(f"cannot save {where}: a {kind} projector is not apollo_torch's")
    found, fields = dict(vars(projector)), _FIELDS[kind]
    if set(found) != set(fields):
        unknown = sorted(set(found) ^ set(fields))
        raise CheckpointError(
            f"cannot save {where}: its {kind} has attributes {unknown} this bridge does not "
            "store (written for apollo-torch 1.0)"
        )
    stored = {key: value for key, value in entry.items() if key != _KEY}
    stored[_PREFIX + "kind"] = kind
    for name in fields:
        value = found[name]
        stored[_PREFIX + name] = (
            ([] if value is None else [value]) if name == "ortho_matrix" else value
        )
    return stored


def restore_projector(entry: dict[str, Any]) -> None:
    """Put back the projector object of a state :func:`stored_projector` wrote (in place)."""
    kind = entry.pop(_PREFIX + "kind", None)
    if kind is None:
        return
    values = {name: entry.pop(_PREFIX + name) for name in _FIELDS[kind]}
    matrices = list(values["ortho_matrix"])
    values["ortho_matrix"] = matrices[0] if matrices else None
    cls = _CLASSES[kind]
    projector: Any = object.__new__(cls)  # no __init__: every attribute comes from the state
    vars(projector).update(values)
    entry[_KEY] = projector


_APOLLOAdamW = external_optimizer(
    NAME,
    apollo_torch.APOLLOAdamW,
    APOLLOAdamWConfig,
    name="_APOLLOAdamW",
    module=__name__,
    doc=apollo_torch.APOLLOAdamW.__doc__,
)


class APOLLOAdamW(_APOLLOAdamW):  # type: ignore[misc,valid-type]  # a class built at import
    """apollo_torch's APOLLOAdamW with optiplug's contract (apollo_adamw).

    Projected where a param group carries ``rank``, ``proj``, ``scale_type``,
    ``update_proj_gap``, ``scale`` and ``proj_type`` (matrices only); other
    groups step as AdamW.
    """

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        """The validated keywords, once every projected group's keys hold.

        Raises:
            HyperparameterError: a bad projection key of a group; nothing was built.
        """
        check_projection_groups(self.algorithm, made.params)
        return dict(super()._keywords(made))

    def state_dict(self) -> dict[str, Any]:
        """The class's state dict, each projector stored as ``projector_*`` slots.

        Raises:
            CheckpointError: a projector this bridge cannot store (nothing is returned).
        """
        saved: dict[str, Any] = super().state_dict()
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

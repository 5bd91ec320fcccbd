"""The one public record a created optimizer carries: what was made, by whom, how."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .specs import OptimizerSpec

__all__ = ["RECORD_ATTRIBUTE", "OptimizerRecord", "attach_record", "record_of"]

RECORD_ATTRIBUTE = "_optiplug_record"
"""The attribute of a created optimizer holding its :class:`OptimizerRecord` (read it with
:func:`record_of`; like torch's own state it is not pickled with the optimizer)."""


@attrs.frozen
class OptimizerRecord:
    """How an optimizer was made by :func:`optiplug.create` (or a factory, a Graph, AutoOptimizer).

    Read it with :func:`optiplug.record_of`; ``optimizer.impl`` reports the
    implementation running now (a measured choice may switch it later).

    Attributes:
        spec: the algorithm's record, as the registry resolved it.
        registry: the :class:`~optiplug.Registry` that created it.
        implementation: the implementation it reported (``impl``) at
            creation, or None when it reports none.
        grouping: ``{parameter name: why it is in its param group}`` when
            ``no_decay``/``layer_decay`` split the parameters, else empty.
    """

    spec: OptimizerSpec
    registry: Any = attrs.field(eq=False, repr=False)
    implementation: str | None = None
    grouping: Mapping[str, str] = attrs.field(factory=dict)

    def __deepcopy__(self, memo: dict[int, Any]) -> OptimizerRecord:
        """The record itself: it is immutable, and its registry is process-wide."""
        return self

    @property
    def algorithm(self) -> str:
        """The algorithm's canonical name."""
        return self.spec.name

    @property
    def plugin(self) -> str | None:
        """The plugin that provides the algorithm, or None (registered by hand)."""
        return self.spec.provider.plugin if self.spec.provider is not None else None


def record_of(optimizer: Any) -> OptimizerRecord | None:
    """The :class:`OptimizerRecord` of ``optimizer``, or None if optiplug did not create it.

    Args:
        optimizer: any optimizer.

    Returns:
        Its record, or None.
    """
    found = getattr(optimizer, RECORD_ATTRIBUTE, None)
    return found if isinstance(found, OptimizerRecord) else None


def attach_record(optimizer: Any, record: OptimizerRecord) -> None:
    """Put ``record`` on ``optimizer``.

    Raises:
        TypeError: the optimizer takes no attributes (a ``__slots__`` class
            without ``__dict__``): optiplug could not validate its state later.
    """
    try:
        setattr(optimizer, RECORD_ATTRIBUTE, record)
    except (AttributeError, TypeError) as error:
        raise TypeError(
            f"{record.spec.name}: the optimizer its factory built ({type(optimizer).__name__}) "
            f"takes no attributes, so optiplug cannot record how it was made: {error}"
        ) from error

"""What the creation and selection code needs of a registry, as protocols.

:class:`~optiplug.Registry` satisfies each of them. Typing against these,
rather than against the class, lets ``create`` and ``selection`` sit below
``registry`` in the import graph while the registry builds on both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from .specs import Candidate, ImplementationSpec, OptimizerSpec, PluginInfo, SelectionRequest

__all__ = ["AlgorithmLookup", "CandidateSource", "OptimizerCreator"]


@runtime_checkable
class OptimizerCreator(Protocol):
    """Creates an optimizer by name (what a factory calls)."""

    def create(
        self,
        name: str,
        params: Iterable[Any],
        *,
        impl: str | None = None,
        provider: str | None = None,
        **hparams: Any,
    ) -> torch.optim.Optimizer:
        """Create optimizer ``name`` over ``params``."""
        ...


class AlgorithmLookup(Protocol):
    """Finds an algorithm's spec and its implementations (what creation reads)."""

    def spec(self, name: str, *, provider: str | None = None) -> OptimizerSpec:
        """The spec of ``name``."""
        ...

    def implementations(
        self, name: str, *, provider: str | None = None
    ) -> list[ImplementationSpec]:
        """Every implementation of ``name``."""
        ...


class CandidateSource(OptimizerCreator, Protocol):
    """Installed algorithms and every rule's candidates (what selection reads)."""

    def optimizers(self) -> list[str]:
        """Names of the installed algorithms."""
        ...

    def candidates(self, request: SelectionRequest) -> list[tuple[Candidate, PluginInfo]]:
        """Every rule's candidates for ``request``."""
        ...

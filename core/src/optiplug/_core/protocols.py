"""What a recipe and the selection code need of a registry, as protocols.

:class:`~optiplug.Registry` satisfies each of them. Typing against these,
rather than against the class, lets ``create`` (whose picklable
:class:`~optiplug._core.create.OptimizerFactory` calls back ``create``) and
``selection`` sit below ``registry`` in the import graph. Creating an
optimizer itself never calls the registry back: it resolves the name and
hands :func:`~optiplug._core.create.create_optimizer` the records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from .specs import Candidate, ImplementationSpec, PluginInfo, SelectionRequest

__all__ = ["CandidateSource", "ImplementationSelector", "OptimizerCreator"]


class ImplementationSelector(Protocol):
    """What creation needs of a registry's implementation chooser.

    :class:`optiplug._choice.chooser.ImplementationChooser` satisfies it;
    the registry owns one and hands it to creation, which never imports the
    layer it lives in.
    """

    def select(
        self,
        algorithm: str,
        candidates: Sequence[ImplementationSpec],
        impl: str | None,
        params: Sequence[torch.Tensor],
        hparams: Mapping[str, Any],
        *,
        config: Any = None,
        follow: list[Any] | None = None,
    ) -> ImplementationSpec | None:
        """The implementation to run: ``impl`` when forced (checked), else the fastest runnable."""
        ...

    def report_failure(self, impl: ImplementationSpec, error: BaseException) -> None:
        """Record that ``impl`` failed and is skipped."""
        ...

    def implementation_failures(self) -> dict[tuple[str, str, str], str]:
        """Implementations skipped: ``(algorithm, name, plugin) -> error``."""
        ...


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


class CandidateSource(OptimizerCreator, Protocol):
    """Installed algorithms and every rule's candidates (what selection reads)."""

    def optimizers(self) -> list[str]:
        """Names of the installed algorithms."""
        ...

    def candidates(self, request: SelectionRequest) -> list[tuple[Candidate, PluginInfo]]:
        """Every rule's candidates for ``request``."""
        ...

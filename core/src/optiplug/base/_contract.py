"""The contract every optimizer of :mod:`optiplug.base` shares: kernels, loading, decisions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import torch

from .._core import decision as _decision
from .._core.decision import Prepared
from .._core.naming import split_qualified
from .._core.specs import ImplementationSpec
from .._state.codec import NO_SLOTS, SECOND_MOMENTS
from .._state.load import load_state_dict
from ._pipeline import StepPiece, state_codec

__all__ = ["ContractOptimizer", "Kernel", "Supports", "ValidatedLoading", "same_algorithm"]


def same_algorithm(name: str, algorithm: str) -> bool:
    """Whether ``name`` (a registry's) and a class's ``algorithm`` name one algorithm.

    A bridged class may carry its qualified name (``pytorch_optimizer:adan``)
    where the registry resolved the plain one (``adan``), or the reverse.
    """
    return split_qualified(name)[1] == split_qualified(algorithm)[1]


class Kernel(Protocol):
    """One implementation's update, in place: ``kernel(params, grads, *state, **options)``.

    Every kernel of a :class:`KernelTableOptimizer` has the same signature;
    any function does (this protocol only names the role).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Update the tensors of one param group in place."""


class Supports(Protocol):
    """``(params) -> bool``: whether an implementation can run these parameter tensors."""

    def __call__(self, params: Sequence[torch.Tensor], /) -> bool:
        """True when every tensor (device, dtype, layout) is supported."""


class ValidatedLoading(torch.optim.Optimizer):
    """Mixin: ``load_state_dict`` validates first and loads all-or-nothing.

    Same rules as :func:`optiplug.load_state_dict` with ``strict=True``: state
    is matched by parameter name when both sides have names, every tensor is
    copied (never aliased), and on any problem nothing changes. The
    optimizer keeps its own implementation flags
    (``foreach``/``fused``/``capturable``/``differentiable``): they describe
    how the saving optimizer ran, not the state.
    """

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, without importing ``torch._dynamo`` outside a compile.

        torch wraps the method so that a compile does not trace into it; the
        wrapper imports ``torch._dynamo`` on first use, about a second on a
        small CPU machine, in every process that builds an optimizer. Outside
        a compile the wrapped function runs directly; inside one, the wrapper.
        A class between this one and torch's (a library's optimizer that
        overrides the method, torchao's or SaRA's) runs its own as ever.

        Args:
            param_group: the group, as ``torch.optim.Optimizer`` takes it.
        """
        following = super().add_param_group  # a library class's own override comes first
        wrapped = torch.optim.Optimizer.add_param_group
        plain = getattr(wrapped, "__wrapped__", None)
        is_torchs = getattr(following, "__func__", None) is wrapped
        if is_torchs and plain is not None and not torch.compiler.is_compiling():
            plain(self, param_group)
        else:
            following(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Validate ``state_dict``, then load it all-or-nothing.

        Args:
            state_dict: as returned by ``state_dict()`` here or in torch.

        Raises:
            StateDictError: with ``.problems``, every problem found.
        """
        load_state_dict(self, state_dict, strict=True)

    algorithm: ClassVar[str] = ""
    config_class: ClassVar[type | None] = None

    @classmethod
    def validated(cls, params: Sequence[Any], hparams: Mapping[str, Any]) -> Any:
        """Validate ``hparams`` and each group's overrides with :attr:`config_class` (the construction step of :func:`~optiplug.base.prepare`).

        Returns:
            The config instance.

        Raises:
            HyperparameterError: naming the algorithm, field and value.
        """
        return _decision.validate(cls.algorithm, hparams, params, config=cls.config_class)

    @classmethod
    def takes_decision(cls, prepared: Prepared) -> bool:
        """Whether ``prepared`` holds this algorithm's validated config."""
        config_class = cls.config_class
        return (
            same_algorithm(prepared.algorithm, cls.algorithm)
            and config_class is not None
            and isinstance(prepared.config, config_class)
        )

    second_moments: ClassVar[frozenset[str]] = SECOND_MOMENTS
    """State slots kept with the unsigned table without zero when a group's
    ``state_precision`` is int8 or int4 (second moments: never negative, and
    never to be rounded to zero)."""

    linear_slots: ClassVar[frozenset[str]] = NO_SLOTS
    """State slots kept with the linear signed table (evenly spaced codes)
    instead of the dynamic one when a group's ``state_precision`` is int8 or
    int4; none by default (Muon names its momentum)."""

    low_rank_slots: ClassVar[frozenset[str]] = NO_SLOTS
    """State slots that, when a group's ``state_precision`` is int8 or int4
    and the slot is a matrix, keep float32 factors of rank
    :data:`LOW_RANK` beside codes of the residual, so rounding spares the
    matrix's small singular directions; none by default (Muon names its
    momentum, which Newton-Schulz orthogonalizes)."""


class ContractOptimizer(ValidatedLoading, torch.optim.Optimizer):
    """What the optimizer bases share: an algorithm, a config class, implementations, a pipeline.

    A subclass is built from a :class:`~optiplug.base.Prepared` decision
    (:func:`~optiplug.base.prepare`), and steps through its
    :attr:`step_pipeline` (see :func:`~optiplug.base.run_pipeline`).
    """

    config_class: ClassVar[type]
    step_pipeline: ClassVar[tuple[StepPiece, ...]] = (state_codec,)
    """The pieces run around the kernel on every step, the first outermost."""

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """This class's implementations as records."""
        raise NotImplementedError

    @classmethod
    def implementation_names(cls) -> frozenset[str]:
        """The names of this class's implementations."""
        return frozenset(record.name for record in cls.implementation_specs())

    def switch_implementation(self, name: str) -> None:
        """Run implementation ``name`` from the next step on (the state carries over)."""
        raise NotImplementedError

    def _take_measured_choice(self) -> None:
        """Between steps: switch to the measured winner once its measurement is done.

        Called at the start of ``step()`` and when :attr:`impl` is read.
        """
        tuning = self.__dict__.get("_tuning")
        if tuning is None or tuning.pending:
            return
        self._tuning = None
        winner = tuning.winner
        if winner is not None and winner in self.implementation_names():
            self.switch_implementation(winner)

    @property
    def impl(self) -> str:
        """The implementation in use."""
        raise NotImplementedError

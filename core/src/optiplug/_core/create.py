"""Creating optimizers from registry records: validation, then implementation choice."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import HyperparameterError
from ..validators import validate_hyperparameters
from .binding import bound_registry
from .params import group_overrides, parameter_tensors
from .specs import ImplementationSpec, OptimizerSpec

if TYPE_CHECKING:
    import torch

    from .registry import Registry

__all__ = [
    "REGISTRY_ATTRIBUTE",
    "SPEC_ATTRIBUTE",
    "OptimizerFactory",
    "create_optimizer",
    "validated_hparams",
]

SPEC_ATTRIBUTE = "_optiplug_spec"
"""Attribute naming the :class:`OptimizerSpec` an optimizer was created from.

Set by :func:`create_optimizer` on every optimizer it builds, whatever its
factory, so state validation knows the algorithm (and its state slots) even
for a plain torch class registered by a third party.
"""

REGISTRY_ATTRIBUTE = "_optiplug_registry"
"""Attribute naming the :class:`Registry` that created an optimizer (for validation hooks)."""


def validated_hparams(
    spec: OptimizerSpec, hparams: dict[str, Any], params: Sequence[Any] = ()
) -> dict[str, Any]:
    """Merge ``spec.defaults`` under ``hparams`` and validate (groups too).

    Args:
        spec: the algorithm.
        hparams: user keywords.
        params: the materialised ``params`` argument; its param-group dicts'
            overrides are validated merged over ``hparams``.

    Returns:
        The merged keywords to pass to the factory.

    Raises:
        HyperparameterError: naming the algorithm, field and value.
    """
    merged = {**spec.defaults, **hparams}
    validate_hyperparameters(spec.name, merged, config=spec.config, factory=spec.factory)
    for override in group_overrides(params):
        validate_hyperparameters(
            spec.name, {**merged, **override}, config=spec.config, factory=spec.factory
        )
    return merged


def _choose(
    spec: OptimizerSpec,
    candidates: Sequence[ImplementationSpec],
    impl: str | None,
    tensors: Sequence[torch.Tensor],
    hparams: dict[str, Any],
) -> ImplementationSpec | None:
    from . import autotune  # deferred: imports torch

    if impl is not None:
        chosen = [c for c in candidates if c.name == impl]
        if not chosen:
            names = ", ".join(c.name for c in candidates) or "none registered"
            raise HyperparameterError(
                "impl", impl, f"no such implementation; available: {names}", algorithm=spec.name
            )
        if not chosen[0].can_run(tensors):
            kinds = ", ".join(sorted({f"{t.device.type}/{t.dtype}" for t in tensors}))
            raise HyperparameterError(
                "impl", impl, f"does not support these parameters ({kinds})", algorithm=spec.name
            )
        return chosen[0]
    runnable = [c for c in candidates if c.can_run(tensors)]
    if not runnable:
        return None
    return autotune.choose(spec.name, runnable, tensors, hparams)


def create_optimizer(
    registry: Registry,
    name: str,
    params: Iterable[Any],
    *,
    impl: str | None = None,
    provider: str | None = None,
    **hparams: Any,
) -> Any:
    """Build algorithm ``name`` over ``params`` (see :func:`optiplug.create`)."""
    spec = registry.spec(name, provider=provider)
    params = list(params)
    merged = validated_hparams(spec, hparams, params)
    candidates = registry.implementations(spec.name, provider=provider)
    chosen = _choose(spec, candidates, impl, parameter_tensors(params), merged)
    factory = chosen.factory if chosen is not None else spec.factory
    optimizer = factory(params, **merged)
    _tag(optimizer, spec, registry)
    return optimizer


def _tag(optimizer: Any, spec: OptimizerSpec, registry: Registry) -> None:
    """Record the spec and registry on ``optimizer`` (skipped if it refuses attributes)."""
    try:
        setattr(optimizer, SPEC_ATTRIBUTE, spec)
        setattr(optimizer, REGISTRY_ATTRIBUTE, registry)
    except (AttributeError, TypeError):
        pass


@attrs.frozen
class OptimizerFactory:
    """A picklable recipe for an optimizer: call it with parameters.

    Built by :func:`optiplug.factory` or :meth:`optiplug.Registry.factory`;
    it resolves ``name`` in the registry that built it. The registry is not
    pickled: an unpickled factory resolves names in the default registry of
    the process that calls it.

    Attributes:
        name: algorithm name.
        hparams: hyperparameters (already validated).
        impl: forced implementation, or None to choose by measurement.
        provider: plugin or distribution that must provide ``name``, or None.
        registry: the :class:`~optiplug.Registry` that built it, or None.
    """

    name: str
    hparams: dict[str, Any] = attrs.field(factory=dict, converter=dict)
    impl: str | None = None
    provider: str | None = None
    registry: Registry | None = attrs.field(default=None, eq=False, repr=False, kw_only=True)

    def __call__(self, params: Iterable[Any]) -> Any:
        """Create the optimizer over ``params``.

        Args:
            params: tensors, param-group dicts or ``(name, tensor)`` pairs.

        Returns:
            A ``torch.optim.Optimizer``.
        """
        registry = bound_registry(self.registry)
        return registry.create(
            self.name, params, impl=self.impl, provider=self.provider, **self.hparams
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle every field but the registry (a process-local object)."""
        state = {field.name: getattr(self, field.name) for field in attrs.fields(type(self))}
        state["registry"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        if "registry" not in state:  # pickled before factories carried their registry
            object.__setattr__(self, "registry", None)

"""What creating an optimizer decides, once, and the one routine that validates hyperparameters.

:func:`optiplug.create` resolves the name, validates the keywords, builds the
param groups and chooses the implementation, then hands the optimizer class
a :class:`Prepared` record instead of the raw arguments: a class that accepts one
(its ``__init__`` carries :data:`TAKES_PREPARED`, as the constructors of
:class:`optiplug.base.TorchBackedOptimizer` and
:class:`optiplug.base.KernelTableOptimizer` do) builds from it without
validating or choosing again. Any other factory is called as before, with
``(params, **hparams)``. A class constructed directly by a user validates
through :func:`validate` too, so both paths share one routine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from .._lazy import LazyCallable
from ..validators import known_hyperparameters, validate_hyperparameters
from .params import group_overrides
from .specs import ImplementationSpec

__all__ = [
    "TAKES_PREPARED",
    "Prepared",
    "accepts_prepared",
    "build",
    "prepared_class",
    "validate",
]

TAKES_PREPARED = "_optiplug_takes_prepared"
"""Marker attribute on an ``__init__`` that takes a :class:`Prepared` as its ``params``."""

_Init = TypeVar("_Init", bound=Callable[..., None])


@attrs.frozen
class Prepared:
    """A finished creation decision, handed to the optimizer class.

    Attributes:
        algorithm: the algorithm's canonical name.
        params: the parameters, split into param groups when asked.
        hparams: the validated keywords (merged over the spec's defaults),
            what a factory that takes no decision is called with.
        config: the validated config instance, or None (no config class).
        implementation: the chosen (or forced) implementation, or None when
            none was chosen (the algorithm's own factory is built).
        chooser: the creating registry's implementation chooser, for a class
            that still has to choose (None: the default registry's).
        tuning: the background measurement the optimizer follows, switching
            to its winner between steps once it is done, or None.
    """

    algorithm: str
    params: list[Any]
    hparams: dict[str, Any]
    config: Any = None
    implementation: ImplementationSpec | None = None
    chooser: Any = attrs.field(default=None, eq=False, repr=False)
    tuning: Any = attrs.field(default=None, eq=False, repr=False)

    @property
    def impl(self) -> str | None:
        """The chosen implementation's name, or None."""
        return self.implementation.name if self.implementation is not None else None


def validate(
    algorithm: str,
    hparams: Mapping[str, Any],
    params: Sequence[Any] = (),
    *,
    config: type | None = None,
    factory: Callable[..., Any] | None = None,
) -> Any:
    """Validate ``hparams``, and each param group's overrides merged over them.

    The one validation routine: :func:`optiplug.create`,
    :meth:`optiplug.Registry.factory` and the optimizer classes of
    :mod:`optiplug.base` (built directly) all call it. A group key the
    algorithm does not know (timm's ``lr_scale``, a user's tag) is left in
    the group unchecked, as ``torch.optim`` leaves it; an unknown keyword
    of ``hparams`` itself is refused (a misspelt hyperparameter).

    Returns:
        The ``config`` instance of ``hparams``, or None without a config class.

    Raises:
        HyperparameterError: naming the algorithm, field and value.
    """
    result = validate_hyperparameters(algorithm, hparams, config=config, factory=factory)
    known = known_hyperparameters(config, factory)
    for override in group_overrides(params):
        checked = {k: v for k, v in override.items() if known is None or k in known}
        validate_hyperparameters(algorithm, {**hparams, **checked}, config=config, factory=factory)
    return result


def accepts_prepared(init: _Init) -> _Init:
    """Mark an optimizer's ``__init__`` as taking a :class:`Prepared` in place of ``params``."""
    setattr(init, TAKES_PREPARED, True)
    return init


def prepared_class(factory: Callable[..., Any]) -> type | None:
    """The class behind ``factory`` when it takes a :class:`Prepared`, else None.

    ``factory`` may be the class, a :func:`optiplug.lazy` reference to it or a
    ``functools.partial`` of it, binding nothing but ``impl`` (which the
    decision carries).
    """
    bound: Mapping[str, Any] = {}
    target: Any = factory
    if isinstance(factory, LazyCallable):
        bound, target = factory.kwargs, factory.resolve()
    elif isinstance(factory, functools.partial):
        if factory.args:
            return None
        bound, target = factory.keywords, factory.func
    if set(bound) - {"impl"} or not isinstance(target, type):
        return None
    init = getattr(target, "__init__", None)
    return target if getattr(init, TAKES_PREPARED, False) else None


def build(factory: Callable[..., Any], decision: Prepared) -> Any:
    """Build the optimizer of ``decision`` with ``factory`` (see :func:`prepared_class`)."""
    target = prepared_class(factory)
    if target is None:
        return factory(decision.params, **decision.hparams)
    return target(decision)

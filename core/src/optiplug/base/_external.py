"""The external wrapper: a third-party optimizer class plus optiplug's contract."""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, cast

import attrs
import torch

from .._core import decision as _decision
from .._core.decision import Prepared, accepts_prepared
from .._core.implementations import TORCH_IMPLEMENTATION_FLAGS
from .._core.specs import ImplementationSpec
from .._lazy import lazy
from .._state.values import copied_tensor, is_subclass_tensor
from ..errors import ClosureRequiredError
from ..validators import reject_unknown
from ._construction import UNSET, prepare
from ._contract import ValidatedLoading, same_algorithm

__all__ = [
    "ClosureStep",
    "ExternalOptimizer",
    "external_implementations",
    "external_optimizer",
    "named_keywords",
]

_FLAGS = frozenset({"foreach", "fused"})
_NOT_NAMED = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
_EXTERNAL_PRIORITY = {"foreach": 1, "loop": 0, "default": 0, "fused": -1}
"""``fused`` last: which devices an external fused kernel runs on is the library's to say."""


def _init_signature(cls: type) -> inspect.Signature:
    """The signature of ``cls.__init__`` as looked up on the class (``self`` included)."""
    init: Callable[..., Any] = cls.__dict__.get("__init__") or next(
        k.__dict__["__init__"] for k in cls.__mro__ if "__init__" in k.__dict__
    )
    return inspect.signature(init)


def named_keywords(cls: type) -> frozenset[str]:
    """The keywords ``cls.__init__`` names (a ``**kwargs`` names none: what it swallows is unknown)."""
    try:
        parameters = _init_signature(cls).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(p.name for p in parameters if p.kind not in _NOT_NAMED) - {"self", "params"}


def external_implementations(cls: type) -> dict[str, dict[str, bool]]:
    """The implementations an external optimizer class offers, from the flags its signature names.

    ``fused`` and ``foreach`` count only when ``cls.__init__`` names them; a
    class that takes neither (or swallows them in ``**kwargs``) has one
    implementation, ``"default"``: its own, whatever it does.

    Args:
        cls: the optimizer class.

    Returns:
        ``{implementation: constructor flags}``.
    """
    named = named_keywords(cls) & {"foreach", "fused"}
    if not named:
        return {"default": {}}
    table = {
        name: {k: v for k, v in flags.items() if k in named}
        for name, flags in TORCH_IMPLEMENTATION_FLAGS.items()
    }
    return {name: flags for name, flags in table.items() if name == "loop" or flags.get(name)}


class ExternalOptimizer(ValidatedLoading, torch.optim.Optimizer):
    """Mixin for a third-party optimizer class plus optiplug's contract.

    Build subclasses with :func:`external_optimizer`. The constructor
    validates the keywords (with :attr:`config_class` when given, else
    against the class's signature: a keyword the signature does not name is
    refused with a did-you-mean even when the class would swallow it in
    ``**kwargs``), passes the class only the keywords its signature names,
    and chooses the implementation among those its signature offers (see
    :func:`external_implementations`) the way every optimizer is chosen
    (:func:`~optiplug.base.prepare`), by the one priority rule of external
    implementations: ``impl`` forces one; None takes ``foreach`` where
    offered and runnable, else ``loop`` (or ``default``), never timed
    (:attr:`measured`), and ``fused`` only when asked. :attr:`impl` reports
    what runs.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword).
        impl: an implementation name, or None.
        **hparams: the class's other keywords.

    Raises:
        HyperparameterError: an unknown keyword, a bad value or an unknown ``impl``.
    """

    algorithm: ClassVar[str] = ""
    config_class: ClassVar[type | None] = None
    external_class: ClassVar[type]
    group_state: ClassVar[tuple[str, ...]] = ()
    measured: ClassVar[bool] = False
    """Another library's implementations are ranked, never timed: they are not bit-identical
    to each other, and a measured choice could differ between a run and its resume."""

    @accepts_prepared
    def __init__(
        self,
        params: Iterable[Any] | Prepared,
        lr: Any = UNSET,
        *,
        impl: str | None = None,
        **hparams: Any,
    ) -> None:
        made = prepare(type(self), params, lr, impl, hparams)
        table = external_implementations(self.external_class)
        self._optiplug_impl = str(made.impl)
        flags: dict[str, Any] = dict(table[self._optiplug_impl])
        super().__init__(made.params, **self._keywords(made), **flags)

    @classmethod
    def validated(cls, params: Sequence[Any], hparams: Mapping[str, Any]) -> Any:
        """Validate ``hparams`` (and each group's overrides).

        With :attr:`config_class`, by it; without, against the class's
        signature (a keyword it does not name is refused with a did-you-mean,
        even when the class would swallow it in ``**kwargs``).

        Returns:
            The config instance, or None without a config class.

        Raises:
            HyperparameterError: naming the algorithm, field and value.
        """
        if cls.config_class is not None:
            return _decision.validate(cls.algorithm, hparams, params, config=cls.config_class)
        reject_unknown(hparams, named_keywords(cls.external_class) - _FLAGS, cls.algorithm)
        _decision.validate(cls.algorithm, hparams, params, factory=cls.external_class)
        return None

    @classmethod
    def takes_decision(cls, prepared: Prepared) -> bool:
        """Whether ``prepared`` was validated for this algorithm (with its config class, if any)."""
        if not same_algorithm(prepared.algorithm, cls.algorithm) or prepared.config is UNSET:
            return False
        return cls.config_class is None or isinstance(prepared.config, cls.config_class)

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        """The validated keywords to pass the class: those its signature names."""
        named = named_keywords(self.external_class) - _FLAGS
        values = made.hparams if made.config is None else attrs.asdict(made.config, recurse=False)
        return {k: v for k, v in values.items() if k in named}

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """One record per implementation the class's signature offers.

        Args:
            target: ``"module:Class"`` naming this class (lazy, picklable
                factories); None gives factories bound to the class itself.

        Returns:
            The records; each factory forces its implementation.
        """
        return tuple(
            ImplementationSpec(
                cls.algorithm,
                name,
                lazy(target, impl=name) if target else functools.partial(cls, impl=name),
                priority=_EXTERNAL_PRIORITY[name],
                description=f"{cls.external_class.__name__} with "
                + (", ".join(f"{k}={v}" for k, v in flags.items()) or "its own defaults"),
            )
            for name, flags in external_implementations(cls.external_class).items()
        )

    @property
    def impl(self) -> str:
        """The implementation that runs, read from the group flags the class keeps."""
        table = external_implementations(self.external_class)
        group = self.param_groups[0] if self.param_groups else {}
        if "fused" in table and group.get("fused"):
            return "fused"
        if "foreach" in table and group.get("foreach"):
            return "foreach"
        if "loop" in table and any(k in group for k in ("fused", "foreach")):
            return "loop"
        return str(self.__dict__.get("_optiplug_impl", next(iter(table))))

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus the implementation chosen."""
        return {**super().__getstate__(), "_optiplug_impl": self.__dict__.get("_optiplug_impl")}

    def __deepcopy__(self, memo: dict[int, Any]) -> ExternalOptimizer:
        """A deep copy; tensor-subclass state is rebuilt from copies of its inner tensors.

        ``copy.deepcopy`` of a tensor calls ``clone``, which some quantized
        state subclasses do not implement.
        """
        _seed_subclass_copies(self.state, memo)
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return clone

    def switch_implementation(self, name: str) -> None:
        """Run implementation ``name`` from the next step on (the state layout is the class's)."""
        table = external_implementations(self.external_class)
        if name not in table:
            raise KeyError(name)
        for group in self.param_groups:
            group.update(table[name])
        self._optiplug_impl = name


def _seed_subclass_copies(value: Any, memo: dict[int, Any]) -> None:
    """Put a copy of every tensor subclass in ``value`` (nested) into a deepcopy ``memo``."""
    if isinstance(value, torch.Tensor):
        if is_subclass_tensor(value) and id(value) not in memo:
            memo[id(value)] = copied_tensor(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _seed_subclass_copies(item, memo)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _seed_subclass_copies(item, memo)


def external_optimizer(
    algorithm: str,
    cls: type[torch.optim.Optimizer],
    config_class: type | None = None,
    *,
    group_state: Iterable[str] = (),
    name: str | None = None,
    module: str | None = None,
    doc: str | None = None,
    needs_closure: bool = False,
) -> type[ExternalOptimizer]:
    """Wrap a third-party optimizer class with optiplug's contract (:class:`ExternalOptimizer`).

    Validated keywords (an unknown one is refused even if the class swallows
    ``**kwargs``), only the keywords its signature names passed on,
    ``foreach``/``fused`` only when named there, an honest :attr:`impl`,
    and validated all-or-nothing state loading. Its train/eval methods, if
    any, are the class's own. Give ``module`` (and ``name``) where the class
    is importable from, so it pickles, as for :func:`torch_backed_optimizer`.

    Args:
        algorithm: the algorithm's registered name.
        cls: the optimizer class (``pytorch_optimizer.Adan``).
        config_class: an attrs class validating the hyperparameters; None
            validates by the class's signature and the well-known names.
        group_state: param-group keys holding running state (see
            :attr:`optiplug.OptimizerSpec.group_state`), for loading when
            the class is used without the registry.
        name: the class name; defaults to ``cls``'s.
        module: the importable module that exposes the class; defaults to
            the caller's module.
        doc: the class docstring.
        needs_closure: its ``step`` needs a closure (declare
            :attr:`optiplug.OptimizerSpec.step_closure` too): stepping
            without one raises :class:`~optiplug.errors.ClosureRequiredError`
            before the library's step runs (:class:`ClosureStep`).

    Returns:
        The new optimizer class.
    """
    name = name or cls.__name__
    bases = (ClosureStep, ExternalOptimizer, cls) if needs_closure else (ExternalOptimizer, cls)
    namespace: dict[str, Any] = {
        "algorithm": algorithm,
        "config_class": config_class,
        "external_class": cls,
        "group_state": tuple(group_state),
        "__module__": module or sys._getframe(1).f_globals.get("__name__", __name__),
        "__qualname__": name,
        "__doc__": doc or f"{cls.__name__} with optiplug's contract ({algorithm}).",
        "__signature__": _wrapper_signature(cls),
    }
    return cast("type[ExternalOptimizer]", type(name, bases, namespace))


class ClosureStep:
    """Mixin of an optimizer whose ``step`` needs a closure: without one it raises, typed.

    Its library's own step, called without a closure, fails on calling
    ``None`` (``'NoneType' object is not callable``) or on a missing
    argument; this one says what to pass before anything runs.
    """

    algorithm: ClassVar[str]

    def step(self, closure: Callable[[], Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """Step with ``closure``, which re-evaluates the model and returns the loss.

        Raises:
            ClosureRequiredError: no closure was given; nothing changed.
        """
        if closure is None:
            raise ClosureRequiredError(self.algorithm)
        return super().step(closure, *args, **kwargs)  # type: ignore[misc]  # the library's step


def _wrapper_signature(cls: type) -> inspect.Signature:
    """``(params, lr, *, <the class's other named keywords>)``: what the wrapper accepts.

    Without ``**kwargs`` and without ``foreach``/``fused`` (``impl`` picks
    those), so ``optiplug show`` lists the class's hyperparameters with
    their defaults (a betas default declares the arity) and an unknown
    keyword is refused.
    """
    try:
        own = list(_init_signature(cls).parameters.values())
    except (TypeError, ValueError):
        own = []
    skipped = {"self", "params", "foreach", "fused"}
    kept = [p for p in own if p.kind not in _NOT_NAMED and p.name not in skipped]
    keyword = inspect.Parameter.KEYWORD_ONLY
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("params", positional)]
    parameters += [p.replace(kind=positional) for p in kept if p.name == "lr"]
    parameters += [p.replace(kind=keyword) for p in kept if p.name != "lr"]
    return inspect.Signature(parameters)

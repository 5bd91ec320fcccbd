"""The torch-backed wrapper: torch's own optimizer class plus optiplug's contract."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, cast

import attrs
import torch

from .._core.decision import Prepared, accepts_prepared
from .._core.implementations import TORCH_IMPLEMENTATION_FLAGS, torch_implementations
from .._core.specs import ImplementationSpec
from .._state.codec import StoredStateStep
from ._calls import closure_loss
from ._construction import UNSET, prepare
from ._contract import ContractOptimizer
from ._external import named_keywords
from ._pipeline import StepPiece, cautious_decay, run_pipeline, state_codec

__all__ = ["TorchBackedOptimizer", "torch_backed_optimizer"]


def _not_torch_keywords(cls: type, options: Mapping[str, Any]) -> list[str]:
    """Config fields the torch class's ``__init__`` does not take (optiplug's own group keys)."""
    accepted = _torch_keywords(cls)
    return [] if accepted is None else [key for key in options if key not in accepted]


@functools.cache
def _torch_keywords(cls: type) -> frozenset[str] | None:
    """The keywords of the torch class under ``cls`` (read once per class), or None."""
    torch_class: type | None = next(
        (base for base in cls.__mro__ if base.__module__.startswith("torch.optim")), None
    )
    if torch_class is None:
        return None
    return frozenset(inspect.signature(vars(torch_class)["__init__"]).parameters)


def _loss_scaling_done_here(optimizer: torch.optim.Optimizer) -> bool:
    """Unscale the gradients here when ``GradScaler`` left it to a fused step that will not run.

    ``GradScaler`` hands ``grad_scale`` and ``found_inf`` to an optimizer
    whose ``_step_supports_amp_scaling`` is set (torch sets it on one built
    fused) and lets the fused kernel unscale and skip. When the groups run
    loop or foreach instead (the measured winner took over), torch's
    kernels refuse those attributes; so the gradients are unscaled in place
    here, as the scaler does for every other optimizer, and the attributes
    are set to None for this step (the scaler deletes them afterwards).

    Args:
        optimizer: the optimizer about to step.

    Returns:
        Whether the step must be skipped (the scaler found inf or NaN).
    """
    grad_scale = getattr(optimizer, "grad_scale", None)
    found_inf = getattr(optimizer, "found_inf", None)
    fused = all(group.get("fused") for group in optimizer.param_groups)
    if fused or (grad_scale is None and found_inf is None):
        return False
    optimizer.grad_scale = optimizer.found_inf = None  # type: ignore[attr-defined]
    if found_inf is not None and bool(found_inf.item()):
        return True
    if grad_scale is not None:
        inverse = grad_scale.double().reciprocal().float()  # the scaler's own unscale factor
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        param.grad.mul_(inverse.to(param.grad.device))
    return False


def _torch_update(optimizer: Any) -> None:
    """torch's own step over the groups of ``optimizer`` (or of a view of it)."""
    super(TorchBackedOptimizer, optimizer).step()


class TorchBackedOptimizer(ContractOptimizer):
    """Mixin for an optimizer that is torch's own class plus optiplug's contract.

    Subclasses list it before the torch class and set :attr:`algorithm` and
    :attr:`config_class` (or use :func:`torch_backed_optimizer`).
    Hyperparameters are keyword arguments (``lr`` may also be positional);
    ``impl`` picks ``"loop"``, ``"foreach"`` or ``"fused"``, or, when None,
    the fastest supported one by measurement.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword).
        impl: implementation name, or None to measure.
        **hparams: the algorithm's other hyperparameters.

    Raises:
        HyperparameterError: an unknown keyword, a bad value, or an ``impl``
            that does not exist or cannot run these parameters.
    """

    step_pipeline: ClassVar[tuple[StepPiece, ...]] = (cautious_decay, state_codec)
    state_step: ClassVar[StoredStateStep | None] = None
    """The C step on a parameter's stored low-precision codes, ``(optimizer, group, param) ->
    bool`` (False declines: the state is decoded and torch's step runs), or None."""

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
        options: dict[str, Any] = {
            **attrs.asdict(made.config, recurse=False),
            **TORCH_IMPLEMENTATION_FLAGS[str(made.impl)],
        }
        own = {key: options.pop(key) for key in _not_torch_keywords(type(self), options)}
        super().__init__(made.params, **options)  # the torch class's keywords (lr=..., fused=...)
        self.defaults.update(own)  # optiplug's own keys: groups added later get them too
        for group in self.param_groups:
            for key, value in own.items():
                group.setdefault(key, value)
        self._tuning = made.tuning

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step of torch's update through :attr:`step_pipeline`, the measured kernel once known.

        By default groups with ``weight_decay_mode="cautious"`` (an algorithm
        with decoupled weight decay that declares the mode) decay only the
        coordinates whose update agrees in sign with the parameter
        (:func:`~optiplug.base.cautious_decay`), and groups with a
        ``state_precision`` other than ``"fp32"`` step one parameter at a time
        on decoded state, or by :attr:`state_step` on the stored codes
        (:func:`~optiplug.base.state_codec`). Under ``GradScaler``, an
        optimizer built fused but now running loop or foreach unscales and
        skips as the scaler would have.

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        self._take_measured_choice()
        loss = closure_loss(closure)
        if not _loss_scaling_done_here(self):
            run_pipeline(self, self.step_pipeline, _torch_update)
        return loss

    def stored_state_step(self, group: dict[str, Any], param: torch.Tensor) -> bool:
        """:attr:`state_step` on ``param`` (False when the class declares none)."""
        declared = type(self).state_step
        return declared is not None and declared(self, group, param)

    def switch_implementation(self, name: str) -> None:
        """Run ``loop``, ``foreach`` or ``fused`` from the next step on.

        The three share torch's state layout; the fused kernels keep the
        ``step`` counter as a float32 tensor on the parameter's device, so
        it is moved there when switching to ``fused``.
        """
        flags = TORCH_IMPLEMENTATION_FLAGS[name]
        for group in self.param_groups:
            group.update(flags)
        self._step_supports_amp_scaling = flags["fused"]  # GradScaler: who unscales
        if not flags["fused"]:
            return
        for param, state in self.state.items():
            step = state.get("step")
            if torch.is_tensor(step) and (
                step.device != param.device or step.dtype != torch.float32
            ):
                state["step"] = step.to(device=param.device, dtype=torch.float32)

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """This class's implementations as records (``loop``, ``foreach``, ``fused``).

        Args:
            target: ``"module:Class"`` naming this class, for records a
                registry keeps (lazy, picklable factories); None gives
                factories bound to the class itself.

        Returns:
            One record per implementation; each factory forces it.
        """
        records = torch_implementations(cls.algorithm, target or f"{cls.__module__}:{cls.__name__}")
        if target is not None:
            return records
        return tuple(attrs.evolve(r, factory=functools.partial(cls, impl=r.name)) for r in records)

    @classmethod
    def implementation_names(cls) -> frozenset[str]:
        """``loop``, ``foreach`` and ``fused``."""
        return frozenset(TORCH_IMPLEMENTATION_FLAGS)

    @property
    def impl(self) -> str:
        """The implementation in use: ``"fused"``, ``"foreach"`` or ``"loop"``.

        While ``impl=None`` measures in the background, the one that runs
        meanwhile; the measured one once the measurement is done.
        """
        self._take_measured_choice()
        group = self.param_groups[0] if self.param_groups else {}
        if group.get("fused"):
            return "fused"
        return "foreach" if group.get("foreach") else "loop"


def torch_backed_optimizer(
    algorithm: str,
    torch_class: type[torch.optim.Optimizer],
    config_class: type,
    *,
    name: str | None = None,
    module: str | None = None,
    doc: str | None = None,
    state_step: StoredStateStep | None = None,
) -> type[TorchBackedOptimizer]:
    """Build the :class:`TorchBackedOptimizer` subclass of ``torch_class``.

    Equivalent to writing::

        class Adam(TorchBackedOptimizer, torch.optim.Adam):
            algorithm = "adam"
            config_class = AdamConfig

    Give ``module`` (and ``name``) where the class is importable from, so it
    pickles; the module must return this same class object for ``name``
    (e.g. build it once in a module ``__getattr__`` and cache it).

    Args:
        algorithm: the algorithm's name.
        torch_class: the torch optimizer class (``torch.optim.Adam``).
        config_class: the attrs class validating the hyperparameters.
        name: the class name; defaults to ``torch_class``'s.
        module: the importable module that exposes the class; defaults to
            the caller's module.
        doc: the class docstring.
        state_step: the C step on stored low-precision codes
            (:attr:`TorchBackedOptimizer.state_step`), or None.

    Returns:
        The new optimizer class.

    Raises:
        TypeError: ``torch_class``'s signature does not name both ``foreach``
            and ``fused`` (a class from another library: wrap it with
            :func:`external_optimizer`).
    """
    missing = {"foreach", "fused"} - named_keywords(torch_class)
    if missing:
        raise TypeError(
            f"torch_backed_optimizer: {torch_class.__qualname__} does not name "
            f"{' or '.join(sorted(missing))} in its signature, so its loop/foreach/fused "
            "implementations cannot be chosen; wrap it with "
            "optiplug.base.external_optimizer instead"
        )
    name = name or torch_class.__name__
    namespace: dict[str, Any] = {
        "algorithm": algorithm,
        "config_class": config_class,
        "state_step": state_step,
        "__module__": module or sys._getframe(1).f_globals.get("__name__", __name__),
        "__qualname__": name,
        "__doc__": doc or f"{torch_class.__name__} with optiplug's contract ({algorithm}).",
    }
    return cast(
        "type[TorchBackedOptimizer]", type(name, (TorchBackedOptimizer, torch_class), namespace)
    )

"""The kernel table: an optimizer of one's own with several kernels sharing one state layout."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import attrs
import torch

from .._core.decision import Prepared, accepts_prepared
from .._core.specs import ImplementationSpec
from .._lazy import lazy
from .._state.codec import group_precision
from .._state.native_state import StateKernelSource, state_kernel_or_none
from ._calls import closure_loss
from ._construction import UNSET, prepare
from ._contract import ContractOptimizer, Kernel, Supports
from ._pipeline import run_pipeline

__all__ = ["KernelTableOptimizer"]


def _kernel_update(optimizer: Any) -> None:
    """The chosen kernel over every group of ``optimizer`` (or of a view of it)."""
    kernel = optimizer.implementations[optimizer._impl]
    for group in optimizer.param_groups:
        tensors = optimizer._group_tensors(group)
        if tensors and tensors[0]:
            kernel(*tensors, **optimizer._kernel_options(group))


class KernelTableOptimizer(ContractOptimizer):
    """Base for an optimizer with several kernels that share one state layout.

    In the style of ``torch.optim.adamw()`` dispatching to its
    single-tensor, multi-tensor and fused kernels: each implementation is a
    function with one signature, ``kernel(params, grads, *state_lists,
    **options)``, updating the tensors in place. A subclass declares:

    * :attr:`algorithm` and :attr:`config_class` (the attrs class that
      validates the hyperparameters; its fields become the group defaults);
    * :attr:`implementations`: ``{"loop": kernel, "foreach": kernel, ...}``;
    * :attr:`supports` (optional): ``{"foreach": foreach_supported, ...}``,
      which implementations run which parameters (absent: all);
    * :attr:`priorities` (optional): the order when not measured
      (``OPTIPLUG_AUTOTUNE=0``), higher first (absent: 0, then by name);
    * :attr:`compiled` (optional): the implementations whose first steps
      compile; while ``impl=None`` measures in the background, the
      highest-priority other one runs, and the optimizer switches kernel
      between steps once the measurement is done;
    * :attr:`zero_state`: per-parameter state tensors, created as zeros like
      the parameter on its first step and passed, in this order, after
      ``params`` and ``grads``;
    * :attr:`step_pipeline` (optional): the pieces run around the kernel
      (default: :data:`~optiplug.base.state_codec`; add
      :data:`~optiplug.base.cautious_decay` for ``weight_decay_mode``);
    * :attr:`state_kernel` (optional): the update of one element in C
      (:class:`StateKernelSource`) with :meth:`_state_kernel_scalars`: with
      ``impl="fused"`` a parameter whose state is stored in int8, int4 or
      bf16 then steps in one C pass over its codes (:func:`build_state_kernel`)
      instead of being decoded, stepped by the kernel and encoded.

    The constructor validates the hyperparameters (top level and per param
    group), then uses ``impl`` if given or :func:`choose_implementation`.
    ``step`` gathers each group's tensors (:meth:`_group_tensors`) and
    keywords (:meth:`_kernel_options`, by default the group's config fields)
    and calls the chosen kernel once per group. Override those two hooks for
    other state (e.g. a step counter) or packed hyperparameters; keep what
    they build inside ``step`` traceable by ``torch.compile`` (tuples,
    named tuples and dicts, not frozen attrs classes). Do not name a
    method ``_init_group``: ``torch.compile`` calls a method of that name
    eagerly and takes its result as a constant (torch's optimizers return
    flags such as ``has_complex``), so one returning tensors crashes tracing.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword).
        impl: an implementation name, or None to choose the fastest
            supported one by measurement (cached per process).
        **hparams: the algorithm's other hyperparameters.

    Raises:
        HyperparameterError: an unknown keyword, a bad value, or an ``impl``
            (field ``impl``) that does not exist or cannot run ``params``.
    """

    implementations: ClassVar[Mapping[str, Kernel]] = {}
    supports: ClassVar[Mapping[str, Supports]] = {}
    priorities: ClassVar[Mapping[str, int]] = {}
    descriptions: ClassVar[Mapping[str, str]] = {}
    compiled: ClassVar[frozenset[str]] = frozenset()
    zero_state: ClassVar[tuple[str, ...]] = ()
    state_kernel: ClassVar[StateKernelSource | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for table in ("supports", "priorities", "descriptions"):
            unknown = set(getattr(cls, table)) - set(cls.implementations)
            if unknown:
                raise TypeError(
                    f"{cls.__qualname__}.{table} names {sorted(unknown)}, which are not in "
                    f"its implementations ({sorted(cls.implementations)})"
                )

    @accepts_prepared
    def __init__(
        self,
        params: Iterable[Any] | Prepared,
        lr: Any = UNSET,
        *,
        impl: str | None = None,
        **hparams: Any,
    ) -> None:
        if not self.implementations:
            raise TypeError(f"{type(self).__qualname__} declares no implementations")
        made = prepare(type(self), params, lr, impl, hparams)
        self._impl = str(made.impl)
        super().__init__(made.params, attrs.asdict(made.config, recurse=False))
        self._tuning = made.tuning

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """This class's implementations as records, one per entry of :attr:`implementations`.

        Args:
            target: ``"module:Class"`` naming this class, for records a
                registry keeps (lazy, picklable factories); None gives
                factories bound to the class itself.

        Returns:
            One :class:`~optiplug.ImplementationSpec` per implementation;
            each factory builds this class forced to it.
        """
        return tuple(
            ImplementationSpec(
                cls.algorithm,
                name,
                lazy(target, impl=name) if target else functools.partial(cls, impl=name),
                supports=cls.supports.get(name),
                priority=cls.priorities.get(name, 0),
                description=cls.descriptions.get(name, ""),
                compiles=name in cls.compiled,
            )
            for name in cls.implementations
        )

    @classmethod
    def implementation_names(cls) -> frozenset[str]:
        """The keys of :attr:`implementations`."""
        return frozenset(cls.implementations)

    @property
    def impl(self) -> str:
        """The implementation in use (a key of :attr:`implementations`).

        While ``impl=None`` measures in the background, the one that runs
        meanwhile; the measured one once the measurement is done.
        """
        self._take_measured_choice()
        return self._impl

    def switch_implementation(self, name: str) -> None:
        """Run kernel ``name`` from the next step on (every kernel shares the state layout)."""
        if name not in self.implementations:
            raise KeyError(name)
        self._impl = name

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus the implementation."""
        return {**super().__getstate__(), "_impl": self._impl}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore, keeping the implementation (``loop`` or the first for old pickles)."""
        super().__setstate__(state)
        if "_impl" not in self.__dict__:
            self._impl = (
                "loop" if "loop" in self.implementations else next(iter(self.implementations))
            )

    def _group_tensors(self, group: dict[str, Any]) -> tuple[list[torch.Tensor], ...]:
        """The kernel's tensor lists for one param group.

        By default ``(params, grads, *zero_state lists)`` over the
        parameters that have a gradient, creating missing state as zeros.

        Args:
            group: one of ``self.param_groups``.

        Returns:
            The positional arguments of the kernel; the first list empty
            means there is nothing to update.

        Raises:
            RuntimeError: a sparse gradient or a complex parameter.
        """
        params: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        slots: dict[str, list[torch.Tensor]] = {name: [] for name in self.zero_state}
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if torch.is_complex(param):
                raise RuntimeError(f"{type(self).__name__} does not support complex parameters")
            state = self.state[param]
            for name, tensors in slots.items():
                if name not in state:
                    state[name] = torch.zeros_like(param, memory_format=torch.preserve_format)
                tensors.append(state[name])
            params.append(param)
            grads.append(param.grad)
        return (params, grads, *slots.values())

    def _kernel_options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The kernel's keywords for one param group: by default its config fields.

        Args:
            group: one of ``self.param_groups``.

        Returns:
            Keyword arguments of the kernel.
        """
        return {field.name: group[field.name] for field in attrs.fields(self.config_class)}

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step: the chosen kernel through :attr:`step_pipeline`.

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        self._take_measured_choice()
        loss = closure_loss(closure)
        run_pipeline(self, self.step_pipeline, _kernel_update)
        return loss

    def _state_kernel_scalars(self, group: dict[str, Any]) -> Mapping[str, float] | None:
        """The scalars :attr:`state_kernel` reads for ``group``; None declines the C step.

        Override it with :attr:`state_kernel` (the base has no scalars to give).

        Args:
            group: one of ``self.param_groups``.
        """
        return None

    def stored_state_step(self, group: dict[str, Any], param: torch.Tensor) -> bool:
        """Step ``param`` on its stored state by :attr:`state_kernel`; False changes nothing.

        It applies with ``impl="fused"`` (``loop`` and ``foreach`` keep the
        kernels' own arithmetic on the decoded state), a float32 CPU
        parameter with a dense gradient, every slot already stored in the
        group's ``state_precision`` (otherwise the decoding path converts
        it), and scalars from :meth:`_state_kernel_scalars`.
        """
        source = self.state_kernel
        if source is None or self._impl != "fused" or torch.compiler.is_compiling():
            return False
        state = self.state.get(param)
        if not state:  # the first step creates it (and asks for the codec's C loops first)
            return False
        slots = [state.get(name) for name in source.slots]
        grad = param.grad
        scalars = self._state_kernel_scalars(group)
        # never waits: None while it builds in the background, and the decoding path steps
        kernel = state_kernel_or_none(source, wait=False) if scalars is not None else None
        precision = group_precision(group)
        if kernel is None or grad is None or not kernel.applies(param, grad, slots, precision):
            return False
        kernel.step(param, grad, slots, scalars)  # type: ignore[arg-type]  # applies() checked them
        return True

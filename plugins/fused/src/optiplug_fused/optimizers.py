"""The ``triton`` implementations: torch optimizers whose step is a few multi-tensor launches.

Each class keeps its algorithm's hyperparameters (validated by the
algorithm's own config class, looked up in the registry) and state slot
names, so state dicts move between this and the algorithm's other
implementations. State tensors are fp32 whatever the parameter dtype
(fp32, bf16 or fp16); ``step`` (Adam) is a 0-d fp32 tensor on the
parameter's device.

Per param group, the tensors are split into buckets of one (device, dtype,
16-byte alignment); each bucket's pointer table (:mod:`optiplug_fused.kernels`)
is built on the first step and kept. A step first checks, in C-level passes
over the group, that every parameter is the object, with the storage
address, the table was built from, that the settings deciding the table's
columns (:meth:`TritonOptimizer._column_key`) are unchanged, and that every
gradient is the object last seen (held by weak reference: gradients are
never kept alive); then it launches at once, each bucket with its device
made current. New gradient tensors of the same parameters (torch's default
``zero_grad`` sets them to None and backward recreates them) only repoint
the table's gradient column: their addresses are written into the bucket's
pinned host buffer and copied to the device asynchronously, when they
moved. Gradients with their parameter's strides (``channels_last`` ones
included) take the row as they are. A parameter gaining or losing its
gradient, ``add_param_group``, ``load_state_dict`` and ``param.data = ...``
rebuild the table, into the old table's device memory when the size is the
same (a captured CUDA graph stays valid). Before any table is rebuilt, every
parameter and gradient of every group to rebuild is checked (dense,
float32/bfloat16/float16, the parameter's device and shape, no storage
shared between parameters): a step refused for one of them creates no state
and moves no parameter, in any group. Replacing a state tensor is not
detected: call :meth:`TritonOptimizer.refresh` after doing so.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import attrs
import torch
from torch import Tensor

import optiplug
from optiplug.base import closure_loss, validated_config
from optiplug.errors import HyperparameterError, OptimizerUnavailableError

from . import kernels
from .availability import triton_supported, unavailable_reason

__all__ = ["TritonAdam", "TritonAdamW", "TritonLion", "TritonOptimizer", "TritonSGD"]

_UNSET: Any = object()
_GRAD = operator.attrgetter("grad")
_DTYPE = operator.attrgetter("dtype")
_DEVICE = operator.attrgetter("device")
_LOW_PRECISION = (torch.bfloat16, torch.float16)


class _Gone:
    """An object that no longer exists: its weak reference stands for a missing gradient."""


_NO_GRAD = weakref.ref(_Gone())
_DEREF = weakref.ReferenceType.__call__


@dataclass
class _Bucket:
    """The tensors of one group on one device with one dtype and alignment, and their table.

    Gradients are referred to by address only (never kept alive). The
    gradient column is repointed from ``staging``, a host buffer owned by the
    bucket (pinned for a CUDA bucket, so the copy is asynchronous): it is
    rewritten only once the previous copy from it has completed (``copied``),
    and never again once a repoint was captured in a CUDA graph (replays copy
    from it): a later repoint takes a new buffer.
    """

    device: torch.device
    dtype: torch.dtype
    aligned: bool
    strides: list[tuple[int, ...]]
    """Each row's parameter strides: a gradient with these takes the row as it is."""
    rows: Tensor
    blocks: Tensor
    count: int
    num_blocks: int
    fresh: bool
    indices: list[int]
    """Position in the group's ``params`` of each row."""
    grad_ptrs: list[int]
    block: int
    num_warps: int
    seed: int
    """The stochastic-rounding seed of this bucket (mixes in the bucket's position)."""
    keep: list[Tensor] = field(default_factory=list)
    """Every tensor but the gradients whose address is in the table, kept alive with it."""
    staging: Tensor | None = None
    copied: Any = None
    """A CUDA event recorded after the last copy from ``staging``, or None."""
    captured: bool = False
    graphed: bool = False
    """A repoint was captured: replays rewrite the column, so eager steps always repoint."""
    retired: list[Tensor] = field(default_factory=list)
    """Staging buffers a captured graph copies from: kept alive, never rewritten."""

    def new_grad_ptrs(self, grads: list[Tensor | None]) -> list[int] | None:
        """The addresses of ``grads`` for this bucket's rows; None if one cannot take its row."""
        new = list(map(grads.__getitem__, self.indices))
        if _present(new) != len(new):
            return None
        present: list[Tensor] = new  # type: ignore[assignment]  # no None, checked above
        if set(map(_DTYPE, present)) != {self.dtype} or set(map(_DEVICE, present)) != {self.device}:
            return None  # a rebuild checks it, or copies it to the parameter's dtype
        try:
            strides = list(map(Tensor.stride, present))
        except RuntimeError:  # sparse gradients have no strides
            return None
        if strides != self.strides and not all(
            s == own or g.numel() <= 1
            for g, s, own in zip(present, strides, self.strides, strict=True)
        ):
            return None  # another layout than the parameter's: a rebuild copies it
        ptrs = list(map(Tensor.data_ptr, present))
        if self.aligned and any(map((15).__and__, ptrs)):
            return None
        return ptrs

    def set_grad_ptrs(self, ptrs: list[int], force: bool = False) -> None:
        """Point the gradient column at ``ptrs``: an asynchronous copy, when they moved or forced."""
        if ptrs == self.grad_ptrs and not force:
            return
        with _device_guard(self.device):  # the event and the capture check: this device's
            self._copy_grad_ptrs(ptrs)
        self.grad_ptrs = ptrs

    def _copy_grad_ptrs(self, ptrs: list[int]) -> None:
        """Write ``ptrs`` into the staging buffer, then copy it into the gradient column."""
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        staging = self._staging(capturing)
        staging.copy_(torch.tensor(ptrs, dtype=torch.int64))
        self.rows[:, kernels.COL_GRAD].copy_(staging, non_blocking=True)
        if capturing:
            self.captured = self.graphed = True  # replays copy from this buffer: never rewritten
        elif self.device.type == "cuda":
            if self.copied is None:
                self.copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.copied.record()

    def _staging(self, capturing: bool) -> Tensor:
        """The host buffer to repoint from, free to be rewritten."""
        if self.staging is None or self.captured:
            if self.staging is not None:
                self.retired.append(self.staging)
            self.staging = _staging_buffer(self.device, self.count)
            self.copied, self.captured = None, False
        elif self.copied is not None and not capturing and not self.copied.query():
            self.copied.synchronize()  # the previous step's copy (long done in practice)
        return self.staging


@dataclass
class _Member:
    """One parameter's row while a table is built."""

    position: int
    row: list[int]
    fresh: bool
    param: Tensor
    grad: Tensor
    states: list[Tensor]


@dataclass
class _Plan:
    """One param group's buckets and what they were built from (gradients by weak reference)."""

    params: list[Tensor]
    param_ptrs: list[int]
    grad_refs: tuple[list[weakref.ReferenceType[Any]], _Watch]
    """Weak references to the gradients last seen, and what notices one dying."""
    buckets: list[_Bucket]
    volatile: bool
    with_grad: int
    """How many parameters had a gradient."""
    columns: tuple[Any, ...]
    """What decides the table's columns (:meth:`TritonOptimizer._column_key`)."""

    def same_params(self, params: list[Tensor], columns: tuple[Any, ...]) -> bool:
        """Whether ``params`` are the objects and storages the table was built from."""
        return (
            not self.volatile
            and columns == self.columns
            and len(params) == len(self.params)
            and all(map(operator.is_, params, self.params))
            and list(map(Tensor.data_ptr, params)) == self.param_ptrs
        )

    def same_grads(self, grads: list[Tensor | None]) -> bool:
        """Whether ``grads`` are the very objects the table was built from."""
        refs, watch = self.grad_refs
        return not watch.dead and all(map(operator.is_, grads, map(_DEREF, refs)))

    @property
    def graphed(self) -> bool:
        """A CUDA graph captured a repoint of this table (replays rewrite its gradient column)."""
        return any(bucket.graphed for bucket in self.buckets)

    def refresh_grads(self, grads: list[Tensor | None], force: bool = False) -> bool:
        """Take new gradient tensors of the same parameters; False when a rebuild is needed."""
        if _present(grads) != self.with_grad:
            return False
        updates = []
        for bucket in self.buckets:
            ptrs = bucket.new_grad_ptrs(grads)
            if ptrs is None:
                return False
            updates.append(ptrs)
        for bucket, ptrs in zip(self.buckets, updates, strict=True):
            bucket.set_grad_ptrs(ptrs, force)
        self.grad_refs = _weak(grads)
        return True


def _present(grads: list[Tensor | None]) -> int:
    """How many of ``grads`` are tensors (by identity: ``list.count`` calls ``Tensor.__eq__``)."""
    return len(grads) - sum(map(operator.is_, grads, itertools.repeat(None)))


class _Watch:
    """Called back when a watched gradient dies: the table may point at freed memory."""

    __slots__ = ("dead",)

    def __init__(self) -> None:
        self.dead = False

    def __call__(self, _: Any) -> None:
        self.dead = True


def _weak(grads: list[Tensor | None]) -> tuple[list[weakref.ReferenceType[Any]], _Watch]:
    """Weak references to ``grads`` (a dead one for None), watched together."""
    watch = _Watch()
    if _present(grads) == len(grads):
        return list(map(weakref.ref, grads, itertools.repeat(watch))), watch
    refs = [_NO_GRAD if g is None else weakref.ref(g, watch) for g in grads]
    return refs, watch


def _algorithm_config(algorithm: str, implemented: frozenset[str]) -> type:
    """The config class of ``algorithm`` as registered by the plugin that defines it.

    Raises:
        OptimizerUnavailableError: the algorithm declares no config class, or
            hyperparameters the kernels do not implement (they would be ignored).
    """
    config = optiplug.spec(algorithm).config
    if config is None:
        raise OptimizerUnavailableError(
            f"{algorithm}: the registered algorithm declares no config class; "
            "the triton implementation needs its hyperparameter fields"
        )
    missing = sorted({field.name for field in attrs.fields(config)} - implemented)
    if missing:
        raise OptimizerUnavailableError(
            f"{algorithm}: the triton implementation does not implement the hyperparameters "
            f"{', '.join(missing)} of the registered algorithm"
        )
    return config


def _check_full_precision(group: Mapping[str, Any], algorithm: str) -> None:
    """The kernels keep fp32 state: a group asking for another precision is refused.

    Raises:
        HyperparameterError: ``state_precision`` other than ``"fp32"``.
    """
    precision = group.get("state_precision", "fp32")
    if precision != "fp32":
        raise HyperparameterError(
            "state_precision",
            precision,
            "the triton kernels keep fp32 state; impl='fused', 'foreach' or 'loop' "
            "store it in bf16, int8 or int4",
            algorithm=algorithm,
        )


def _conform(value: Tensor, param: Tensor) -> Tensor:
    """``value`` as an fp32 tensor on ``param``'s device with ``param``'s strides."""
    if (
        value.dtype == torch.float32
        and value.device == param.device
        and value.shape == param.shape
        and (param.numel() <= 1 or value.stride() == param.stride())
    ):
        return value
    out = torch.empty_like(param, dtype=torch.float32)
    out.copy_(value)
    return out


def _step_tensor(value: Any, param: Tensor) -> Tensor:
    """A 0-d fp32 step counter on ``param``'s device."""
    if isinstance(value, Tensor):
        if value.dtype == torch.float32 and value.device == param.device and value.ndim == 0:
            return value
        return value.detach().to(device=param.device, dtype=torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32, device=param.device)


def _decay_factor(lr: float | Tensor, weight_decay: float) -> float:
    """``1 - lr * weight_decay`` for an lr read on the host; 1.0 for a device lr (the kernel's)."""
    if isinstance(lr, Tensor) and lr.device.type != "cpu":
        return 1.0
    return 1.0 - float(lr) * weight_decay


def _host_float(algorithm: str, name: str, value: Any) -> float:
    """A hyperparameter other than ``lr`` as a Python float, read without a device sync.

    Raises:
        HyperparameterError: ``value`` is a tensor off the CPU (reading it
            would synchronise with the device every step, and a CUDA graph
            would keep the value read at capture) or of more than one element.
    """
    if isinstance(value, Tensor) and (value.device.type != "cpu" or value.numel() != 1):
        raise HyperparameterError(
            name,
            value,
            "the triton kernels take this hyperparameter as a number: pass a float "
            "(or a one-element CPU tensor); only lr may be a tensor on the device",
            algorithm=algorithm,
        )
    return float(value)


def _ln(beta: float) -> float:
    """``log(beta)`` for the bias corrections (``-inf`` for 0)."""
    return math.log(beta) if beta > 0 else -math.inf


def _step_problem(param: Tensor, grad: Tensor) -> str | None:
    """What keeps the kernels from stepping ``param`` with ``grad``, or None."""
    if not triton_supported([param]):
        return (
            f"the parameter is {_describe([param])}; the kernels need dense float32, bfloat16 "
            "or float16 tensors on a CUDA device (or on the CPU with TRITON_INTERPRET=1)"
        )
    if grad.layout is not torch.strided:
        return f"its gradient is sparse ({grad.layout}); the kernels need dense gradients"
    if not grad.dtype.is_floating_point:
        return f"its gradient has dtype {grad.dtype}; the kernels need real floating gradients"
    if grad.device != param.device:
        return f"its gradient is on {grad.device}, the parameter on {param.device}"
    if grad.shape != param.shape:
        return f"its gradient has shape {tuple(grad.shape)}"
    return None


def _describe(params: Sequence[Tensor]) -> str:
    kinds = sorted({f"{p.device.type}/{str(p.dtype).removeprefix('torch.')}" for p in params})
    return ", ".join(kinds) or "no tensors"


class TritonOptimizer(torch.optim.Optimizer):
    """Base of the ``triton`` implementations (see the module docstring).

    Subclasses set :attr:`algorithm` and :attr:`kernel_name` and define
    :meth:`_state_columns` (the state tensors of one parameter, in table
    order, created when missing) and :meth:`_kernel_arguments` (the update
    kernel's scalars and flags); :meth:`_before_update` runs any kernel that
    must precede the update.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword); a float or a
            0-d tensor (on the parameters' device, so a step needs no host
            sync and can be captured in a CUDA graph).
        impl: ``"triton"`` or None (this class is that implementation).
        stochastic_rounding: round the fp32 result to bfloat16 parameters
            stochastically (unbiased) instead of to nearest; float32
            parameters are unaffected, float16 ones are refused.
        **hparams: the algorithm's other hyperparameters, validated by its
            registered config class.

    Raises:
        HyperparameterError: an unknown keyword or a bad value (naming the
            field and value), an ``impl`` other than ``"triton"``, tensors
            the kernels cannot run, or ``stochastic_rounding`` with float16
            parameters.
        OptimizerUnavailableError: triton is missing, or there is no CUDA
            device and ``TRITON_INTERPRET`` is not ``"1"``.
    """

    algorithm: ClassVar[str] = ""
    kernel_name: ClassVar[str] = ""
    hyperparameters: ClassVar[frozenset[str]] = frozenset()
    """The config fields the kernel implements."""
    _step_supports_amp_scaling: ClassVar[bool] = True
    """torch.amp.GradScaler passes ``grad_scale``/``found_inf`` instead of unscaling itself."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: Any = _UNSET,
        *,
        impl: str | None = None,
        stochastic_rounding: bool = False,
        **hparams: Any,
    ) -> None:
        if impl not in (None, "triton"):
            raise HyperparameterError(
                "impl",
                impl,
                f"this class is the 'triton' implementation of {self.algorithm}; "
                f"use optiplug.create({self.algorithm!r}, ..., impl={impl!r}) for another",
                algorithm=self.algorithm,
            )
        if not isinstance(stochastic_rounding, bool):
            raise HyperparameterError(
                "stochastic_rounding",
                stochastic_rounding,
                "must be True or False",
                algorithm=self.algorithm,
            )
        if lr is not _UNSET:
            hparams["lr"] = lr
        params = list(params)
        config_class = _algorithm_config(self.algorithm, self.hyperparameters | {"state_precision"})
        config = validated_config(self.algorithm, config_class, params, hparams)
        self._plans: dict[int, _Plan] = {}
        self._stale_plans: dict[int, _Plan] = {}
        """Replaced tables, kept until rebuilt: their storage is reused in place."""
        self._aux: dict[torch.device, dict[str, Tensor]] = {}
        self.stochastic_rounding = stochastic_rounding
        self._seed = int(torch.randint(2, 2**31 - 1, ()).item())  # never 1: triton specialises 1
        super().__init__(params, attrs.asdict(config, recurse=False))  # checks each group

    # ------------------------------------------------------------ contract
    @property
    def impl(self) -> str:
        """The implementation: always ``"triton"``."""
        return "triton"

    def _all_params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _check_runnable(self) -> None:
        reason = unavailable_reason()
        tensors = self._all_params()
        if reason is not None and not (tensors and triton_supported(tensors)):
            raise OptimizerUnavailableError(
                f"{self.algorithm}: implementation 'triton' (plugin fused) is unavailable: {reason}"
            )
        if not triton_supported(tensors):
            raise HyperparameterError(
                "impl",
                "triton",
                "cannot run these parameters: needs dense float32/bfloat16/float16 tensors "
                "on a CUDA device (or on the CPU with TRITON_INTERPRET=1); got "
                + _describe(tensors),
                algorithm=self.algorithm,
            )
        if self.stochastic_rounding and any(p.dtype == torch.float16 for p in tensors):
            raise HyperparameterError(
                "stochastic_rounding",
                True,
                "rounds to bfloat16 only: the parameters include float16 tensors "
                "(float32 and bfloat16 are accepted)",
                algorithm=self.algorithm,
            )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group (as torch), forget the cached tables, check the kernels can run it.

        Args:
            param_group: the group dict, as ``torch.optim.Optimizer`` takes it.

        Raises:
            HyperparameterError: tensors the kernels cannot run (field
                ``impl``), a parameter repeated or sharing another's storage
                (``params``), or a hyperparameter other than ``lr`` given as
                a tensor off the CPU (naming it).
            OptimizerUnavailableError: triton or a CUDA device is missing.
        """
        super().add_param_group(param_group)
        self.refresh()
        try:
            self._check_runnable()
            _check_distinct(self.param_groups, self.algorithm)
            _check_full_precision(self.param_groups[-1], self.algorithm)
            self._kernel_arguments(self.param_groups[-1])  # every scalar readable on the host
        except (HyperparameterError, OptimizerUnavailableError):
            self.param_groups.pop()  # nothing half-added
            raise

    def refresh(self) -> None:
        """Mark every pointer table stale; the next step rebuilds them.

        A rebuilt table of the same size (same buckets, tensors and blocks)
        is written into the old table's device memory, so a CUDA graph
        captured over it stays valid. Needed only after replacing the storage
        of a state tensor (``state["exp_avg"] = ...``); everything else,
        ``param.data = ...`` included, is detected.
        """
        self._stale_plans.update(self._plans)
        self._plans = {}

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus the stochastic-rounding settings (never the tables)."""
        state: dict[str, Any] = super().__getstate__()
        return {
            **state,
            "stochastic_rounding": self.stochastic_rounding,
            "_seed": self._seed,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore; the tables are rebuilt on the next step (in place when of the same size).

        torch's ``load_state_dict`` ends here too: the tables it leaves are
        kept as stale, so their storage is reused.
        """
        stale = {**self.__dict__.get("_stale_plans", {}), **self.__dict__.get("_plans", {})}
        super().__setstate__(state)
        self._plans = {}
        self._stale_plans = stale
        self._aux = {}
        self.__dict__.setdefault("stochastic_rounding", False)
        self.__dict__.setdefault("_seed", 0)

    # ------------------------------------------------------------ state
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Validate, then load ``state_dict`` all-or-nothing, keeping fp32 state.

        Validation is optiplug's (:func:`optiplug.load_state_dict`), which
        checks state against the algorithm's declared slots, whose dtype is
        the parameter's. This implementation keeps fp32 state for bf16/fp16
        parameters, so such state is validated as if in the parameter's
        dtype and then loaded at full precision. A state dict of another
        implementation (state in the parameter's dtype, ``step`` on the CPU)
        is converted to fp32 state and a device ``step``.

        Args:
            state_dict: as returned by ``state_dict()`` here or by another
                implementation of the algorithm.

        Raises:
            StateDictError: with ``.problems``; nothing changed.
        """
        params = self._all_params()
        normalized, originals = _as_param_dtypes(state_dict, params, self.param_groups)
        device_lrs = [group["lr"] for group in self.param_groups]
        optiplug.load_state_dict(self, normalized)
        for group, lr in zip(self.param_groups, device_lrs, strict=True):
            _keep_lr_tensor(group, lr)
        for position, saved in originals.items():
            param = params[position]
            for key, value in saved.items():
                self.state[param][key] = value.detach().to(
                    device=param.device, dtype=torch.float32, copy=True
                )
        for param in params:
            if param in self.state:
                self._conform_state(param, self.state[param])
        self.refresh()

    def _conform_state(self, param: Tensor, state: dict[str, Any]) -> None:
        """Make loaded state what the kernels read: fp32 tensors like ``param``."""
        for key, value in list(state.items()):
            if key == "step":
                state[key] = _step_tensor(value, param)
            elif isinstance(value, Tensor) and value.shape == param.shape:
                state[key] = _conform(value, param)

    def _state_columns(
        self, param: Tensor, state: dict[str, Any], group: Mapping[str, Any]
    ) -> tuple[list[Tensor | None], bool]:
        """The state tensors of one parameter in table order (created if missing); fresh flag."""
        raise NotImplementedError

    # ------------------------------------------------------------ tables
    def _aux_tensors(self, device: torch.device) -> dict[str, Tensor]:
        """Per device: a placeholder pointer and the stochastic-rounding counter."""
        aux = self._aux.get(device)
        if aux is None:
            aux = {
                "dummy": torch.zeros(1, dtype=torch.float32, device=device),
                "counter": torch.zeros(1, dtype=torch.int64, device=device),
            }
            self._aux[device] = aux
        return aux

    def _step_plans(self) -> list[_Plan]:
        """Every group's table; stale ones are rebuilt once every group's tensors passed checks.

        Raises:
            HyperparameterError: a parameter or gradient the kernels cannot run
                (field ``impl``), or parameters sharing storage (``params``);
                no state was created and nothing changed.
        """
        plans: dict[int, _Plan] = {}
        stale: list[tuple[int, dict[str, Any], list[Tensor], list[Tensor | None]]] = []
        for index, group in enumerate(self.param_groups):
            params: list[Tensor] = group["params"]
            grads: list[Tensor | None] = list(map(_GRAD, params))
            current = self._plans.get(index)
            if (
                current is not None
                and current.same_params(params, self._column_key(group))
                and _repoint(current, grads)
            ):
                plans[index] = current
            else:
                stale.append((index, group, params, grads))
        if stale:
            _check_distinct(self.param_groups, self.algorithm)
        for index, _, params, grads in stale:
            self._check_step_tensors(index, params, grads)
        for index, group, params, grads in stale:
            previous = self._plans.get(index) or self._stale_plans.pop(index, None)
            plan = self._build(index, group, params, grads, previous)
            plans[index] = self._plans[index] = plan
        return [plans[index] for index in range(len(self.param_groups))]

    def _column_key(self, group: Mapping[str, Any]) -> tuple[Any, ...]:
        """The group settings that decide which state columns the table holds."""
        return ()

    def _check_step_tensors(
        self, index: int, params: list[Tensor], grads: list[Tensor | None]
    ) -> None:
        """Refuse, before any state exists, a parameter or gradient the kernels cannot run.

        Raises:
            HyperparameterError: field ``impl``, naming the parameter's
                position and what is wrong with it.
        """
        for position, (param, grad) in enumerate(zip(params, grads, strict=True)):
            if grad is None:
                continue
            problem = _step_problem(param, grad)
            if problem is not None:
                where = f"parameter {position} of param group {index} (shape {tuple(param.shape)})"
                raise HyperparameterError(
                    "impl",
                    "triton",
                    f"cannot step {where}: {problem}; nothing was changed",
                    algorithm=self.algorithm,
                )

    def _build(
        self,
        index: int,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor | None],
        previous: _Plan | None,
    ) -> _Plan:
        """Group ``index``'s table; a bucket of ``previous``'s size is rewritten in place."""
        members: dict[tuple[torch.device, torch.dtype, bool], list[_Member]] = {}
        volatile = False
        for position, (param, grad) in enumerate(zip(params, grads, strict=True)):
            if grad is None:
                continue
            if grad.dtype != param.dtype or (param.numel() > 1 and grad.stride() != param.stride()):
                grad = torch.empty_like(param).copy_(grad)  # a copy: rebuilt every step
                volatile = True
            columns, fresh = self._state_columns(param, self.state[param], group)
            states = [t for t in columns if t is not None]
            shaped = [param, grad, *(t for t in states if t.shape == param.shape)]
            aligned = param.numel() % 8 == 0 and all(t.data_ptr() % 16 == 0 for t in shaped)
            row = [param.numel(), param.data_ptr(), grad.data_ptr()]
            row += [0 if t is None else t.data_ptr() for t in columns]
            row += [0] * (kernels.ROW - 1 - len(row)) + [1 if fresh else 0]
            kept = states if grad is grads[position] else [*states, grad]  # our copy, not theirs
            member = _Member(position, row, fresh, param, grad, kept)
            members.setdefault((param.device, param.dtype, aligned), []).append(member)
        reusable = {} if previous is None else {_reuse_key(b): b for b in previous.buckets}
        buckets = []
        for number, (key, entries) in enumerate(members.items()):
            seed = _bucket_seed(self._seed, index, number)
            buckets.append(self._bucket(key, entries, seed, reusable))
        with_grad = _present(grads)
        param_ptrs = list(map(Tensor.data_ptr, params))
        key = self._column_key(group)
        return _Plan(list(params), param_ptrs, _weak(grads), buckets, volatile, with_grad, key)

    @staticmethod
    def _bucket(
        key: tuple[torch.device, torch.dtype, bool],
        entries: list[_Member],
        seed: int,
        reusable: dict[tuple[Any, ...], _Bucket],
    ) -> _Bucket:
        """A bucket's table: new device tensors, or an old bucket's rewritten in place."""
        device, dtype, aligned = key
        block, num_warps = kernels.launch_config(device)
        rows = torch.tensor([entry.row for entry in entries], dtype=torch.int64)
        blocks = _block_table(rows[:, kernels.COL_NUMEL], block)
        old = reusable.pop((device, dtype, aligned, len(entries), len(blocks), block), None)
        if old is not None:  # same size: a CUDA graph captured over the old table stays valid
            old.rows.copy_(rows)
            old.blocks.copy_(blocks)
        return _Bucket(
            device=device,
            dtype=dtype,
            aligned=aligned,
            strides=[entry.param.stride() for entry in entries],
            rows=rows.to(device) if old is None else old.rows,
            blocks=blocks.to(device) if old is None else old.blocks,
            count=len(entries),
            num_blocks=len(blocks),
            fresh=any(entry.fresh for entry in entries),
            indices=[entry.position for entry in entries],
            grad_ptrs=[entry.row[kernels.COL_GRAD] for entry in entries],
            block=block,
            num_warps=num_warps,
            seed=seed,
            keep=[t for entry in entries for t in (entry.param, *entry.states)],
            staging=_staging_buffer(device, len(entries)) if old is None else old.staging,
            copied=None if old is None else old.copied,
            captured=False if old is None else old.captured,
            graphed=False if old is None else old.graphed,
            retired=[] if old is None else old.retired,
        )

    # ------------------------------------------------------------ step
    @torch.no_grad()
    def step(
        self,
        closure: Callable[[], Any] | None = None,
        *,
        grad_scale: Tensor | None = None,
        found_inf: Tensor | None = None,
    ) -> Any:
        """Perform one optimization step: per bucket, one launch (Adam: plus the step counters).

        Args:
            closure: re-evaluates the model and returns the loss (optional).
            grad_scale: gradients are divided by it (a 0-d/1-element tensor),
                as torch's fused optimizers do for ``torch.amp.GradScaler``.
            found_inf: when nonzero, nothing changes (parameters, state and
                ``step``); read on the device, never synchronised.

        Returns:
            The closure's loss, or None.

        Raises:
            HyperparameterError: a parameter or gradient the kernels cannot
                run (sparse, complex, another device or shape, a dtype other
                than float32/bfloat16/float16); raised before any state is
                created or any parameter updated, in any group.
        """
        loss = closure_loss(closure)
        if grad_scale is None:
            grad_scale = getattr(self, "grad_scale", None)
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        used: set[torch.device] = set()
        plans = self._step_plans()  # every check before any state or launch
        for group, plan in zip(self.param_groups, plans, strict=True):
            for bucket in plan.buckets:
                with _device_guard(bucket.device):  # triton launches on the current device
                    self._step_bucket(bucket, group, grad_scale, found_inf)
                used.add(bucket.device)
        if self.stochastic_rounding:
            for device in used:
                with _device_guard(device):
                    self._aux_tensors(device)["counter"].add_(1)
        return loss

    def _step_bucket(
        self,
        bucket: _Bucket,
        group: dict[str, Any],
        grad_scale: Tensor | None,
        found_inf: Tensor | None,
    ) -> None:
        """Launch one bucket's kernels, then clear its new-buffer flags (unless skipped)."""
        aux = self._aux_tensors(bucket.device)
        scale = _on(grad_scale, bucket.device)
        found = _on(found_inf, bucket.device)
        self._launch_bucket(bucket, group, aux, scale, found)
        if bucket.fresh:
            flags = bucket.rows[:, kernels.COL_FLAG]
            if found is None:
                flags.zero_()
            else:
                flags.mul_((found.reshape(()) != 0).to(torch.int64))
            bucket.fresh = found is not None

    def _launch_bucket(
        self,
        bucket: _Bucket,
        group: dict[str, Any],
        aux: dict[str, Tensor],
        scale: Tensor | None,
        found: Tensor | None,
    ) -> None:
        """Run the bucket's pre-launch kernels, then its update kernel (none for no blocks)."""
        self._before_update(bucket, aux, found)
        if bucket.num_blocks == 0:
            return
        launch, head, amp, constants = self._common(bucket, group, aux, scale, found)
        scalars, flags = self._kernel_arguments(group)
        launch(*head, *scalars, *amp, **flags, **constants)

    def _before_update(self, bucket: _Bucket, aux: dict[str, Tensor], found: Tensor | None) -> None:
        """Kernels that must run before the update, even for a bucket of no blocks (none here)."""

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The update kernel's algorithm scalars (after lr) and its algorithm flags."""
        raise NotImplementedError

    def _common(
        self,
        bucket: _Bucket,
        group: dict[str, Any],
        aux: dict[str, Tensor],
        scale: Tensor | None,
        found: Tensor | None,
    ) -> tuple[Any, tuple[Any, ...], tuple[Any, ...], dict[str, Any]]:
        """Launch pieces shared by every kernel: lr, the AMP pointers, the rounding, constants."""
        lr = group["lr"]
        dummy = aux["dummy"]
        if isinstance(lr, Tensor) and lr.device.type != "cpu":
            lr_ptr, lr_value, lr_tensor = _on(lr, bucket.device), 0.0, True
        elif isinstance(lr, Tensor) and bucket.device.type == "cpu":
            lr_ptr, lr_value, lr_tensor = lr, 0.0, True  # the interpreter reads it in place
        else:  # a float, or a CPU tensor read on the host (no copy to the device, no sync)
            lr_ptr, lr_value, lr_tensor = dummy, float(lr), False
        stochastic = self.stochastic_rounding and bucket.dtype == torch.bfloat16
        amp = (
            dummy if scale is None else scale,
            dummy if found is None else found,
            aux["counter"],
            bucket.seed,
        )
        constants = {
            "P_DTYPE": kernels.TRITON_DTYPES[str(bucket.dtype).removeprefix("torch.")],
            "BLOCK": bucket.block,
            "ALIGNED": bucket.aligned,
            "LR_TENSOR": lr_tensor,
            "HAS_SCALE": scale is not None,
            "HAS_INF": found is not None,
            "STOCHASTIC": stochastic,
            "ROUND_BF16": bucket.dtype == torch.bfloat16,
        }
        interpret = bucket.device.type != "cuda"
        launch = kernels.kernel(self.kernel_name, interpret)
        grid = (bucket.num_blocks,)
        options = _launch_options(interpret, bucket.num_warps)
        return (
            launch[grid],
            (bucket.blocks, bucket.rows, lr_ptr, lr_value),
            amp,
            {
                **constants,
                **options,
            },
        )


def _launch_options(interpret: bool, num_warps: int) -> dict[str, Any]:
    """Compiler options of a launch: none for the interpreter.

    FMA contraction is requested explicitly (triton's default, which it now
    warns about relying on): torch's own CUDA kernels contract too, and the
    tests' tolerances allow one rounding per contracted operation.
    """
    return {} if interpret else {"num_warps": num_warps, "enable_fp_fusion": True}


def _keep_lr_tensor(group: dict[str, Any], old: Any) -> None:
    """Keep the group's device lr tensor object, taking the loaded value (graphs read it)."""
    new = group["lr"]
    if (
        isinstance(old, Tensor)
        and old.device.type != "cpu"
        and isinstance(new, (Tensor, float, int))
        and not isinstance(new, bool)
        and (not isinstance(new, Tensor) or new.numel() == old.numel())
    ):
        with torch.no_grad():
            if isinstance(new, Tensor):
                old.copy_(new.detach().reshape(old.shape))
            else:
                old.fill_(new)
        group["lr"] = old


def _repoint(plan: _Plan, grads: list[Tensor | None]) -> bool:
    """Point ``plan`` at ``grads``; False when the group's table must be rebuilt.

    After a CUDA graph captured a repoint, replays write the captured
    addresses into the table, so an eager step always rewrites them.
    """
    if plan.graphed and not torch.cuda.is_current_stream_capturing():
        return plan.refresh_grads(grads, force=True)
    return plan.same_grads(grads) or plan.refresh_grads(grads)


def _staging_buffer(device: torch.device, count: int) -> Tensor:
    """A host buffer for ``count`` addresses: pinned for a CUDA bucket (asynchronous copies).

    Allocated when the table is built, never inside a CUDA-graph capture.
    """
    return torch.empty(count, dtype=torch.int64, pin_memory=device.type == "cuda")


def _device_guard(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make ``device`` current for a CUDA bucket (triton launches on the current device)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _reuse_key(bucket: _Bucket) -> tuple[Any, ...]:
    """What a rebuilt bucket must match to be written into ``bucket``'s table in place."""
    return (
        bucket.device,
        bucket.dtype,
        bucket.aligned,
        bucket.count,
        bucket.num_blocks,
        bucket.block,
    )


def _block_table(numels: Tensor, block: int) -> Tensor:
    """One int64 per program: ``tensor index << 32 | chunk`` for ``block``-element chunks."""
    counts = torch.div(numels + block - 1, block, rounding_mode="floor")
    total = int(counts.sum())
    owner = torch.repeat_interleave(torch.arange(len(numels), dtype=torch.int64), counts)
    first = torch.cumsum(counts, 0) - counts
    chunk = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(first, counts)
    return (owner << 32) | chunk


def _bucket_seed(seed: int, group: int, number: int) -> int:
    """The rounding seed of bucket ``number`` of group ``group``: distinct bits per bucket.

    A splitmix64 finaliser of the three, kept odd (never 1, never a multiple
    of 16: triton specialises such integer arguments, one more compile) and
    below 2**31 (an i32 argument).
    """
    x = (seed + 0x9E3779B97F4A7C15 * (1 + group * 0x10001 + number)) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 31)) & 0x7FFFFFFF
    return x | 1 if x > 1 else 3


def _check_distinct(groups: Sequence[Mapping[str, Any]], algorithm: str) -> None:
    """Refuse parameters that share storage: two programs would update it at once.

    Raises:
        HyperparameterError: field ``params``, naming both positions.
    """
    seen: dict[int, tuple[int, int]] = {}
    for index, group in enumerate(groups):
        for position, param in enumerate(group["params"]):
            if param.numel() == 0:
                continue
            where = seen.setdefault(param.data_ptr(), (index, position))
            if where != (index, position):
                raise HyperparameterError(
                    "params",
                    f"parameter {position} of param group {index}",
                    f"shares its storage with parameter {where[1]} of param group {where[0]} "
                    "(a repeated or tied parameter): the fused kernels would update it twice "
                    "at once; pass each parameter once",
                    algorithm=algorithm,
                )


def _on(value: Tensor | None, device: torch.device) -> Tensor | None:
    if value is None:
        return None
    return value if value.device == device else value.to(device)


def _names(groups: Sequence[Any]) -> list[Any] | None:
    """Every parameter name of ``groups`` in order, or None unless every group has names."""
    names: list[Any] = []
    for group in groups:
        found = group.get("param_names") if isinstance(group, Mapping) else None
        if found is None:
            return None
        names.extend(found)
    return names


def _as_param_dtypes(
    state_dict: Any, params: Sequence[Tensor], groups: Sequence[Mapping[str, Any]]
) -> tuple[Any, dict[int, dict[str, Tensor]]]:
    """A shallow copy of ``state_dict`` with fp32 state of low-precision parameters cast down.

    Saved entries are matched to ``params`` as optiplug's loading matches
    them: by name when both sides name every parameter, else by position.

    Returns:
        ``(the copy, {parameter position: {key: original fp32 value}})``;
        the dict itself when there is nothing to cast or it is malformed
        (validation then reports it).
    """
    if not isinstance(state_dict, Mapping):
        return state_dict, {}
    saved_state, saved_groups = state_dict.get("state"), state_dict.get("param_groups")
    if not isinstance(saved_state, Mapping) or not isinstance(saved_groups, (list, tuple)):
        return state_dict, {}
    ids = [i for g in saved_groups if isinstance(g, Mapping) for i in g.get("params", ())]
    positions = list(range(min(len(ids), len(params))))
    saved_names, own_names = _names(saved_groups), _names(groups)
    if saved_names is not None and own_names is not None:
        where = {name: index for index, name in enumerate(own_names)}
        positions = [where.get(name, -1) for name in saved_names[: len(ids)]]
    originals: dict[int, dict[str, Tensor]] = {}
    new_state = dict(saved_state)
    for saved_id, position in zip(ids, positions, strict=False):
        entry = saved_state.get(saved_id)
        if not 0 <= position < len(params) or not isinstance(entry, Mapping):
            continue
        param = params[position]
        if param.dtype not in _LOW_PRECISION:
            continue
        cast: dict[str, Any] = dict(entry)
        for key, value in entry.items():
            if (
                key != "step"
                and isinstance(value, Tensor)
                and value.dtype == torch.float32
                and value.shape == param.shape
            ):
                cast[key] = value.to(param.dtype)
                originals.setdefault(position, {})[key] = value
        new_state[saved_id] = cast
    if not originals:
        return state_dict, {}
    return {**state_dict, "state": new_state}, originals


class _AdamBase(TritonOptimizer):
    kernel_name = "adam"
    hyperparameters = frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"})
    decoupled: ClassVar[bool] = False

    def _state_columns(
        self, param: Tensor, state: dict[str, Any], group: Mapping[str, Any]
    ) -> tuple[list[Tensor | None], bool]:
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        else:
            state["step"] = _step_tensor(state["step"], param)
        names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
        for name in names:
            if name not in state:
                state[name] = torch.zeros_like(param, dtype=torch.float32)
            else:
                state[name] = _conform(state[name], param)
        vmax = state["max_exp_avg_sq"] if group["amsgrad"] else None
        return [state["exp_avg"], state["exp_avg_sq"], vmax, state["step"]], False

    def _before_update(self, bucket: _Bucket, aux: dict[str, Tensor], found: Tensor | None) -> None:
        """Advance the ``step`` counters (skipped on ``found_inf``), blocks or not."""
        interpret = bucket.device.type != "cuda"
        step_kernel = kernels.kernel("step", interpret)
        step_grid = (triton_cdiv(bucket.count, kernels.STEP_BLOCK),)
        step_kernel[step_grid](
            bucket.rows,
            bucket.count,
            aux["dummy"] if found is None else found,
            COLUMN=kernels.COL_STATE + 3,
            BLOCK=kernels.STEP_BLOCK,
            HAS_INF=found is not None,
            **_launch_options(interpret, 4),
        )

    def _column_key(self, group: Mapping[str, Any]) -> tuple[Any, ...]:
        """AMSGrad adds the ``max_exp_avg_sq`` column."""
        return (bool(group["amsgrad"]),)

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        beta1, beta2 = (_host_float(self.algorithm, "betas", b) for b in group["betas"])
        weight_decay = _host_float(self.algorithm, "weight_decay", group["weight_decay"])
        scalars = (
            beta2,
            1.0 - beta1,
            1.0 - beta2,
            _ln(beta1),
            _ln(beta2),
            _host_float(self.algorithm, "eps", group["eps"]),
            weight_decay,
            _decay_factor(group["lr"], weight_decay),
        )
        flags = {
            "DECOUPLED": self.decoupled,
            "HAS_WD": weight_decay != 0,
            "AMSGRAD": bool(group["amsgrad"]),
            "MAXIMIZE": bool(group["maximize"]),
        }
        return scalars, flags


def triton_cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints."""
    return -(-a // b)


class TritonAdam(_AdamBase):
    """Adam (``torch.optim.Adam`` semantics: L2 weight decay, AMSGrad, maximize) in Triton.

    State per parameter: ``step`` (0-d fp32 on the parameter's device),
    ``exp_avg``, ``exp_avg_sq`` and, with ``amsgrad``, ``max_exp_avg_sq``
    (fp32). Hyperparameters as optiplug's ``adam``: ``lr``, ``betas``,
    ``eps``, ``weight_decay``, ``amsgrad``, ``maximize``; see
    :class:`TritonOptimizer` for the constructor.
    """

    algorithm = "adam"
    decoupled = False


class TritonAdamW(_AdamBase):
    """AdamW (``torch.optim.AdamW`` semantics: decoupled weight decay) in Triton.

    Same state and hyperparameters as :class:`TritonAdam` (weight decay
    default 1e-2, applied as ``p *= 1 - lr * weight_decay``); see
    :class:`TritonOptimizer` for the constructor.
    """

    algorithm = "adamw"
    decoupled = True
    hyperparameters = _AdamBase.hyperparameters | {"weight_decay_mode"}

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        mode = group.get("weight_decay_mode", "decoupled")
        if mode != "decoupled":  # checked when the group is added: nothing half-applied
            raise HyperparameterError(
                "weight_decay_mode",
                mode,
                "the triton kernel decays every coordinate ('decoupled'); "
                "impl='fused', 'foreach' or 'loop' implement 'cautious'",
                algorithm=self.algorithm,
            )
        return super()._kernel_arguments(group)


class TritonSGD(TritonOptimizer):
    """SGD (``torch.optim.SGD`` semantics: momentum, dampening, Nesterov, weight decay) in Triton.

    State per parameter, when ``momentum != 0``: ``momentum_buffer`` (fp32),
    initialised to the first gradient as torch does. See
    :class:`TritonOptimizer` for the constructor.
    """

    algorithm = "sgd"
    kernel_name = "sgd"
    hyperparameters = frozenset(
        {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}
    )

    def _state_columns(
        self, param: Tensor, state: dict[str, Any], group: Mapping[str, Any]
    ) -> tuple[list[Tensor | None], bool]:
        if not self._column_key(group)[0]:
            return [None], False
        buffer = state.get("momentum_buffer")
        if buffer is None:
            state["momentum_buffer"] = torch.zeros_like(param, dtype=torch.float32)
            return [state["momentum_buffer"]], True
        state["momentum_buffer"] = _conform(buffer, param)
        return [state["momentum_buffer"]], False

    def _column_key(self, group: Mapping[str, Any]) -> tuple[Any, ...]:
        """Momentum adds the ``momentum_buffer`` column."""
        return (_host_float(self.algorithm, "momentum", group["momentum"]) != 0,)

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        momentum = _host_float(self.algorithm, "momentum", group["momentum"])
        weight_decay = _host_float(self.algorithm, "weight_decay", group["weight_decay"])
        dampening = _host_float(self.algorithm, "dampening", group["dampening"])
        scalars = (momentum, 1.0 - dampening, weight_decay)
        flags = {
            "HAS_MOMENTUM": momentum != 0,
            "NESTEROV": bool(group["nesterov"]),
            "HAS_WD": weight_decay != 0,
            "MAXIMIZE": bool(group["maximize"]),
        }
        return scalars, flags


class TritonLion(TritonOptimizer):
    """Lion (as optiplug-lion: sign of interpolated momentum, decoupled weight decay) in Triton.

    State per parameter: ``exp_avg`` (fp32). Hyperparameters as optiplug's
    ``lion``: ``lr``, ``betas``, ``weight_decay``, ``maximize`` (and
    ``weight_decay_mode="decoupled"`` only); see
    :class:`TritonOptimizer` for the constructor.
    """

    algorithm = "lion"
    kernel_name = "lion"
    hyperparameters = frozenset({"lr", "betas", "weight_decay", "maximize", "weight_decay_mode"})

    def _state_columns(
        self, param: Tensor, state: dict[str, Any], group: Mapping[str, Any]
    ) -> tuple[list[Tensor | None], bool]:
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
        else:
            state["exp_avg"] = _conform(state["exp_avg"], param)
        return [state["exp_avg"]], False

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        mode = group.get("weight_decay_mode", "decoupled")
        if mode != "decoupled":  # checked when the group is added: nothing half-applied
            raise HyperparameterError(
                "weight_decay_mode",
                mode,
                "the triton kernel decays every coordinate ('decoupled'); "
                "impl='fused', 'foreach' or 'loop' implement 'cautious'",
                algorithm=self.algorithm,
            )
        beta1, beta2 = (_host_float(self.algorithm, "betas", b) for b in group["betas"])
        weight_decay = _host_float(self.algorithm, "weight_decay", group["weight_decay"])
        decay = _decay_factor(group["lr"], weight_decay)
        scalars = (beta1, 1.0 - beta1, 1.0 - beta2, weight_decay, decay)
        flags = {"HAS_WD": weight_decay != 0, "MAXIMIZE": bool(group["maximize"])}
        return scalars, flags

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
over the group (``param.grad`` of each, then an identity comparison), that
every parameter and gradient is the tensor object the table was built from:
then it launches at once, with no per-tensor Python work (gradients kept
between steps, ``zero_grad(set_to_none=False)``). New gradient tensors of
the same parameters (torch's default ``zero_grad`` sets them to None and
backward recreates them) only repoint the table's gradient column: their
addresses are read, and copied to the device when they moved. A parameter
gaining or losing its gradient, ``add_param_group`` and ``load_state_dict``
rebuild the table. Before any table is rebuilt, every parameter and gradient
of every group to rebuild is checked (dense, float32/bfloat16/float16, the
parameter's device and shape): a step refused for one of them creates no
state and moves no parameter, in any group. Replacing a parameter's or a state tensor's storage in
place (``param.data = ...``) is not detected: call :meth:`refresh` after
doing so.
"""

from __future__ import annotations

import math
import operator
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
_LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass
class _Bucket:
    """The tensors of one group on one device with one dtype and alignment, and their table."""

    device: torch.device
    dtype: torch.dtype
    aligned: bool
    contiguous: bool
    """Every parameter is contiguous (a contiguous gradient then has its layout)."""
    rows: Tensor
    blocks: Tensor
    count: int
    num_blocks: int
    fresh: bool
    indices: list[int]
    """Position in the group's ``params`` of each row."""
    grad_ptrs: list[int]
    keep: list[Tensor] = field(default_factory=list)
    """Every tensor but the gradients whose address is in the table, kept alive with it."""
    grads: list[Tensor] = field(default_factory=list)

    def new_grad_ptrs(self, grads: list[Tensor | None]) -> list[int] | None:
        """The addresses of ``grads`` for this bucket's rows; None if one cannot take its row."""
        new = [grads[i] for i in self.indices]
        if any(g is None for g in new) or not self.contiguous:
            return None
        present: list[Tensor] = new  # type: ignore[assignment]  # no None, checked above
        if any(g.dtype != self.dtype or g.device != self.device for g in present):
            return None  # a rebuild checks it, or copies it to the parameter's dtype
        try:
            if not all(map(Tensor.is_contiguous, present)):
                return None
        except RuntimeError:  # sparse gradients have no contiguity
            return None
        ptrs = list(map(Tensor.data_ptr, present))
        if self.aligned and any(ptr & 15 for ptr in ptrs):
            return None
        return ptrs

    def set_grads(self, grads: list[Tensor | None], ptrs: list[int]) -> None:
        """Point the gradient column at ``grads`` (one small host-to-device copy if moved)."""
        self.grads = [grads[i] for i in self.indices]  # type: ignore[misc]
        if ptrs != self.grad_ptrs:
            column = torch.tensor(ptrs, dtype=torch.int64)
            self.rows[:, kernels.COL_GRAD].copy_(column)
            self.grad_ptrs = ptrs


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
    """One param group's buckets and what they were built from."""

    params: list[Tensor]
    grads: list[Tensor | None]
    buckets: list[_Bucket]
    volatile: bool
    with_grad: int
    """How many parameters had a gradient."""

    def same_params(self, params: list[Tensor]) -> bool:
        """Whether ``params`` are the very objects the table was built from."""
        return (
            not self.volatile
            and len(params) == len(self.params)
            and all(map(operator.is_, params, self.params))
        )

    def same_grads(self, grads: list[Tensor | None]) -> bool:
        """Whether ``grads`` are the very objects the table was built from."""
        return all(map(operator.is_, grads, self.grads))

    def refresh_grads(self, grads: list[Tensor | None]) -> bool:
        """Take new gradient tensors of the same parameters; False when a rebuild is needed."""
        if len(grads) - grads.count(None) != self.with_grad:
            return False
        updates = []
        for bucket in self.buckets:
            ptrs = bucket.new_grad_ptrs(grads)
            if ptrs is None:
                return False
            updates.append(ptrs)
        for bucket, ptrs in zip(self.buckets, updates, strict=True):
            bucket.set_grads(grads, ptrs)
        self.grads = grads
        return True


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
    """``1 - lr * weight_decay`` for a float lr; 1.0 for a tensor lr (the kernel computes it)."""
    return 1.0 if isinstance(lr, Tensor) else 1.0 - float(lr) * weight_decay


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
        config_class = _algorithm_config(self.algorithm, self.hyperparameters)
        config = validated_config(self.algorithm, config_class, params, hparams)
        self._plans: dict[int, _Plan] = {}
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
            HyperparameterError: tensors the kernels cannot run (field ``impl``).
            OptimizerUnavailableError: triton or a CUDA device is missing.
        """
        super().add_param_group(param_group)
        self.refresh()
        try:
            self._check_runnable()
        except (HyperparameterError, OptimizerUnavailableError):
            self.param_groups.pop()  # nothing half-added
            raise

    def refresh(self) -> None:
        """Forget every cached pointer table; the next step rebuilds them.

        Needed only after replacing the storage of a parameter or a state
        tensor in place (``param.data = ...``); everything else is detected.
        """
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
        """Restore; the tables are rebuilt on the next step."""
        super().__setstate__(state)
        self._plans = {}
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
        optiplug.load_state_dict(self, normalized)
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
                (field ``impl``); no state was created and nothing changed.
        """
        plans: dict[int, _Plan] = {}
        stale: list[tuple[int, dict[str, Any], list[Tensor], list[Tensor | None]]] = []
        for index, group in enumerate(self.param_groups):
            params: list[Tensor] = group["params"]
            grads: list[Tensor | None] = list(map(_GRAD, params))
            plan = self._plans.get(index)
            if (
                plan is not None
                and plan.same_params(params)
                and (plan.same_grads(grads) or plan.refresh_grads(grads))
            ):
                plans[index] = plan
            else:
                stale.append((index, group, params, grads))
        for index, _, params, grads in stale:
            self._check_step_tensors(index, params, grads)
        for index, group, params, grads in stale:
            plans[index] = self._plans[index] = self._build(group, params, grads)
        return [plans[index] for index in range(len(self.param_groups))]

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
        self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor | None]
    ) -> _Plan:
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
            member = _Member(position, row, fresh, param, grad, states)
            members.setdefault((param.device, param.dtype, aligned), []).append(member)
        buckets = [self._bucket(key, entries) for key, entries in members.items()]
        with_grad = len(grads) - grads.count(None)
        return _Plan(list(params), grads, buckets, volatile, with_grad)

    @staticmethod
    def _bucket(key: tuple[torch.device, torch.dtype, bool], entries: list[_Member]) -> _Bucket:
        device, dtype, aligned = key
        rows = torch.tensor([entry.row for entry in entries], dtype=torch.int64)
        counts = torch.div(
            rows[:, kernels.COL_NUMEL] + kernels.BLOCK - 1, kernels.BLOCK, rounding_mode="floor"
        )
        total = int(counts.sum())
        owner = torch.repeat_interleave(torch.arange(len(entries), dtype=torch.int64), counts)
        first = torch.cumsum(counts, 0) - counts
        chunk = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(first, counts)
        blocks = (owner << 32) | chunk
        return _Bucket(
            device=device,
            dtype=dtype,
            aligned=aligned,
            contiguous=all(entry.param.is_contiguous() for entry in entries),
            rows=rows.to(device),
            blocks=blocks.to(device),
            count=len(entries),
            num_blocks=total,
            fresh=any(entry.fresh for entry in entries),
            indices=[entry.position for entry in entries],
            grad_ptrs=[entry.row[kernels.COL_GRAD] for entry in entries],
            keep=[t for entry in entries for t in (entry.param, *entry.states)],
            grads=[entry.grad for entry in entries],
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
                used.add(bucket.device)
        if self.stochastic_rounding:
            for device in used:
                self._aux_tensors(device)["counter"].add_(1)
        return loss

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
        if isinstance(lr, Tensor):
            lr_ptr, lr_value, lr_tensor = _on(lr, bucket.device), 0.0, True
        else:
            lr_ptr, lr_value, lr_tensor = dummy, float(lr), False
        stochastic = self.stochastic_rounding and bucket.dtype == torch.bfloat16
        amp = (
            dummy if scale is None else scale,
            dummy if found is None else found,
            aux["counter"],
            self._seed,
        )
        constants = {
            "P_DTYPE": kernels.TRITON_DTYPES[str(bucket.dtype).removeprefix("torch.")],
            "BLOCK": kernels.BLOCK,
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
        options = _launch_options(interpret, kernels.NUM_WARPS)
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

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        beta1, beta2 = (float(b) for b in group["betas"])
        weight_decay = float(group["weight_decay"])
        scalars = (
            beta2,
            1.0 - beta1,
            1.0 - beta2,
            _ln(beta1),
            _ln(beta2),
            float(group["eps"]),
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
        if float(group["momentum"]) == 0:
            return [None], False
        buffer = state.get("momentum_buffer")
        if buffer is None:
            state["momentum_buffer"] = torch.zeros_like(param, dtype=torch.float32)
            return [state["momentum_buffer"]], True
        state["momentum_buffer"] = _conform(buffer, param)
        return [state["momentum_buffer"]], False

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        momentum = float(group["momentum"])
        weight_decay = float(group["weight_decay"])
        scalars = (momentum, 1.0 - float(group["dampening"]), weight_decay)
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
    ``lion``: ``lr``, ``betas``, ``weight_decay``, ``maximize``; see
    :class:`TritonOptimizer` for the constructor.
    """

    algorithm = "lion"
    kernel_name = "lion"
    hyperparameters = frozenset({"lr", "betas", "weight_decay", "maximize"})

    def _state_columns(
        self, param: Tensor, state: dict[str, Any], group: Mapping[str, Any]
    ) -> tuple[list[Tensor | None], bool]:
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
        else:
            state["exp_avg"] = _conform(state["exp_avg"], param)
        return [state["exp_avg"]], False

    def _kernel_arguments(self, group: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        beta1, beta2 = (float(b) for b in group["betas"])
        weight_decay = float(group["weight_decay"])
        decay = _decay_factor(group["lr"], weight_decay)
        scalars = (beta1, 1.0 - beta1, 1.0 - beta2, weight_decay, decay)
        flags = {"HAS_WD": weight_decay != 0, "MAXIMIZE": bool(group["maximize"])}
        return scalars, flags

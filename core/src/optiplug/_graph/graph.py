"""``optiplug.Graph``: a module, its data, its optimizer and schedule, trained together.

A Graph wraps an ``nn.Module`` for training::

    graph = optiplug.Graph(model)
    graph.set_optimizer("adamw", lr=3e-4)
    graph.set_scheduler(optiplug.schedule("cosine", total_steps=1000, warmup_steps=50))
    graph.set_data_loader(loader, forward_input="tokens")
    for batch in graph.epoch(0):
        loss = loss_fn(graph.forward_batch(batch), graph.targets(batch)["labels"])
        graph.backward(loss)
        graph.step()

``step()`` sets each group's lr to ``base * schedule(training_step) * lr_scale``,
clips the gradients' global norm (``set_grad_clip``), steps the optimizer, zeros the gradients and increments ``training_step``.
Under ``torch.distributed`` the module is wrapped in DDP (or, with
``parallel="fsdp"``, sharded with FSDP2's ``fully_shard``) and the loader is
sharded with a ``DistributedSampler``.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from .. import checkpoint
from .._api import factory as make_factory
from .._api import schedule as build_schedule
from .._auto.selection import AutoOptimizer
from .._auto.tune import preserved_rng
from .._checkpoint.format import read_checkpoint
from .._checkpoint.sharded import is_sharded, load_sharded, save_sharded, uses_dtensors
from .._core import autotune as _autotune
from .._core import ranks as _ranks
from .._core.selection import Selection
from .._core.specs import Candidate
from .._schedules.base import Schedule
from .._state.memory import memory_report
from ..checkpoint import extra_tensors, load_stored
from ..errors import CheckpointError, GraphError, HyperparameterError
from .buffers import BufferKeeper
from .finite import (
    NONFINITE_POLICIES,
    all_finite,
    first_nonfinite,
    gradient_values,
    gradients,
    parameters,
    state_items,
    state_values,
)
from .fsdp import (
    DEFAULT_FSDP_MIN_PARAMS,
    check_fsdp_min_params,
    check_parallel,
    discard_unsynced_gradients,
    set_gradient_sync,
    shard_module,
)
from .record import (
    GraphRecord,
    numpy_rng_state,
    rank_record,
    read_rank_record,
    read_record,
    torch_rng_states,
)

__all__ = ["DataBinding", "Graph"]

_PRECISIONS = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


class DataBinding:
    """How batch fields feed the module: the primary input, keyword inputs, targets."""

    __slots__ = (
        "batch_size",
        "forward_input",
        "keyword_inputs",
        "loader",
        "num_batches",
        "targets",
    )

    def __init__(
        self, loader: Any, forward_input: str, fields: list[str], keywords: set[str]
    ) -> None:
        self.loader = loader
        self.forward_input = forward_input
        self.keyword_inputs = [f for f in fields if f != forward_input and f in keywords]
        self.targets = [f for f in fields if f != forward_input and f not in keywords]
        self.num_batches = len(loader)
        self.batch_size = getattr(loader, "batch_size", None)


def _forward_keywords(module: torch.nn.Module) -> set[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(module.forward).parameters.values()
    return {p.name for p in parameters if p.kind in kinds}


def _batch_fields(loader: Any) -> list[str]:
    dataset = getattr(loader, "dataset", None)
    if dataset is not None and hasattr(dataset, "__getitem__") and len(dataset) > 0:
        sample = dataset[0]
    else:
        sample = next(iter(loader))
    if not isinstance(sample, Mapping):
        raise GraphError(
            f"set_data_loader: batches must be mappings of named tensors, got {type(sample).__name__}"
        )
    return list(sample)


class Graph:
    """Train a module with an optiplug optimizer, schedule, data loader and checkpoints.

    Args:
        module: the ``nn.Module`` to train.
        device: where to train; defaults to the module's parameters' device.
        accumulate: micro-batches per optimizer step (gradient accumulation).
        precision: ``None``, ``"bf16"`` or ``"fp16"`` autocast for ``forward_batch``;
            fp16 also uses a ``GradScaler`` (a step skipped for inf/NaN gradients
            advances neither the schedule nor ``training_step``). Under
            ``parallel="fsdp"`` it is FSDP2's ``MixedPrecisionPolicy``
            (compute in that dtype, reduce gradients in float32) instead of
            autocast, and fp16's scaler is FSDP's ``ShardedGradScaler``.
        seed: seeds the per-epoch shuffling of a shuffling loader.
        parallel: under ``torch.distributed``, ``"ddp"`` (the default:
            every rank holds the whole module, gradients are all-reduced; no
            process group: one process, no wrapper) or ``"fsdp"``
            (``fully_shard``: each rank holds a shard of every parameter,
            gradient and optimizer state; needs an initialised process group,
            world size 1 included).
        fsdp_min_params: with ``"fsdp"``, the parameters a submodule must
            hold to become its own unit (the largest such submodules are
            taken, looking inside ``ModuleList``/``ModuleDict``/``Sequential``
            containers, so each transformer block is one); the root unit
            takes the rest. Default 100,000.

    A non-finite loss or gradient stops the run with a :class:`GraphError`
    before anything is applied (see :meth:`set_nonfinite_policy` to skip such
    batches instead), and so does a step that leaves a parameter or the
    optimizer state non-finite; :meth:`save` refuses a non-finite state.
    "Nothing is applied" covers the module's buffers too: the buffers its
    forward passes updated (BatchNorm's running statistics) are put back as
    they were after the last optimizer step, so the Graph keeps a copy of
    its persistent buffers. A buffer that already held NaN or inf when the
    Graph got the module (a ``-inf`` mask) may keep doing so; any other
    non-finite buffer is refused by :meth:`save` and :meth:`load`.

    Raises:
        HyperparameterError: a bad ``accumulate``, ``precision``, ``parallel``
            or ``fsdp_min_params``.
        GraphError: ``parallel="fsdp"`` without an initialised process group.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        device: str | torch.device | None = None,
        accumulate: int = 1,
        precision: str | None = None,
        seed: int = 0,
        parallel: str = "ddp",
        fsdp_min_params: int = DEFAULT_FSDP_MIN_PARAMS,
    ) -> None:
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise HyperparameterError(
                "accumulate", accumulate, "must be an integer >= 1", algorithm="Graph"
            )
        if precision not in _PRECISIONS:
            raise HyperparameterError(
                "precision", precision, "must be None, 'bf16' or 'fp16'", algorithm="Graph"
            )
        self._parallel = check_parallel(parallel)
        self._fsdp_min_params = check_fsdp_min_params(fsdp_min_params)
        first = next(module.parameters(), None)
        self.device = (
            torch.device(device)
            if device is not None
            else (first.device if first is not None else torch.device("cpu"))
        )
        self.precision = precision
        self.module = module.to(self.device)
        self.model = self._wrap(self.module)
        self._buffers = BufferKeeper(self.module)  # as of the last step: a failed one's undo
        self.accumulate = accumulate
        self.seed = seed
        self.optimizer: torch.optim.Optimizer | None = None
        self.schedule: Schedule | None = None
        self.base_lrs: list[float] = []
        self._lr_scale = 1.0
        self._training_step = 0
        self._micro_step = 0
        self._binding: DataBinding | None = None
        self._live_epochs = 0
        self._position = (0, 0)  # (epoch, batches consumed in it)
        self.scaler = self._grad_scaler() if precision == "fp16" else None
        self._nonfinite = "stop"
        self._max_consecutive_skips = 16
        self._skip_pending = False  # a non-finite loss in this accumulation (policy "skip")
        self._skipped = 0
        self._consecutive_skips = 0
        self._clip: tuple[float, float] | None = None  # (max_norm, norm_type)
        self._last_grad_norm: float | None = None

    def _wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if self._parallel == "fsdp":  # sharded in place: the module is its own wrapper
            return shard_module(
                module, self.device, self._fsdp_min_params, _PRECISIONS[self.precision]
            )
        if not _ranks.active():
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

    def _grad_scaler(self) -> torch.amp.GradScaler:
        """fp16's loss scaler; under FSDP the sharded one, whose inf check spans every rank."""
        if self._parallel == "fsdp":
            return ShardedGradScaler(self.device.type)
        return torch.amp.GradScaler(self.device.type)

    @property
    def parallel(self) -> str:
        """``"ddp"`` or ``"fsdp"``: how the module trains under ``torch.distributed``."""
        return self._parallel

    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer state held by this process (its shard's, under FSDP).

        Measured as :func:`optiplug.memory` measures it (every tensor's
        storage once); a ``DTensor`` state tensor counts its local shard only,
        so under ``parallel="fsdp"`` with N ranks each rank holds about 1/N of
        what a DDP rank holds.

        Returns:
            The bytes of every state tensor and tensor hyperparameter.

        Raises:
            GraphError: no optimizer set.
        """
        return memory_report(self._require_optimizer("optimizer_state_bytes")).total

    @property
    def rank(self) -> int:
        """This process's rank under ``torch.distributed`` (0 when not distributed)."""
        return _ranks.rank()

    @property
    def world_size(self) -> int:
        """Processes training together (1 when not distributed); the usual ``lr_scale``."""
        return _ranks.world_size()

    # ------------------------------------------------------------- optimizer
    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters of the wrapped module."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def set_optimizer(
        self, optimizer: str | Callable[[Any], torch.optim.Optimizer], **hparams: Any
    ) -> torch.optim.Optimizer:
        """Build the optimizer over the module's named parameters.

        Args:
            optimizer: an algorithm name, an :class:`~optiplug.OptimizerFactory`,
                an ``AutoOptimizer`` :class:`~optiplug.Selection` (whose schedule,
                if any, is attached too), or any ``params -> Optimizer`` callable.
            **hparams: hyperparameters when ``optimizer`` is a name.

        Returns:
            The optimizer built.

        Raises:
            HyperparameterError: keywords given with a factory, or invalid ones.
        """
        if isinstance(optimizer, str):
            optimizer = make_factory(optimizer, **hparams)
        elif hparams:
            raise HyperparameterError(
                next(iter(hparams)),
                hparams,
                "keywords need an optimizer name, not a factory",
                algorithm="Graph",
            )
        named = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        with self._ranks_agree():
            self.optimizer = optimizer(named)
        self.base_lrs = [float(group["lr"]) for group in self.optimizer.param_groups]
        selected_schedule = getattr(optimizer, "schedule", None)
        if isinstance(selected_schedule, Schedule) and self.schedule is None:
            self.schedule = selected_schedule
        self._apply_lr()
        return self.optimizer

    def tune_optimizer(
        self,
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        batches: Iterable[Any] | None = None,
        *,
        candidates: Sequence[str | Candidate] | None = None,
        budget_steps: int = 1500,
        held_out: int | float = 0.2,
        max_batches: int = 64,
        seed: int | None = None,
        task: str | None = None,
        stage: str | None = None,
    ) -> Selection:
        """Measure optimizers on this Graph's module (``AutoOptimizer.tune``) and use the best.

        The module is not changed by the measuring (copies are trained); the
        winner at its tuned lr becomes the Graph's optimizer, as
        :meth:`set_optimizer` would make it. Under ``torch.distributed``
        rank 0 measures and every rank gets the same choice.

        Args:
            loss_fn: ``loss_fn(module, batch)`` returning a scalar loss tensor.
            batches: the batches to measure on; None takes the first
                ``max_batches`` of the bound data loader (moved to the
                Graph's device; the loader's random state is left as it was).
            candidates: algorithm names; None lets the rules propose.
            budget_steps: optimizer steps for the whole tune.
            held_out: held-out batches (an int) or their fraction (a float).
            max_batches: how many loader batches to take when ``batches`` is None.
            seed: the tune's seed; None uses the Graph's.
            task: the task, for the rules' recipes.
            stage: ``"pretraining"`` or ``"finetuning"``, for the rules' recipes.

        Returns:
            The :class:`~optiplug.Selection` now in use (``explain()``, ``plot()``).

        Raises:
            GraphError: ``batches`` is None and no data loader is bound, or
                the module is sharded (``parallel="fsdp"``).
            TuneError: too few batches, too small a budget, a bad loss, or
                every candidate diverged.
        """
        if self.parallel == "fsdp":
            raise GraphError(
                "tune_optimizer trains whole copies of the module, and this Graph's is sharded "
                "(parallel='fsdp'): tune the unsharded model with AutoOptimizer.tune(...) "
                "before building the Graph, then pass the selection to set_optimizer"
            )
        if batches is None:
            binding = self._require_binding("tune_optimizer")
            with preserved_rng():
                batches = [
                    self._to_device(batch)
                    for batch in itertools.islice(binding.loader, max_batches)
                ]
        selection = AutoOptimizer.tune(
            self.module,
            loss_fn,
            batches,
            candidates=candidates,
            budget_steps=budget_steps,
            held_out=held_out,
            seed=self.seed if seed is None else seed,
            task=task,
            stage=stage,
        )
        self.set_optimizer(selection)
        return selection

    def _ranks_agree(self) -> contextlib.AbstractContextManager[Any]:
        """Under DDP, every rank picks the same measured implementation (see _autotune)."""
        if not _ranks.active():
            return contextlib.nullcontext()
        return _autotune.agreed_across_ranks(_collective_device())

    def set_scheduler(self, schedule: Schedule | str | Mapping[str, Any] | None) -> None:
        """Attach a schedule (an object, a name, or a dict for ``optiplug.schedule``); None detaches."""
        if isinstance(schedule, str):
            schedule = build_schedule(schedule)
        elif isinstance(schedule, Mapping):
            schedule = build_schedule(**schedule)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise HyperparameterError(
                "schedule",
                schedule,
                "must be an optiplug Schedule, a name or a dict",
                algorithm="Graph",
            )
        self.schedule = schedule
        self._apply_lr()

    def set_lr_scale(self, scale: float) -> None:
        """Set the lr multiplier applied with the schedule every step (DDP linear scaling).

        The usual value under ``torch.distributed`` is the world size (Goyal et
        al., 2017: the global batch grows with it). Default 1.0.

        Raises:
            HyperparameterError: ``scale`` not finite and > 0.
        """
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or scale <= 0
        ):
            raise HyperparameterError(
                "lr_scale", scale, "must be a finite number > 0", algorithm="Graph"
            )
        self._lr_scale = float(scale)
        self._apply_lr()

    @property
    def lr_scale(self) -> float:
        """The lr multiplier set by :meth:`set_lr_scale`."""
        return self._lr_scale

    def set_lr(self, lr: float) -> None:
        """Set every group's base lr (the schedule and scale still apply on top)."""
        optimizer = self._require_optimizer("set_lr")
        if (
            isinstance(lr, bool)
            or not isinstance(lr, (int, float))
            or not math.isfinite(lr)
            or lr < 0
        ):
            raise HyperparameterError("lr", lr, "must be a finite number >= 0", algorithm="Graph")
        self.base_lrs = [float(lr)] * len(optimizer.param_groups)
        self._apply_lr()

    @property
    def training_step(self) -> int:
        """Optimizer steps taken (increments once per effective :meth:`step`)."""
        return self._training_step

    def current_lrs(self) -> list[float]:
        """The lr each group gets at the current training step."""
        factor = self.schedule(self._training_step) if self.schedule is not None else 1.0
        return [base * factor * self._lr_scale for base in self.base_lrs]

    def _apply_lr(self) -> None:
        if self.optimizer is None:
            return
        for group, lr in zip(self.optimizer.param_groups, self.current_lrs(), strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def _require_optimizer(self, caller: str) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise GraphError(f"Graph.{caller}: call set_optimizer() first")
        return self.optimizer

    # ------------------------------------------------------------- stepping
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for the chosen precision (a no-op without one, and under FSDP).

        Under ``parallel="fsdp"`` the precision is FSDP2's mixed-precision
        policy, applied by the sharded module itself.
        """
        dtype = _PRECISIONS[self.precision]
        if dtype is None or self._parallel == "fsdp":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def set_nonfinite_policy(self, policy: str, *, max_consecutive_skips: int = 16) -> None:
        """Choose what a non-finite (NaN or inf) loss or gradient does.

        ``"stop"`` (the default): :meth:`backward` or :meth:`step` raises
        :class:`GraphError` before anything is applied, so the parameters, the
        optimizer state, the module's buffers and ``training_step`` are those
        of the last step. ``"skip"``: the optimizer step of that batch (of its
        whole accumulation) is skipped, as fp16 gradient scaling skips one:
        :meth:`step` returns False, the gradients are dropped, the buffers
        the accumulation's forward passes changed are put back, neither
        ``training_step`` nor the schedule advances, and :attr:`skipped_steps`
        counts it. Under either policy, a step that leaves a parameter or the
        optimizer state non-finite (an update that overflowed) raises, since
        it cannot be undone.

        Args:
            policy: ``"stop"`` or ``"skip"``.
            max_consecutive_skips: with ``"skip"``, this many skipped steps in
                a row raise :class:`GraphError` (a run that cannot recover).

        Raises:
            HyperparameterError: an unknown policy or a count < 1.
        """
        if policy not in NONFINITE_POLICIES:
            raise HyperparameterError(
                "nonfinite_policy", policy, "must be 'stop' or 'skip'", algorithm="Graph"
            )
        limit = max_consecutive_skips
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise HyperparameterError(
                "max_consecutive_skips", limit, "must be an integer >= 1", algorithm="Graph"
            )
        self._nonfinite, self._max_consecutive_skips = policy, limit

    @property
    def nonfinite_policy(self) -> str:
        """``"stop"`` or ``"skip"`` (see :meth:`set_nonfinite_policy`)."""
        return self._nonfinite

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient (policy ``"skip"``)."""
        return self._skipped

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``, divided by ``accumulate`` and scaled for fp16.

        A non-finite loss is not backpropagated (under DDP: on any rank, then
        on none): with the ``"stop"`` policy it raises, with ``"skip"`` this
        accumulation's step will be skipped.

        Raises:
            GraphError: a non-finite loss under the ``"stop"`` policy; the
                gradients accumulated so far are dropped, nothing is applied.
        """
        if self._loss_nonfinite(loss):
            if self._nonfinite == "skip":
                self._skip_pending = True
                return
            value = "nan" if bool(torch.isnan(loss.detach()).any()) else "inf"
            self._drop_accumulation()
            raise GraphError(
                f"Graph.backward: the loss is {value} at step {self._training_step + 1}; "
                f"stopped before backpropagating it, nothing was applied (the parameters "
                f"and optimizer state are those of step {self._training_step})"
            )
        loss = loss / self.accumulate
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated

    def _loss_nonfinite(self, loss: torch.Tensor) -> bool:
        """Whether ``loss`` holds NaN or inf here or, under DDP, on any rank."""
        flag = (~torch.isfinite(loss.detach())).any().to(torch.int32)
        if _ranks.active():
            flag = flag.to(_collective_device())
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag)

    def _drop_accumulation(self) -> None:
        """Forget this accumulation: zero the gradients, put the buffers back, rewind the counter."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self._parallel == "fsdp":  # and those FSDP kept unsharded, unsynchronised
            discard_unsynced_gradients(self.module)
        self._buffers.restore()
        self._micro_step -= self._micro_step % self.accumulate
        self._skip_pending = False

    def step(self) -> bool:
        """Count one micro-batch; every ``accumulate``-th, take an optimizer step.

        The step sets each group's lr to base * schedule(training_step) *
        lr_scale, clips the accumulated gradients' global norm when
        :meth:`set_grad_clip` asked for it (after fp16 unscaling), steps, zeros
        the gradients and increments ``training_step`` (unless fp16 gradient
        scaling, or the ``"skip"`` policy, skipped it for a non-finite loss or
        gradient).

        Returns:
            True when the optimizer stepped.

        Raises:
            GraphError: no optimizer set; a non-finite gradient (``"stop"``
                policy: nothing applied); too many skips in a row; or a step
                that left a parameter or the optimizer state non-finite.
        """
        optimizer = self._require_optimizer("step")
        self._micro_step += 1
        if self._micro_step % self.accumulate:
            return False
        if self._skip_pending or self._gradient_nonfinite(optimizer):
            return self._skip(optimizer)
        self._apply_lr()
        stepped = self._optimizer_step(optimizer)
        self._buffers.keep()  # the forwards' buffer updates belong to this step now
        optimizer.zero_grad(set_to_none=True)
        if stepped:
            self._training_step += 1
            self._consecutive_skips = 0
            self._stop_if_state_nonfinite(optimizer)
        return stepped

    def _gradient_nonfinite(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether to skip for a non-finite gradient; raises under ``"stop"``.

        With fp16 the GradScaler makes that decision itself. Gradients are
        all-reduced under DDP, so every rank decides the same; under FSDP each
        rank checks its shard and one all-reduce of the answer makes every
        rank decide alike.
        """
        if self.scaler is not None:
            return False
        if self._all_ranks_finite(gradient_values(self.module)):
            return False
        name = first_nonfinite(gradients(self.module)) or "a gradient shard of another rank"
        if self._nonfinite == "skip":
            return True
        self._micro_step -= self.accumulate
        self._drop_accumulation()
        raise GraphError(
            f"Graph.step: {name} is not finite at step {self._training_step + 1}; "
            f"nothing was applied (the parameters and optimizer state are those of step "
            f"{self._training_step})"
        )

    def _skip(self, optimizer: torch.optim.Optimizer) -> bool:
        optimizer.zero_grad(set_to_none=True)
        if self._parallel == "fsdp":
            discard_unsynced_gradients(self.module)
        self._buffers.restore()
        self._skip_pending = False
        self._skipped += 1
        self._consecutive_skips += 1
        if self._consecutive_skips >= self._max_consecutive_skips:
            raise GraphError(
                f"Graph.step: {self._consecutive_skips} steps in a row were skipped for a "
                f"non-finite loss or gradient (at step {self._training_step + 1}); stopping: "
                f"the parameters and optimizer state are those of step {self._training_step}"
            )
        return False

    def _nonfinite_state(self, optimizer: torch.optim.Optimizer) -> str | None:
        """The first parameter or optimizer state slot holding NaN or inf, or None.

        Under FSDP every rank must call it (the answer is agreed by one
        all-reduce): a rank whose own shards are finite names another rank's.
        """
        if self._all_ranks_finite(state_values(self.module, optimizer)):
            return None
        found = first_nonfinite(
            itertools.chain(parameters(self.module), state_items(self.module, optimizer))
        )
        return found or "a parameter or state shard of another rank"

    def _all_ranks_finite(self, values: list[Any]) -> bool:
        """:func:`all_finite` of this rank's values (DTensors: their local shards), agreed.

        Under FSDP the shards differ between ranks, so one MAX all-reduce of
        "something is not finite here" gives every rank the same answer;
        under DDP (or one process) the values are identical everywhere and
        nothing is communicated.
        """
        finite = all_finite(values)
        if self._parallel != "fsdp":
            return finite
        flag = torch.tensor([0 if finite else 1], dtype=torch.int32, device=_collective_device())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return not bool(flag.item())

    def _stop_if_state_nonfinite(self, optimizer: torch.optim.Optimizer) -> None:
        found = self._nonfinite_state(optimizer)
        if found is not None:
            raise GraphError(
                f"Graph.step: the state is not finite after step {self._training_step}: "
                f"{found} holds NaN or inf (the update overflowed: lower the learning rate); "
                "this Graph cannot go on: load the last checkpoint"
            )

    def _optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Clip (when set) and step; with fp16, unscale first and let the scaler step."""
        if self.scaler is None:
            self._clip_gradients()
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        if self._clip is not None:
            self.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            self._clip_gradients()
        self.scaler.step(optimizer)  # knows they are unscaled; skips on inf/NaN as ever
        self.scaler.update()
        return self.scaler.get_scale() >= before

    # ------------------------------------------------------------- clipping
    def set_grad_clip(self, max_norm: float | None, *, norm_type: float = 2.0) -> None:
        """Clip the global gradient norm before every optimizer step; None disables.

        The norm is taken over every trainable parameter's gradient together,
        as ``torch.nn.utils.clip_grad_norm_`` takes it (and with the same
        arithmetic, so the result is bit-identical to calling it by hand): when
        it exceeds ``max_norm`` every gradient is multiplied by
        ``max_norm / (norm + 1e-6)``. It runs once per optimizer step, in
        :meth:`step`, on the gradients the step will use: accumulated over all
        micro-batches, all-reduced under DDP (so every rank computes the same
        norm and applies the same factor), and unscaled under fp16
        (``scaler.unscale_`` first, then the clip, then ``scaler.step``). The
        norm before clipping is :attr:`last_grad_norm`. ``max_norm=math.inf``
        only measures it.

        Args:
            max_norm: the largest global norm allowed (> 0, ``math.inf`` to
                measure only), or None to stop clipping.
            norm_type: the p of the p-norm (> 0; ``math.inf`` for the max norm).

        Raises:
            HyperparameterError: ``max_norm`` not None and not > 0, or
                ``norm_type`` not > 0 (NaN included).
        """
        if max_norm is None:
            self._clip = None
            return
        for name, value in (("max_norm", max_norm), ("norm_type", norm_type)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise HyperparameterError(
                    name, value, "must be a number > 0 (math.inf allowed)", algorithm="Graph"
                )
        self._clip = (float(max_norm), float(norm_type))

    @property
    def grad_clip(self) -> tuple[float, float] | None:
        """``(max_norm, norm_type)`` set by :meth:`set_grad_clip`, or None."""
        return self._clip

    @property
    def last_grad_norm(self) -> float | None:
        """The global gradient norm of the last optimizer step, before clipping.

        None until a step has run with clipping set (the norm is only computed
        then). Under fp16 it is the unscaled norm; a step the GradScaler
        skipped for inf/NaN gradients leaves ``inf`` or ``nan`` here.
        """
        return self._last_grad_norm

    def _clip_gradients(self) -> None:
        """``clip_grad_norm_``'s two halves: the total norm (kept), then the scaling."""
        if self._clip is None:
            return
        max_norm, norm_type = self._clip
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False)
        if isinstance(norm, DTensor):  # FSDP: reduced over the shards, replicated on every rank
            norm = norm.full_tensor()
        self._last_grad_norm = float(norm)
        if math.isfinite(max_norm):
            torch.nn.utils.clip_grads_with_norm_(self.parameters(), max_norm, norm)

    # ------------------------------------------------------------- data
    def set_data_loader(self, loader: Any, forward_input: str) -> None:
        """Bind a loader of mapping batches; ``forward_input`` is the primary input field.

        Fields matching keyword parameters of ``module.forward`` are passed to
        it; the rest are targets. Under ``torch.distributed`` (and for a
        shuffling loader) the loader is rebuilt with a ``DistributedSampler``
        seeded per epoch, so every rank sees its own shard and a resumed run
        sees the same order.

        Raises:
            GraphError: an epoch iterator is live, batches are not mappings, or
                ``forward_input`` is not a field (the fields are listed).
        """
        if self._live_epochs:
            raise GraphError(
                "set_data_loader: cannot replace the data loader while an epoch iterator is active"
            )
        fields = _batch_fields(loader)
        if forward_input not in fields:
            raise GraphError(
                f"set_data_loader: forward_input {forward_input!r} is not a batch field; fields: {', '.join(fields)}"
            )
        loader = self._sharded(loader)
        self._binding = DataBinding(loader, forward_input, fields, _forward_keywords(self.module))

    def _sharded(self, loader: Any) -> Any:
        """Rebuild a map-style DataLoader so its order depends only on (seed, epoch, rank).

        The rebuilt loader has its own generator (re-seeded each epoch), so
        creating an iterator never draws from the global RNG, and shuffling or
        distributed sharding goes through a ``DistributedSampler``.
        """
        if not isinstance(loader, DataLoader) or loader.batch_sampler is None:
            return loader
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = loader.sampler
        if shuffle or _ranks.active():
            sampler = DistributedSampler(
                loader.dataset,
                num_replicas=self.world_size,
                rank=self.rank,
                shuffle=shuffle,
                seed=self.seed,
                drop_last=loader.drop_last,
            )
        return DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            worker_init_fn=loader.worker_init_fn,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _require_binding(self, caller: str) -> DataBinding:
        if self._binding is None:
            raise GraphError(f"Graph.{caller}: call set_data_loader() first")
        return self._binding

    @property
    def data_num_batches(self) -> int:
        """Batches per epoch (per rank under DDP)."""
        return self._require_binding("data_num_batches").num_batches

    @property
    def data_batch_size(self) -> int | None:
        """The loader's batch size (per rank under DDP)."""
        return self._require_binding("data_batch_size").batch_size

    def epoch(self, n: int) -> Iterator[Mapping[str, Any]]:
        """Iterate over epoch ``n``'s batches (resuming mid-epoch after :meth:`load`).

        While the iterator is live, :meth:`set_data_loader` refuses to rebind.

        Raises:
            GraphError: no loader bound.
        """
        binding = self._require_binding("epoch")
        sampler = getattr(binding.loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(n)
        generator = getattr(binding.loader, "generator", None)
        if isinstance(generator, torch.Generator):
            generator.manual_seed(self.seed * 1_000_003 + n)
        skip = self._position[1] if self._position[0] == n else 0
        return self._iterate(binding, n, skip)

    def _iterate(self, binding: DataBinding, n: int, skip: int) -> Iterator[Mapping[str, Any]]:
        self._live_epochs += 1
        try:
            self._position = (n, skip)
            for index, batch in enumerate(itertools.islice(binding.loader, skip, None), start=skip):
                self._position = (n, index + 1)
                yield batch
            self._position = (n + 1, 0)
        finally:
            self._live_epochs -= 1

    def _to_device(self, value: Any) -> Any:
        return (
            value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        )

    def forward_batch(self, batch: Mapping[str, Any]) -> Any:
        """Run the (DDP-wrapped) module on a batch, under the precision's autocast.

        Returns:
            The module's output for ``batch[forward_input]`` and the keyword fields.
        """
        binding = self._require_binding("forward_batch")
        inputs = self._to_device(batch[binding.forward_input])
        keywords = {name: self._to_device(batch[name]) for name in binding.keyword_inputs}
        with self.autocast(), self._gradient_sync():
            return self.model(inputs, **keywords)

    def _gradient_sync(self) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync`` for every micro-batch but the last of an accumulation.

        DDP decides in the forward pass whether the backward all-reduces, so
        the forward of a non-final micro-batch runs without synchronisation
        and its gradients accumulate locally; the last one syncs them all.
        Under FSDP the same is ``set_requires_gradient_sync(False)`` on the
        sharded module before the backward of a non-final micro-batch (its
        gradients accumulate unsharded) and True before the last one, whose
        backward reduce-scatters the sum once.
        """
        last = (self._micro_step + 1) % self.accumulate == 0
        if self._parallel == "fsdp":  # FSDP2 decides in the backward, from this flag
            set_gradient_sync(self.model, last)
            return contextlib.nullcontext()
        no_sync = getattr(self.model, "no_sync", None)
        if last or no_sync is None:
            return contextlib.nullcontext()
        unsynced: contextlib.AbstractContextManager[Any] = no_sync()
        return unsynced

    def targets(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch's target fields (neither the primary nor a keyword input), on the device."""
        binding = self._require_binding("targets")
        return {name: self._to_device(batch[name]) for name in binding.targets}

    @property
    def data_position(self) -> tuple[int, int]:
        """``(epoch, batches consumed in it)``: where :meth:`epoch` resumes after :meth:`load`."""
        return self._position

    # ------------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike[str]) -> None:
        """Checkpoint model, optimizer, schedule position, counters, RNG and data position.

        Written atomically in optiplug's checkpoint format (one verified tensor
        file holding the optimizer state, the module's state dict and the RNG
        states). Under ``torch.distributed`` only rank 0 writes; every rank
        waits until it has.

        When the module's parameters are ``DTensor``s (FSDP2's ``fully_shard``)
        the checkpoint is sharded instead (:func:`optiplug.checkpoint.save_sharded`):
        every rank writes its shards of the module and optimizer state, and
        the manifest keeps this graph's record (counters, schedule, lrs, data
        position, GradScaler) and every rank's own RNG states.

        Raises:
            GraphError: no optimizer set, or a parameter, the optimizer state
                or a buffer that training made non-finite holds NaN or inf (on
                any rank under ``torch.distributed``; nothing is written: a
                checkpoint already at ``path`` is untouched).
            CheckpointError: ``path`` holds something other than a checkpoint
                (or, sharded, a rank failed or stopped answering).
        """
        optimizer = self._require_optimizer("save")
        sharded = uses_dtensors(self.module)
        found = self._nonfinite_state(optimizer) or self._buffers.first_made_nonfinite()
        if _ranks.active():  # FSDP shards and each rank's own buffer updates: agree
            everyone: list[str | None] = [None] * self.world_size
            torch.distributed.all_gather_object(everyone, found)
            found = next((name for name in everyone if name is not None), None)
        if found is not None:
            raise GraphError(
                f"Graph.save: refusing to save a non-finite state ({found} holds NaN or inf); "
                f"nothing was written, {os.fspath(path)} is untouched"
            )
        if sharded:
            extra = {"graph": self._state()}
            save_sharded(path, self.module, optimizer, extra=extra, per_rank=rank_record())
            return
        if self.rank == 0:
            tensors = {f"model/{k}": v for k, v in self.module.state_dict().items()}
            tensors.update(torch_rng_states())
            checkpoint.save(path, optimizer, tensors=tensors, graph=self._state())
        if _ranks.active():
            torch.distributed.barrier()

    def _state(self) -> dict[str, Any]:
        return {
            "training_step": self._training_step,
            "micro_step": self._micro_step,
            "lr_scale": self._lr_scale,
            "base_lrs": list(self.base_lrs),
            "schedule": self.schedule.to_dict() if self.schedule is not None else None,
            "data_position": list(self._position),
            "accumulate": self.accumulate,
            "world_size": self.world_size,
            "python_rng": _jsonable(random.getstate()),
            "numpy_rng": numpy_rng_state(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load(self, path: str | os.PathLike[str]) -> None:
        """Resume from :meth:`save`'s checkpoint: everything is verified before anything changes.

        The files' integrity, the model tensors' names, shapes and dtypes, the
        graph record's every field (counters, lrs, schedule, data position)
        and RNG states, the model tensors' values (no NaN or inf but in a
        buffer that held it when this Graph got the module), and the optimizer
        state are all checked first; only
        then do they replace this graph's. The optimizer must already be set
        (same algorithm, same parameters). On any error the module, optimizer,
        schedule, counters and RNG states are left exactly as they were.

        A sharded checkpoint (saved by an FSDP Graph) is loaded with
        :func:`optiplug.checkpoint.load_sharded` (call it on every rank): the
        graph record is checked on every rank with the files, before the
        module and optimizer are touched, and every rank's problems are
        reported on every rank. The world size may differ from the save's
        (DCP reshards; a plain module in one process loads it too); each rank
        restores the RNG states of the saving rank of its number (modulo
        their count).

        Raises:
            GraphError: no optimizer set.
            CheckpointError: damaged files, a malformed graph record or RNG
                state, or model tensors that do not fit the module or hold
                NaN or inf (a parameter, or a buffer training made so).
            StateDictError: optimizer state that does not fit the optimizer
                (sharded: also model state that does not fit the module).
        """
        optimizer = self._require_optimizer("load")
        if is_sharded(path):
            groups = len(optimizer.param_groups)
            device = self.device.type if self.scaler is not None else None
            records: list[GraphRecord] = []

            def check(manifest: Mapping[str, Any]) -> None:
                records.append(read_rank_record(manifest, groups, path, device, self.rank))

            load_sharded(path, self.module, optimizer, check=check)
            self._restore(records[-1])
            return
        stored = read_checkpoint(Path(path))
        tensors = extra_tensors(stored)
        extra = stored.metadata.get("extra", {})
        scaler = self.device.type if self.scaler is not None else None
        record = read_record(extra, tensors, len(optimizer.param_groups), path, scaler)
        model_state = {
            k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")
        }
        self._check_model_state(model_state, path)
        self._check_model_finite(model_state, path)
        load_stored(stored, optimizer, strict=True)  # validates first: all or nothing
        self.module.load_state_dict(model_state)
        self._restore(record)

    def _check_model_state(self, saved: Mapping[str, torch.Tensor], path: Any) -> None:
        own = self.module.state_dict()
        problems = [f"missing {k}" for k in own if k not in saved]
        problems += [f"unexpected {k}" for k in saved if k not in own]
        problems += [
            f"{k}: expected {tuple(v.shape)} {v.dtype}, found {tuple(saved[k].shape)} {saved[k].dtype}"
            for k, v in own.items()
            if k in saved and (saved[k].shape != v.shape or saved[k].dtype != v.dtype)
        ]
        if problems:
            raise CheckpointError(
                f"{path}: the model state does not fit this module: {'; '.join(problems[:10])}"
            )

    def _check_model_finite(self, saved: Mapping[str, torch.Tensor], path: Any) -> None:
        """Refuse saved model tensors holding NaN or inf (a buffer built so excepted)."""
        found = self._buffers.made_nonfinite(saved)
        if found:
            raise CheckpointError(
                f"{path}: the model state holds NaN or inf in {', '.join(found[:10])} "
                "(made so by training); refusing to load it, nothing was changed"
            )

    def _restore(self, record: GraphRecord) -> None:
        self._training_step = record.training_step
        self._micro_step = record.micro_step
        self._lr_scale = record.lr_scale
        self.base_lrs = list(record.base_lrs)
        self.schedule = record.schedule
        self._position = record.data_position
        self._skip_pending = False
        self._consecutive_skips = 0
        record.apply_rng()
        if self.scaler is not None and record.scaler:
            self.scaler.load_state_dict(record.scaler)
        self._apply_lr()
        self._buffers.keep()


def _collective_device() -> torch.device:
    """Where a collective's tensors live: the current CUDA device under NCCL, else the CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _jsonable(value: Any) -> Any:
    return [_jsonable(item) for item in value] if isinstance(value, (tuple, list)) else value


Graph.__module__ = "optiplug"  # its public home: pickles and docs name optiplug.Graph

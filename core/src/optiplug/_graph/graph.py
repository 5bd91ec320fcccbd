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
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from .._api import default_registry
from .._core import ranks as _ranks
from .._core.create import OptimizerFactory
from .._core.lifecycle import has_train_eval, set_training, step_needs
from .._core.selection import Selection
from .._core.specs import Candidate
from .._schedules.base import Schedule
from .._state.memory import memory_report
from ..errors import GraphError, HyperparameterError
from .buffers import BufferKeeper
from .checkpoints import Checkpointer, jsonable
from .clip import GradClip
from .data import DataBinding, DataFeed
from .fsdp import (
    DEFAULT_FSDP_MIN_PARAMS,
    check_fsdp_min_params,
    check_parallel,
    discard_unsynced_gradients,
)
from .guard import NonfiniteGuard
from .lrs import LearningRates
from .parallel import agreed_name, gradient_sync, ranks_agree, wrap_module
from .precision import Precision, check_precision
from .record import GraphRecord, numpy_rng_state
from .tuning import tune_selection

__all__ = ["DataBinding", "Graph"]


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
    optimizer state non-finite (the :meth:`step` that made it raises, under
    either policy); :meth:`save` refuses a non-finite state. These checks run
    at every step, each one multi-tensor reduction per device and dtype (the
    gradients' is the clip's total norm when clipping is on, and fp16's
    GradScaler's own check under fp16), about 2% of a small model's step.
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
        check_precision(precision)
        self._parallel = check_parallel(parallel)
        min_params = check_fsdp_min_params(fsdp_min_params)
        first = next(module.parameters(), None)
        self.device = (
            torch.device(device)
            if device is not None
            else (first.device if first is not None else torch.device("cpu"))
        )
        self._precision = Precision(precision, self.device, self._parallel)
        self.precision = precision
        self.module = module.to(self.device)
        self.model = wrap_module(
            self.module, self.device, self._parallel, min_params, self._precision.dtype
        )
        self._buffers = BufferKeeper(self.module)  # as of the last step: a failed one's undo
        self._checkpoints = Checkpointer(self.module, self._buffers)
        self.accumulate = accumulate
        self.seed = seed
        self.optimizer: torch.optim.Optimizer | None = None
        self._optimizer_training = True  # the mode of a train/eval optimizer (schedule-free)
        self._lrs = LearningRates()
        self._training_step = 0
        self._micro_step = 0
        self._data = DataFeed(self.device, seed)
        self.scaler = self._precision.scaler
        self._guard = NonfiniteGuard()
        self._clip = GradClip()

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
            GraphError: the optimizer needs ``step(closure)`` (its spec's
                ``step_closure``), which a Graph's backward-then-step cannot
                give; the Graph keeps its previous optimizer.
        """
        if isinstance(optimizer, str):  # validated once, when it is built just below
            impl, provider = hparams.pop("impl", None), hparams.pop("provider", None)
            optimizer = OptimizerFactory(
                optimizer, hparams, impl=impl, provider=provider, registry=default_registry()
            )
        elif hparams:
            raise HyperparameterError(
                next(iter(hparams)),
                hparams,
                "keywords need an optimizer name, not a factory",
                algorithm="Graph",
            )
        named = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        with ranks_agree(getattr(optimizer, "registry", None)):
            built = optimizer(named)
        if step_needs(built)[0]:
            raise GraphError(
                f"{type(built).__name__} needs step(closure), which re-evaluates the loss "
                "inside the step; a Graph steps after backward: train it in a loop of "
                "optiplug.base.training_step(optimizer, loss_of) instead"
            )
        self.optimizer = built
        set_training(self.optimizer, self._optimizer_training)
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
        selection = tune_selection(
            self.module,
            loss_fn,
            batches,
            parallel=self._parallel,
            feed=self._data,
            max_batches=max_batches,
            candidates=candidates,
            budget_steps=budget_steps,
            held_out=held_out,
            seed=self.seed if seed is None else seed,
            task=task,
            stage=stage,
        )
        self.set_optimizer(selection)
        return selection

    @property
    def schedule(self) -> Schedule | None:
        """The schedule in force (a multiplier of each group's base lr), or None."""
        return self._lrs.schedule

    @schedule.setter
    def schedule(self, schedule: Schedule | None) -> None:
        self._lrs.schedule = schedule

    @property
    def base_lrs(self) -> list[float]:
        """Each param group's base lr (the schedule and lr scale apply on top)."""
        return self._lrs.base_lrs

    @base_lrs.setter
    def base_lrs(self, lrs: list[float]) -> None:
        self._lrs.base_lrs = lrs

    def set_scheduler(self, schedule: Schedule | str | Mapping[str, Any] | None) -> None:
        """Attach a schedule (an object, a name, or a dict for ``optiplug.schedule``); None detaches."""
        self._lrs.set_schedule(schedule)
        self._apply_lr()

    def set_lr_scale(self, scale: float) -> None:
        """Set the lr multiplier applied with the schedule every step (DDP linear scaling).

        The usual value under ``torch.distributed`` is the world size (Goyal et
        al., 2017: the global batch grows with it). Default 1.0.

        Raises:
            HyperparameterError: ``scale`` not finite and > 0.
        """
        self._lrs.set_scale(scale)
        self._apply_lr()

    @property
    def lr_scale(self) -> float:
        """The lr multiplier set by :meth:`set_lr_scale`."""
        return self._lrs.scale

    def set_lr(self, lr: float) -> None:
        """Set every group's base lr (the schedule and scale still apply on top)."""
        optimizer = self._require_optimizer("set_lr")
        self._lrs.set_base(lr, len(optimizer.param_groups))
        self._apply_lr()

    @property
    def training_step(self) -> int:
        """Optimizer steps taken (increments once per effective :meth:`step`)."""
        return self._training_step

    def current_lrs(self) -> list[float]:
        """The lr each group gets at the current training step."""
        return self._lrs.current(self._training_step)

    def _apply_lr(self) -> None:
        self._lrs.apply(self.optimizer, self._training_step)

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
        return self._precision.autocast()

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
        self._guard.set_policy(policy, max_consecutive_skips)

    @property
    def nonfinite_policy(self) -> str:
        """``"stop"`` or ``"skip"`` (see :meth:`set_nonfinite_policy`)."""
        return self._guard.policy

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient (policy ``"skip"``)."""
        return self._guard.skipped

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``, divided by ``accumulate`` and scaled for fp16.

        The graph is kept (``create_graph=True``) when the optimizer's spec
        declares :attr:`~optiplug.OptimizerSpec.create_graph` (AdaHessian).

        A non-finite loss is not backpropagated (under DDP: on any rank, then
        on none): with the ``"stop"`` policy it raises, with ``"skip"`` this
        accumulation's step will be skipped. The parameters are screened then,
        not after every step: an earlier step that left one non-finite (an
        update that overflowed) shows first in the loss, and is reported as
        such under either policy.

        Raises:
            GraphError: a non-finite loss under the ``"stop"`` policy (the
                gradients accumulated so far are dropped, nothing is applied);
                or, under either policy, parameters an earlier step left
                non-finite.
        """
        if self._guard.loss_nonfinite(loss):
            self._stop_if_parameters_nonfinite(self.parameters())
            if self._guard.policy == "skip":
                self._guard.pending = True
                return
            self._drop_accumulation()
            raise self._guard.loss_error(loss, self._training_step)
        loss = self._precision.scale(loss / self.accumulate)
        create_graph = self.optimizer is not None and step_needs(self.optimizer)[1]
        loss.backward(create_graph=create_graph)  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated

    def _drop_accumulation(self) -> None:
        """Forget this accumulation: zero the gradients, put the buffers back, rewind the counter."""
        self._discard_gradients()
        self._micro_step -= self._micro_step % self.accumulate
        self._guard.pending = False

    def _discard_gradients(self) -> None:
        """Zero the gradients (FSDP's unsynchronised ones too) and put the buffers back."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self._parallel == "fsdp":  # and those FSDP kept unsharded, unsynchronised
            discard_unsynced_gradients(self.module)
        self._buffers.restore()

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
                policy: nothing applied); or too many skips in a row. A step
                that leaves a parameter non-finite is reported by the next
                :meth:`backward` (its loss is then non-finite), and
                :meth:`save` refuses a non-finite parameter, buffer or
                optimizer state.
        """
        optimizer = self._require_optimizer("step")
        if not self._optimizer_training and has_train_eval(optimizer):
            raise GraphError(
                f"{type(optimizer).__name__} is in eval mode, so the gradients were taken at "
                "its evaluation point: call graph.train() before the forward pass"
            )
        self._micro_step += 1
        if self._micro_step % self.accumulate:
            return False
        if self._guard.pending:
            return self._skip()
        trainable = self.parameters()  # walked once per step: clipping and the screen share it
        norm = self._clip.total_norm(trainable) if self.scaler is None else None
        if self._gradient_nonfinite(norm, trainable):
            return self._skip()
        self._apply_lr()
        stepped = self._precision.step(
            optimizer,
            lambda: self._clip.clip(trainable, norm),
            unscale=self._clip.setting is not None,
        )
        self._buffers.keep()  # the forwards' buffer updates belong to this step now
        optimizer.zero_grad(set_to_none=True)
        if stepped:
            self._training_step += 1
            self._guard.consecutive = 0
        return stepped

    def _gradient_nonfinite(
        self, norm: torch.Tensor | None, trainable: list[torch.nn.Parameter]
    ) -> bool:
        """Whether to skip for a non-finite gradient; raises under ``"stop"``.

        With fp16 the GradScaler makes that decision itself. With clipping,
        the total ``norm`` it measured answers: a finite one proves every
        gradient finite (NaN and inf propagate into it), so the gradients
        are reduced again only when it is not (it may have overflowed).
        """
        if self.scaler is not None or (norm is not None and bool(norm.isfinite())):
            return False
        name = self._guard.nonfinite_gradient(self.module, self._parallel, trainable)
        if name is None:
            return False
        if self._guard.policy == "skip":
            return True
        self._micro_step -= self.accumulate
        self._drop_accumulation()
        raise self._guard.gradient_error(name, self._training_step)

    def _skip(self) -> bool:
        self._discard_gradients()
        self._guard.count_skip(self._training_step)
        return False

    def _stop_if_parameters_nonfinite(self, trainable: list[torch.nn.Parameter]) -> None:
        found = self._guard.nonfinite_parameter(self.module, self._parallel, trainable)
        if found is not None:
            raise self._guard.state_error(found, self._training_step)

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
        self._clip.set(max_norm, norm_type)

    @property
    def grad_clip(self) -> tuple[float, float] | None:
        """``(max_norm, norm_type)`` set by :meth:`set_grad_clip`, or None."""
        return self._clip.setting

    @property
    def last_grad_norm(self) -> float | None:
        """The global gradient norm of the last optimizer step, before clipping.

        None until a step has run with clipping set (the norm is only computed
        then). Under fp16 it is the unscaled norm; a step the GradScaler
        skipped for inf/NaN gradients leaves ``inf`` or ``nan`` here.
        """
        return self._clip.last_norm

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
        self._data.bind(loader, forward_input, self.module)

    @property
    def data_num_batches(self) -> int:
        """Batches per epoch (per rank under DDP)."""
        return self._data.require("data_num_batches").num_batches

    @property
    def data_batch_size(self) -> int | None:
        """The loader's batch size (per rank under DDP)."""
        return self._data.require("data_batch_size").batch_size

    def epoch(self, n: int) -> Iterator[Mapping[str, Any]]:
        """Iterate over epoch ``n``'s batches (resuming mid-epoch after :meth:`load`).

        While the iterator is live, :meth:`set_data_loader` refuses to rebind.

        Raises:
            GraphError: no loader bound.
        """
        return self._data.epoch(n)

    def train(self, mode: bool = True) -> Graph:
        """Put the module and the optimizer in training (True) or evaluation mode.

        The optimizer is switched only when it has a train/eval lifecycle
        (schedule-free methods: their parameters are the averaged point in
        eval mode). The Graph keeps the optimizer in eval mode while it saves
        a checkpoint and returns it to this mode afterwards.

        Args:
            mode: True to train, False to evaluate.

        Returns:
            This Graph.
        """
        self.module.train(mode)
        self._optimizer_training = mode
        if self.optimizer is not None:
            set_training(self.optimizer, mode)
        return self

    def eval(self) -> Graph:
        """``train(False)``: evaluate at the point the optimizer evaluates (see :meth:`train`)."""
        return self.train(False)

    def forward_batch(self, batch: Mapping[str, Any]) -> Any:
        """Run the (DDP-wrapped) module on a batch, under the precision's autocast.

        A module in training mode puts a train/eval optimizer in train mode
        first (see :meth:`train`).

        Returns:
            The module's output for ``batch[forward_input]`` and the keyword fields.
        """
        if self.module.training and not self._optimizer_training:
            self.train()
        inputs, keywords = self._data.inputs(batch)
        last = (self._micro_step + 1) % self.accumulate == 0
        with self.autocast(), gradient_sync(self.model, self._parallel, last):
            return self.model(inputs, **keywords)

    def targets(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch's target fields (neither the primary nor a keyword input), on the device."""
        return self._data.targets(batch)

    @property
    def data_position(self) -> tuple[int, int]:
        """``(epoch, batches consumed in it)``: where :meth:`epoch` resumes after :meth:`load`."""
        return self._data.position

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
        found = self._guard.nonfinite_state(self.module, optimizer, self._parallel)
        found = agreed_name(found or self._buffers.first_made_nonfinite())
        set_training(optimizer, False)  # a train/eval optimizer saves its evaluation point
        try:
            self._checkpoints.save(path, optimizer, self._state(), found)
        finally:
            set_training(optimizer, self._optimizer_training)

    def _state(self) -> dict[str, Any]:
        return {
            "training_step": self._training_step,
            "micro_step": self._micro_step,
            "lr_scale": self._lrs.scale,
            "base_lrs": list(self.base_lrs),
            "schedule": self.schedule.to_dict() if self.schedule is not None else None,
            "data_position": list(self._data.position),
            "accumulate": self.accumulate,
            "world_size": self.world_size,
            "python_rng": jsonable(random.getstate()),
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
        scaler = self.device.type if self.scaler is not None else None
        self._restore(self._checkpoints.load(path, optimizer, scaler))
        # the checkpoint holds a train/eval optimizer in eval mode: back to this Graph's
        set_training(optimizer, self._optimizer_training)

    def _restore(self, record: GraphRecord) -> None:
        self._training_step = record.training_step
        self._micro_step = record.micro_step
        self._lrs.scale = record.lr_scale
        self.base_lrs = list(record.base_lrs)
        self.schedule = record.schedule
        self._data.position = record.data_position
        self._guard.pending = False
        self._guard.consecutive = 0
        record.apply_rng()
        if self.scaler is not None and record.scaler:
            self.scaler.load_state_dict(record.scaler)
        self._apply_lr()
        self._buffers.keep()


Graph.__module__ = "optiplug"  # its public home: pickles and docs name optiplug.Graph

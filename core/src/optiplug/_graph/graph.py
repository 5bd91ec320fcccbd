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
steps the optimizer, zeros the gradients and increments ``training_step``.
Under ``torch.distributed`` the module is wrapped in DDP and the loader is
sharded with a ``DistributedSampler``.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from .. import checkpoint
from .._api import factory as make_factory
from .._api import schedule as build_schedule
from .._checkpoint.format import read_checkpoint
from .._core import autotune as _autotune
from .._core import ranks as _ranks
from .._schedules.base import Schedule
from ..checkpoint import extra_tensors, load_stored
from ..errors import CheckpointError, GraphError, HyperparameterError

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
            advances neither the schedule nor ``training_step``).
        seed: seeds the per-epoch shuffling of a shuffling loader.

    Raises:
        HyperparameterError: a bad ``accumulate`` or ``precision``.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        device: str | torch.device | None = None,
        accumulate: int = 1,
        precision: str | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise HyperparameterError(
                "accumulate", accumulate, "must be an integer >= 1", algorithm="Graph"
            )
        if precision not in _PRECISIONS:
            raise HyperparameterError(
                "precision", precision, "must be None, 'bf16' or 'fp16'", algorithm="Graph"
            )
        first = next(module.parameters(), None)
        self.device = (
            torch.device(device)
            if device is not None
            else (first.device if first is not None else torch.device("cpu"))
        )
        self.module = module.to(self.device)
        self.model = self._wrap(self.module)
        self.accumulate = accumulate
        self.precision = precision
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
        self.scaler = torch.amp.GradScaler(self.device.type) if precision == "fp16" else None

    def _wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if not _ranks.active():
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

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

    def _ranks_agree(self) -> contextlib.AbstractContextManager[Any]:
        """Under DDP, every rank picks the same measured implementation (see _autotune)."""
        if not _ranks.active():
            return contextlib.nullcontext()
        nccl = torch.distributed.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        return _autotune.agreed_across_ranks(device)

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
        """The autocast context for the chosen precision (a no-op without one)."""
        dtype = _PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``, divided by ``accumulate`` and scaled for fp16."""
        loss = loss / self.accumulate
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated

    def step(self) -> bool:
        """Count one micro-batch; every ``accumulate``-th, take an optimizer step.

        The step sets each group's lr to base * schedule(training_step) *
        lr_scale, steps, zeros the gradients and increments ``training_step``
        (unless fp16 gradient scaling skipped it for inf/NaN gradients).

        Returns:
            True when the optimizer stepped.

        Raises:
            GraphError: no optimizer set.
        """
        optimizer = self._require_optimizer("step")
        self._micro_step += 1
        if self._micro_step % self.accumulate:
            return False
        self._apply_lr()
        stepped = self._optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        if stepped:
            self._training_step += 1
        return stepped

    def _optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before

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
        """
        last = (self._micro_step + 1) % self.accumulate == 0
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

        Raises:
            GraphError: no optimizer set.
            CheckpointError: ``path`` holds something other than a checkpoint.
        """
        optimizer = self._require_optimizer("save")
        if self.rank == 0:
            tensors = {f"model/{k}": v for k, v in self.module.state_dict().items()}
            tensors.update(_torch_rng_states())
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
            "numpy_rng": _numpy_rng_state(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load(self, path: str | os.PathLike[str]) -> None:
        """Resume from :meth:`save`'s checkpoint: everything is verified before anything changes.

        The checkpoint's optimizer state, schedule, base lrs, lr scale, counters,
        RNG states and data position replace this graph's; the optimizer
        must already be set (same algorithm, same parameters).

        Raises:
            GraphError: no optimizer set.
            CheckpointError: damaged files, or model tensors that do not fit the module.
            StateDictError: optimizer state that does not fit the optimizer.
        """
        optimizer = self._require_optimizer("load")
        stored = read_checkpoint(Path(path))
        tensors = extra_tensors(stored)
        state = _graph_state(stored.metadata.get("extra", {}), path)
        model_state = {
            k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")
        }
        self._check_model_state(model_state, path)
        schedule = _schedule_from(state["schedule"])
        load_stored(stored, optimizer, strict=True)
        self.module.load_state_dict(model_state)
        self._restore(state, schedule, tensors)

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

    def _restore(
        self,
        state: Mapping[str, Any],
        schedule: Schedule | None,
        tensors: Mapping[str, torch.Tensor],
    ) -> None:
        self._training_step = int(state["training_step"])
        self._micro_step = int(state["micro_step"])
        self._lr_scale = float(state["lr_scale"])
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]
        self.schedule = schedule
        self._position = (int(state["data_position"][0]), int(state["data_position"][1]))
        random.setstate(_tupled(state["python_rng"]))
        np.random.set_state(_numpy_state_from(state["numpy_rng"]))
        _set_torch_rng_states(tensors)
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self._apply_lr()


_GRAPH_KEYS = (
    "training_step",
    "micro_step",
    "lr_scale",
    "base_lrs",
    "schedule",
    "data_position",
    "python_rng",
    "numpy_rng",
)


def _graph_state(extra: Mapping[str, Any], path: Any) -> Mapping[str, Any]:
    state = extra.get("graph") if isinstance(extra, Mapping) else None
    if not isinstance(state, Mapping) or any(key not in state for key in _GRAPH_KEYS):
        raise CheckpointError(
            f"{path}: not a Graph checkpoint (saved by optiplug.checkpoint.save, not Graph.save?)"
        )
    return state


def _schedule_from(saved: Mapping[str, Any] | None) -> Schedule | None:
    return build_schedule(**saved) if saved else None


def _jsonable(value: Any) -> Any:
    return [_jsonable(item) for item in value] if isinstance(value, (tuple, list)) else value


def _tupled(value: Any) -> Any:
    return tuple(_tupled(item) for item in value) if isinstance(value, list) else value


_LegacyRngState = tuple[str, "np.ndarray[Any, np.dtype[np.uint32]]", int, int, float]
"""``np.random.get_state()`` of the global MT19937 generator (numpy's stubs also allow a dict)."""


def _numpy_rng_state() -> list[Any]:
    kind, keys, position, has_gauss, cached = cast(_LegacyRngState, np.random.get_state())
    return [kind, keys.tolist(), int(position), int(has_gauss), float(cached)]


def _numpy_state_from(saved: list[Any]) -> tuple[Any, ...]:
    kind, keys, position, has_gauss, cached = saved
    return (kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached)


def _torch_rng_states() -> dict[str, torch.Tensor]:
    states = {"rng/torch_cpu": torch.get_rng_state()}
    # torch leaves cuda.is_initialized unannotated
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states.update({f"rng/cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states


def _set_torch_rng_states(tensors: Mapping[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["rng/torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng/cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


Graph.__module__ = "optiplug"  # its public home: pickles and docs name optiplug.Graph

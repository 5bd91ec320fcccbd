"""A Graph's data: the bound loader, its sharding, the epochs and the data position.

A map-style ``DataLoader`` is rebuilt with its own generator (re-seeded from
``(seed, epoch)``) and, when it shuffles or runs distributed, a
``DistributedSampler``, so creating an epoch iterator never draws from the
global RNG and a resumed run sees the same order.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from .._core import ranks as _ranks
from ..errors import GraphError

__all__ = ["DataBinding", "DataFeed"]


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


class DataFeed:
    """The loader a Graph is bound to, where it stands in it, and batches moved to the device.

    Args:
        device: where batches go.
        seed: seeds the per-epoch shuffling.
    """

    def __init__(self, device: torch.device, seed: int) -> None:
        self._device = device
        self._seed = seed
        self.binding: DataBinding | None = None
        self._live_epochs = 0
        self.position = (0, 0)  # (epoch, batches consumed in it)

    def bind(self, loader: Any, forward_input: str, module: torch.nn.Module) -> None:
        """Bind ``loader`` (rebuilt by :meth:`_sharded`); see ``Graph.set_data_loader``.

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
        self.binding = DataBinding(loader, forward_input, fields, _forward_keywords(module))

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
                num_replicas=_ranks.world_size(),
                rank=_ranks.rank(),
                shuffle=shuffle,
                seed=self._seed,
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
            generator=torch.Generator().manual_seed(self._seed),
        )

    def require(self, caller: str) -> DataBinding:
        """The binding, for ``Graph.<caller>``.

        Raises:
            GraphError: no loader bound.
        """
        if self.binding is None:
            raise GraphError(f"Graph.{caller}: call set_data_loader() first")
        return self.binding

    def epoch(self, n: int) -> Iterator[Mapping[str, Any]]:
        """Epoch ``n``'s batches, resuming at :attr:`position` when it is in epoch ``n``.

        Raises:
            GraphError: no loader bound.
        """
        binding = self.require("epoch")
        sampler = getattr(binding.loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(n)
        generator = getattr(binding.loader, "generator", None)
        if isinstance(generator, torch.Generator):
            generator.manual_seed(self._seed * 1_000_003 + n)
        skip = self.position[1] if self.position[0] == n else 0
        return self._iterate(binding, n, skip)

    def _iterate(self, binding: DataBinding, n: int, skip: int) -> Iterator[Mapping[str, Any]]:
        self._live_epochs += 1
        try:
            self.position = (n, skip)
            for index, batch in enumerate(itertools.islice(binding.loader, skip, None), start=skip):
                self.position = (n, index + 1)
                yield batch
            self.position = (n + 1, 0)
        finally:
            self._live_epochs -= 1

    def to_device(self, value: Any) -> Any:
        """``value`` on the training device when it is a tensor, else itself."""
        return (
            value.to(self._device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        )

    def inputs(self, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The primary input and the keyword inputs of ``batch``, on the device."""
        binding = self.require("forward_batch")
        inputs = self.to_device(batch[binding.forward_input])
        keywords = {name: self.to_device(batch[name]) for name in binding.keyword_inputs}
        return inputs, keywords

    def targets(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The target fields of ``batch``, on the device."""
        binding = self.require("targets")
        return {name: self.to_device(batch[name]) for name in binding.targets}

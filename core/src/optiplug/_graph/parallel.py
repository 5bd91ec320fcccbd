"""How a Graph's module trains under ``torch.distributed``: DDP or FSDP2, and ranks that agree.

:func:`wrap_module` wraps the module in ``DistributedDataParallel`` (or shards
it with :func:`~optiplug._graph.fsdp.shard_module`); :func:`gradient_sync`
defers the gradient reduction of every micro-batch but the last of an
accumulation; :func:`ranks_agree`, :func:`all_ranks_finite` and
:func:`agreed_name` make every rank take the same decision.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from .._choice.chooser import chooser_of
from .._core import ranks as _ranks
from .finite import all_finite
from .fsdp import set_gradient_sync, shard_module

__all__ = [
    "agreed_name",
    "all_ranks_finite",
    "any_rank",
    "collective_device",
    "gradient_sync",
    "ranks_agree",
    "wrap_module",
]


def collective_device() -> torch.device:
    """Where a collective's tensors live: the current CUDA device under NCCL, else the CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def wrap_module(
    module: torch.nn.Module,
    device: torch.device,
    parallel: str,
    fsdp_min_params: int,
    dtype: torch.dtype | None,
) -> torch.nn.Module:
    """The module the forward passes run: sharded (FSDP), DDP-wrapped, or itself.

    Args:
        module: the module, already on ``device``.
        device: the training device.
        parallel: ``"ddp"`` or ``"fsdp"``.
        fsdp_min_params: the parameters of an FSDP unit (see ``shard_module``).
        dtype: the compute dtype of FSDP's mixed precision, or None.

    Returns:
        The module to call: under FSDP the module itself, sharded in place.
    """
    if parallel == "fsdp":
        return shard_module(module, device, fsdp_min_params, dtype)
    if not _ranks.active():
        return module
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


def ranks_agree(registry: Any = None) -> contextlib.AbstractContextManager[Any]:
    """Under ``torch.distributed``, every rank picks the same measured implementation.

    Args:
        registry: the registry that will create the optimizer (a factory's
            ``registry``); None for the default one.
    """
    if not _ranks.active():
        return contextlib.nullcontext()
    return chooser_of(registry).agreed_across_ranks(collective_device())


def gradient_sync(
    model: torch.nn.Module, parallel: str, last: bool
) -> contextlib.AbstractContextManager[Any]:
    """DDP's ``no_sync`` for every micro-batch but the ``last`` of an accumulation.

    DDP decides in the forward pass whether the backward all-reduces, so
    the forward of a non-final micro-batch runs without synchronisation
    and its gradients accumulate locally; the last one syncs them all.
    Under FSDP the same is ``set_requires_gradient_sync(False)`` on the
    sharded module before the backward of a non-final micro-batch (its
    gradients accumulate unsharded) and True before the last one, whose
    backward reduce-scatters the sum once.
    """
    if parallel == "fsdp":  # FSDP2 decides in the backward, from this flag
        set_gradient_sync(model, last)
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)
    if last or no_sync is None:
        return contextlib.nullcontext()
    unsynced: contextlib.AbstractContextManager[Any] = no_sync()
    return unsynced


def any_rank(flag: torch.Tensor) -> bool:
    """Whether a 0/1 flag is set here or, under ``torch.distributed``, on any rank."""
    flag = flag.to(torch.int32)
    if _ranks.active():
        flag = flag.to(collective_device())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag)


def all_ranks_finite(values: list[Any], parallel: str) -> bool:
    """:func:`all_finite` of this rank's values (DTensors: their local shards), agreed.

    Under FSDP the shards differ between ranks, so one MAX all-reduce of
    "something is not finite here" gives every rank the same answer;
    under DDP (or one process) the values are identical everywhere and
    nothing is communicated.
    """
    finite = all_finite(values)
    if parallel != "fsdp":
        return finite
    flag = torch.tensor([0 if finite else 1], dtype=torch.int32, device=collective_device())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return not bool(flag.item())


def agreed_name(found: str | None) -> str | None:
    """The first rank's ``found`` that is not None, the same on every rank (collective)."""
    if not _ranks.active():
        return found
    everyone: list[str | None] = [None] * _ranks.world_size()
    torch.distributed.all_gather_object(everyone, found)
    return next((name for name in everyone if name is not None), None)

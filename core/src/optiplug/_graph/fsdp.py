"""Fully sharded data parallelism for a Graph: PyTorch's FSDP2 (``fully_shard``) applied per unit.

``Graph(module, parallel="fsdp")`` shards the module with
``torch.distributed.fsdp.fully_shard``: every parameter becomes a ``DTensor``
sharded on its first dimension over all ranks, gathered for each unit's
forward and backward, and its gradient is reduce-scattered, so each rank
holds only its shard of the parameters, the gradients and the optimizer
state. This module decides which submodules become their own unit
(:func:`shard_module`), maps the Graph's precision to FSDP2's
``MixedPrecisionPolicy`` (:func:`mixed_precision`) and drops gradients that an
accumulation kept unsynchronised (:func:`discard_unsynced_gradients`). The
sharding itself is PyTorch's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .._core import ranks as _ranks
from ..errors import GraphError, HyperparameterError

__all__ = [
    "DEFAULT_FSDP_MIN_PARAMS",
    "PARALLEL_MODES",
    "check_fsdp_min_params",
    "check_parallel",
    "discard_unsynced_gradients",
    "mixed_precision",
    "set_gradient_sync",
    "shard_module",
    "unit_names",
]

PARALLEL_MODES = ("ddp", "fsdp")
"""How a Graph trains under ``torch.distributed``: replicated (DDP) or fully sharded (FSDP2)."""

DEFAULT_FSDP_MIN_PARAMS = 100_000
"""Parameters a submodule must hold to become its own FSDP unit (one all-gather and one
reduce-scatter per forward and backward). Below about 100,000 parameters (400 KB in fp32) a
collective costs more in latency than its bytes, so smaller modules ride with their parent."""

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
_UNIT_NAMES = "_optiplug_fsdp_units"


def check_parallel(parallel: Any) -> str:
    """Validate the ``parallel`` argument of a Graph.

    Args:
        parallel: ``"ddp"`` or ``"fsdp"``.

    Returns:
        ``parallel``.

    Raises:
        HyperparameterError: any other value (field ``parallel``).
    """
    if not isinstance(parallel, str) or parallel not in PARALLEL_MODES:
        raise HyperparameterError(
            "parallel", parallel, "must be 'ddp' or 'fsdp'", algorithm="Graph"
        )
    return parallel


def check_fsdp_min_params(value: Any) -> int:
    """Validate ``fsdp_min_params``: an integer >= 1.

    Args:
        value: the threshold given to the Graph.

    Returns:
        ``value``.

    Raises:
        HyperparameterError: not an integer >= 1 (field ``fsdp_min_params``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HyperparameterError(
            "fsdp_min_params", value, "must be an integer >= 1", algorithm="Graph"
        )
    return value


def mixed_precision(dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """FSDP2's policy for a Graph precision: compute in ``dtype``, reduce gradients in fp32.

    The sharded parameters, their gradients and the optimizer state stay in
    the parameters' own dtype; each unit's all-gathered parameters are cast
    to ``dtype`` for its forward and backward, and gradients are
    reduce-scattered in float32. Autocast is not used under FSDP.

    Args:
        dtype: ``torch.bfloat16``, ``torch.float16``, or None (full precision).

    Returns:
        The policy (the default policy, changing nothing, for None).
    """
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _units(module: torch.nn.Module, prefix: str, min_params: int) -> list[tuple[str, Any]]:
    """The submodules that become their own unit, outermost (largest) first.

    A child holding at least ``min_params`` parameters is a unit and its own
    children are not visited; a container (``ModuleList``, ``ModuleDict``,
    ``Sequential``) is never a unit itself: its children are visited instead,
    so a stack of transformer blocks gives one unit per block.
    """
    found: list[tuple[str, Any]] = []
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, _CONTAINERS):
            found += _units(child, f"{path}.", min_params)
        elif _count(child) >= min_params:
            found.append((path, child))
    return found


def shard_module(
    module: torch.nn.Module, device: torch.device, min_params: int, dtype: torch.dtype | None
) -> torch.nn.Module:
    """Apply ``fully_shard`` to each large submodule, then to ``module`` itself.

    Units are chosen top-down: the largest submodules holding at least
    ``min_params`` parameters each (descending through containers, so each
    transformer block of a ``ModuleList`` is one); the root unit takes every
    parameter left. The mesh is one-dimensional over every rank of the
    default process group (world 1 included). With a compute ``dtype`` the
    root also casts the module's output to float32, so a loss computed from
    it is float32; the root reshards after its forward like every unit.

    Args:
        module: the module, already on ``device``; sharded in place.
        device: where it trains (the mesh's device type).
        min_params: parameters a submodule needs to be its own unit.
        dtype: the compute dtype (:func:`mixed_precision`), or None.

    Returns:
        ``module``, now an ``FSDPModule`` whose parameters are DTensors.

    Raises:
        GraphError: no ``torch.distributed`` process group is initialised.
    """
    if not _ranks.active():
        raise GraphError(
            "Graph(parallel='fsdp') needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group(...), world size 1 included); "
            "without one use parallel='ddp', which trains in this process alone"
        )
    mesh = init_device_mesh(device.type, (_ranks.world_size(),))
    policy = mixed_precision(dtype)
    units = _units(module, "", min_params)
    for _, unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    root_policy = (
        policy
        if dtype is None
        else MixedPrecisionPolicy(
            param_dtype=dtype, reduce_dtype=torch.float32, output_dtype=torch.float32
        )
    )
    # the root reshards after its forward too (FSDP2 keeps it gathered by default): outside a
    # forward or backward every parameter is then its DTensor shard, also after an evaluation
    # under no_grad, so saving, measuring or checking the module always sees the shards
    fully_shard(module, mesh=mesh, mp_policy=root_policy, reshard_after_forward=True)
    setattr(module, _UNIT_NAMES, tuple(name for name, _ in units))
    return module


def unit_names(module: torch.nn.Module) -> tuple[str, ...]:
    """The submodules :func:`shard_module` made their own unit (the root not counted)."""
    names: tuple[str, ...] = getattr(module, _UNIT_NAMES, ())
    return names


def set_gradient_sync(module: torch.nn.Module, sync: bool) -> None:
    """Whether the next backward reduce-scatters gradients (False: they accumulate unsharded).

    Args:
        module: the sharded root.
        sync: True on an accumulation's last micro-batch.
    """
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(sync)


def discard_unsynced_gradients(module: torch.nn.Module) -> None:
    """Drop the unsharded gradients that backwards without synchronisation accumulated.

    With ``set_requires_gradient_sync(False)``, FSDP2 keeps each unit's
    gradients unsharded (on the unsharded parameter, or in a float32 buffer
    under a mixed-precision policy) until a synchronising backward
    reduce-scatters them; ``optimizer.zero_grad`` never sees them. When a
    Graph drops an accumulation (a non-finite loss), they must go too, or
    the next accumulation would add them in. FSDP2 has no public call for
    this, so its per-parameter records are cleared here.

    Args:
        module: the sharded root.
    """
    for unit in module.modules():
        if not isinstance(unit, FSDPModule):
            continue
        group = getattr(unit._get_fsdp_state(), "_fsdp_param_group", None)
        for record in getattr(group, "fsdp_params", ()):
            record.unsharded_accumulated_grad = None
            unsharded = getattr(record, "_unsharded_param", None)
            if unsharded is not None:
                unsharded.grad = None

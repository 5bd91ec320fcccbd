"""Between optimizers and checkpoint metadata: what ``save`` writes and ``load`` rebuilds."""

from __future__ import annotations

import datetime
import platform
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import safetensors
import torch

from .._core.builtin import version as optiplug_version
from .._core.params import GROUP_META_KEYS
from .._core.specs import OptimizerSpec
from .._lazy import LazyCallable
from .._state.check import Target, TargetGroup
from .._state.values import ParamInfo
from ..errors import CheckpointError
from .format import FORMAT, SCHEMA_VERSION, Stored, decode, encode

__all__ = ["dtype_named", "snapshot", "state_dict_from", "stored_target", "unshared"]


def snapshot(
    optimizer: Any,
    spec: OptimizerSpec,
    extra: Mapping[str, Any],
    state_dict: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Describe ``optimizer`` for a checkpoint.

    Args:
        optimizer: the optimizer to save.
        spec: its algorithm.
        extra: JSON-serialisable user data.
        state_dict: ``optimizer.state_dict()`` when the caller already has it.

    Returns:
        The metadata (without the tensor-file fields) and the tensors to
        store, by name.

    Raises:
        CheckpointError: a state or hyperparameter value that cannot be stored.
    """
    state_dict = optimizer.state_dict() if state_dict is None else state_dict
    tensors: dict[str, torch.Tensor] = {}
    groups = [_group_record(i, g, tensors) for i, g in enumerate(state_dict["param_groups"])]
    state = {_state_key(k): _entry_record(k, v, tensors) for k, v in state_dict["state"].items()}
    metadata = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "checkpoint_id": uuid.uuid4().hex,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **_origin(optimizer, spec),
        "parameters": _parameters(optimizer),
        "param_groups": groups,
        "state": state,
        "extra": dict(extra),
    }
    return metadata, unshared(tensors)


def _origin(optimizer: Any, spec: OptimizerSpec) -> dict[str, Any]:
    cls = type(optimizer)
    impl = getattr(optimizer, "impl", None)
    provider = spec.provider
    plugin = None
    if provider is not None:
        plugin = {
            "plugin": provider.plugin,
            "distribution": provider.distribution,
            "version": provider.version,
        }
    return {
        "algorithm": spec.name,
        "implementation": impl if isinstance(impl, str) else None,
        "optimizer_class": f"{cls.__module__}:{cls.__qualname__}",
        "plugin": plugin,
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    return {
        "optiplug": optiplug_version(),
        "torch": str(torch.__version__),
        "safetensors": str(safetensors.__version__),
        "python": platform.python_version(),
    }


def _parameters(optimizer: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for group_index, group in enumerate(optimizer.param_groups):
        names = group.get("param_names") or [None] * len(group["params"])
        for name, param in zip(names, group["params"], strict=True):
            record = {
                "index": len(records),
                "name": name,
                "group": group_index,
                "shape": list(param.shape),
                "dtype": str(param.dtype).removeprefix("torch."),
            }
            records.append(record)
    return records


def _group_record(index: int, group: Mapping[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    hyperparameters = {
        key: encode(value, f"group.{index}.{key}", tensors)
        for key, value in group.items()
        if key not in GROUP_META_KEYS
    }
    names = group.get("param_names")
    return {
        "params": list(group["params"]),
        "param_names": list(names) if names is not None else None,
        "hyperparameters": hyperparameters,
    }


def _state_key(key: Any) -> str:
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return str(key)
    raise CheckpointError(f"cannot save state keyed by {key!r}: expected parameter ids (>= 0)")


def _entry_record(key: int, entry: Mapping[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    record = {}
    for slot, value in entry.items():
        if not isinstance(slot, str):
            raise CheckpointError(f"cannot save state slot {slot!r} of parameter {key}")
        record[slot] = encode(value, f"state.{key}.{slot}", tensors)
    return record


def unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clone tensors sharing storage with an earlier one (safetensors refuses shared memory)."""
    seen: set[int] = set()
    result = {}
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr() if tensor.numel() else -1
        result[name] = tensor.clone() if pointer in seen else tensor
        if pointer != -1:
            seen.add(pointer)
    return result


def state_dict_from(stored: Stored) -> dict[str, Any]:
    """Rebuild the optimizer state dict a verified checkpoint holds.

    Args:
        stored: what :func:`~optiplug._checkpoint.format.read_checkpoint`
            returned (its schema and values are checked: this cannot fail).

    Returns:
        ``{"state": ..., "param_groups": ...}`` as ``Optimizer.state_dict()``.
    """
    metadata, tensors = stored.metadata, stored.tensors
    groups = [_group_from(i, g, tensors) for i, g in enumerate(metadata["param_groups"])]
    state = {
        int(key): {slot: decode(v, tensors, f"state {key}") for slot, v in entry.items()}
        for key, entry in metadata["state"].items()
    }
    return {"state": state, "param_groups": groups}


def _group_from(
    index: int, record: Mapping[str, Any], tensors: Mapping[str, Any]
) -> dict[str, Any]:
    where = f"param group {index}"
    group = {k: decode(v, tensors, where) for k, v in record["hyperparameters"].items()}
    group["params"] = list(record["params"])
    if record.get("param_names") is not None:
        group["param_names"] = list(record["param_names"])
    return group


def dtype_named(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``"float32"``).

    Raises:
        CheckpointError: not a torch dtype name.
    """
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"metadata.json is malformed: unknown dtype {name!r}")
    return dtype


def stored_target(
    stored: Stored,
    state_dict: Mapping[str, Any],
    spec: OptimizerSpec,
    others: tuple[OptimizerSpec, ...],
) -> Target:
    """The parameters and groups a checkpoint recorded, as a validation target."""
    records = stored.metadata["parameters"]
    groups = []
    for index, group in enumerate(state_dict["param_groups"]):
        params = tuple(
            ParamInfo(tuple(r["shape"]), dtype_named(r["dtype"]))
            for r in records
            if r["group"] == index
        )
        names = tuple(group["param_names"]) if "param_names" in group else None
        hyperparameters = {k: v for k, v in group.items() if k not in GROUP_META_KEYS}
        groups.append(TargetGroup(params, names, hyperparameters))
    return Target(spec, tuple(groups), others, _second_moments(spec))


def _second_moments(spec: OptimizerSpec) -> frozenset[str] | None:
    """The ``second_moments`` of the class ``spec`` builds, where it is imported; else None."""
    factory: Any = spec.factory
    if isinstance(factory, LazyCallable):
        if factory.target.partition(":")[0] not in sys.modules:
            return None
        try:
            factory = factory.resolve()
        except Exception:  # a broken plugin: the table roles go unchecked
            return None
    moments = getattr(factory, "second_moments", None) if isinstance(factory, type) else None
    return moments if isinstance(moments, frozenset) else None

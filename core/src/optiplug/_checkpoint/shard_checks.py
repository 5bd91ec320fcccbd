"""Checks of a sharded state before it is saved or applied: finite values, DCP's index."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.tensor import DTensor

from .._core.specs import Problem
from .manifest import MODEL, OPTIMIZER

__all__: list[str] = []


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _nonfinite(prefix: str, tree: Any) -> list[Problem]:
    """A ``non-finite`` problem for every float tensor in ``tree`` whose local part holds NaN/inf."""
    problems = []
    for key, value in _flat(prefix, tree):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            local = _local(value)
            if local.numel() and not bool(torch.isfinite(local.detach()).all()):
                problems.append(_problem(key, "non-finite", "finite values", "NaN or inf"))
    return problems


def _flat(prefix: str, tree: Any) -> Iterable[tuple[str, Any]]:
    """``(dotted key, leaf)`` for every leaf, as DCP names the entries it stores."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _flat(f"{prefix}.{key}", value)
    elif isinstance(tree, (list, tuple)) and any(
        isinstance(v, (Mapping, torch.Tensor)) for v in tree
    ):
        for index, value in enumerate(tree):
            yield from _flat(f"{prefix}.{index}", value)
    else:
        yield prefix, tree


def _json_ready(name: str, value: Any) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"checkpoint {name} must be JSON-serialisable: {error}") from error


def _dedup(problems: Iterable[Iterable[Problem]]) -> list[Problem]:
    return sorted({problem for batch in problems for problem in batch})


def _against_index(target: Mapping[str, Any], metadata: Metadata) -> list[Problem]:
    """Every key of ``target`` DCP must read: present in the checkpoint, same shape and dtype."""
    index = metadata.state_dict_metadata
    flat, _ = flatten_state_dict(dict(target))
    problems = [
        found for key, value in flat.items() if (found := _mismatch(key, value, index.get(key)))
    ]
    saved_only = (k for k in index if k.startswith((f"{MODEL}.", f"{OPTIMIZER}.state.")))
    problems += [
        _problem(key, "unexpected-key", "absent", "in the checkpoint")
        for key in saved_only
        if key not in flat
    ]
    return problems


def _mismatch(key: str, value: Any, saved: Any) -> Problem | None:
    """What the checkpoint's entry ``saved`` (None: absent) lacks to be read into ``value``."""
    if saved is None:
        return _problem(key, "missing-key", "in the checkpoint", "absent")
    if not isinstance(value, torch.Tensor):
        return None
    if not isinstance(saved, TensorStorageMetadata):
        return _problem(key, "type", "a tensor", "another value")
    if tuple(saved.size) != tuple(value.shape):
        return _problem(key, "shape", str(list(value.shape)), str(list(saved.size)))
    if saved.properties.dtype != value.dtype:
        expected, found = (
            str(d).removeprefix("torch.") for d in (value.dtype, saved.properties.dtype)
        )
        return _problem(key, "dtype", expected, found)
    return None


def _problem(key: str, kind: str, expected: str, found: str) -> Problem:
    return Problem(parameter=key, kind=kind, expected=expected, found=found)

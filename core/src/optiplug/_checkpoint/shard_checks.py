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
                problems.append(
                    Problem(
                        parameter=key,
                        kind="non-finite",
                        expected="finite values",
                        found="NaN or inf",
                    )
                )
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
    problems = []
    wanted = set()
    flat, _ = flatten_state_dict(dict(target))
    for key, value in flat.items():
        wanted.add(key)
        saved = index.get(key)
        if saved is None:
            problems.append(
                Problem(
                    parameter=key, kind="missing-key", expected="in the checkpoint", found="absent"
                )
            )
        elif isinstance(value, torch.Tensor):
            if not isinstance(saved, TensorStorageMetadata):
                problems.append(
                    Problem(parameter=key, kind="type", expected="a tensor", found="another value")
                )
            elif tuple(saved.size) != tuple(value.shape):
                problems.append(
                    Problem(
                        parameter=key,
                        kind="shape",
                        expected=str(list(value.shape)),
                        found=str(list(saved.size)),
                    )
                )
            elif saved.properties.dtype != value.dtype:
                expected, found = (
                    str(d).removeprefix("torch.") for d in (value.dtype, saved.properties.dtype)
                )
                problems.append(
                    Problem(parameter=key, kind="dtype", expected=expected, found=found)
                )
    for key in index:
        if key.startswith((f"{MODEL}.", f"{OPTIMIZER}.state.")) and key not in wanted:
            problems.append(
                Problem(
                    parameter=key,
                    kind="unexpected-key",
                    expected="absent",
                    found="in the checkpoint",
                )
            )
    return problems

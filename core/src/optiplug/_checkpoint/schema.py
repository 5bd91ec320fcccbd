"""Bounded JSON parsing and the schema of a checkpoint's ``COMMITTED`` and ``metadata.json``.

Every check here raises :class:`~optiplug.errors.CheckpointError` naming the
file, never another exception: nesting is bounded before parsing, duplicate
keys, over-long integers and invalid UTF-8 are refused, and every field has
its type, range and cross-references checked (parameter records against the
param groups, state keys, dtype names, the values the metadata encodes and
the tensors they name). :func:`check_metadata` and :func:`check_values` are
what saving and loading both apply, so a checkpoint :func:`~optiplug.checkpoint.save`
writes always passes them.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeGuard

import torch

from ..errors import CheckpointError
from .layout import STRIDED_TAG
from .subclass import TAG as SUBCLASS_TAG
from .subclass import check_encoded

__all__ = [
    "DTYPE_NAMES",
    "MAX_DEPTH",
    "check_marker",
    "check_metadata",
    "check_values",
    "parse_object",
]

MAX_DEPTH = 64
"""The deepest JSON nesting a checkpoint file may have (tags, tuples and extra data included)."""

DTYPE_NAMES = frozenset(
    str(value).removeprefix("torch.")
    for value in vars(torch).values()
    if isinstance(value, torch.dtype)
)
"""The parameter dtype names a checkpoint may record (``"float32"``...)."""

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_ID_LIMIT = 1 << 63
_MAX_DIMS = 64
_ID = re.compile(r"0|[1-9][0-9]{0,18}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_OPENING = frozenset(b"[{")
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "schema_version": int,
    "checkpoint_id": str,
    "created": str,
    "algorithm": str,
    "implementation": (str, type(None)),
    "optimizer_class": str,
    "plugin": (dict, type(None)),
    "versions": dict,
    "parameters": list,
    "param_groups": list,
    "state": dict,
    "tensors": dict,
    "extra": dict,
}


class _DuplicateKeyError(ValueError):
    """A JSON object names a key twice."""


def parse_object(data: bytes, where: Path) -> dict[str, Any]:
    """Parse ``data`` as one JSON object, within bounds.

    Args:
        data: the file's bytes.
        where: the file, for messages.

    Returns:
        The object.

    Raises:
        CheckpointError: invalid UTF-8 or JSON, nesting deeper than
            :data:`MAX_DEPTH`, a duplicate key, an integer too long to
            parse, or not an object.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{where} is not valid JSON (not UTF-8): {error}") from error
    depth = _depth(data)
    if depth > MAX_DEPTH:
        message = (
            f"{where} is not valid JSON for a checkpoint: nested {depth} deep (at most {MAX_DEPTH})"
        )
        raise CheckpointError(message)
    try:
        value = json.loads(text, object_pairs_hook=_unique)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{where} is not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} is not a JSON object")
    return value


def _depth(data: bytes) -> int:
    """The deepest bracket nesting outside strings (an upper bound when unbalanced)."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    steps = (1 if byte in _OPENING else -1 for byte in brackets)
    return max(itertools.accumulate(steps), default=0)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        counts = Counter(key for key, _ in pairs)
        duplicate = next(key for key, count in counts.items() if count > 1)
        raise _DuplicateKeyError(f"duplicate key {duplicate[:80]!r}")
    return result


def check_marker(marker: Mapping[str, Any], where: Path, fmt: str) -> None:
    """Check a parsed commit marker.

    Raises:
        CheckpointError: not an optiplug marker of format ``fmt``.
    """
    ok = marker.get("format") == fmt and isinstance(marker.get("checkpoint_id"), str)
    digest = marker.get("metadata_sha256")
    if not ok or not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
        raise CheckpointError(f"{where} is not an optiplug commit marker")


def check_metadata(metadata: Mapping[str, Any], where: Path, fmt: str, version: int) -> None:
    """Check every field of a parsed ``metadata.json`` but the values it encodes.

    Args:
        metadata: the parsed file.
        where: the file, for messages.
        fmt: the format name it must declare.
        version: the newest schema version this code reads.

    Raises:
        CheckpointError: naming the file and the first field that is wrong.
    """
    _check_header(metadata, where, fmt, version)
    _check_tensor_record(metadata["tensors"], where)
    groups = metadata["param_groups"]
    for index, group in enumerate(groups):
        _check_group(index, group, where)
    _check_parameters(metadata["parameters"], groups, where)
    _check_state_keys(metadata["state"], where)
    if not all(isinstance(v, str) for v in metadata["versions"].values()):
        raise _malformed(where, "field 'versions' must map names to version strings")
    if not isinstance(metadata.get("extra_tensors", {}), dict):
        raise _malformed(where, "field 'extra_tensors' is malformed")


def _malformed(where: Path, detail: str) -> CheckpointError:
    return CheckpointError(f"{where} is malformed: {detail}")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any, limit: int = _ID_LIMIT) -> bool:
    return _is_int(value) and 0 <= value < limit


def _check_header(metadata: Mapping[str, Any], where: Path, fmt: str, newest: int) -> None:
    if metadata.get("format") != fmt:
        raise _malformed(where, f"format is {str(metadata.get('format'))[:80]!r}, expected {fmt!r}")
    version = metadata.get("schema_version")
    if _is_int(version) and version > newest:
        message = (
            f"{where}: checkpoint schema version {version} is newer than this optiplug reads "
            f"({newest}); upgrade optiplug"
        )
        raise CheckpointError(message)
    for key, kind in _FIELDS.items():
        if not isinstance(metadata.get(key), kind):
            raise _malformed(where, f"field {key!r} is missing or has the wrong type")
    if not _is_int(version) or version != newest:
        raise _malformed(where, f"unknown schema version {str(version)[:80]!r}")


def _check_tensor_record(files: Mapping[str, Any], where: Path) -> None:
    digest = files.get("sha256")
    sized = _count(files.get("bytes")) and _count(files.get("count"))
    if not (isinstance(digest, str) and _SHA256.fullmatch(digest) and sized):
        raise _malformed(where, "field 'tensors' lacks a sha256, bytes or count")


def _check_group(index: int, group: Any, where: Path) -> None:
    if not isinstance(group, dict) or not isinstance(group.get("hyperparameters"), dict):
        raise _malformed(where, f"param group {index} is not a record with hyperparameters")
    params, names = group.get("params"), group.get("param_names")
    if not isinstance(params, list) or not all(_count(i) for i in params):
        detail = f"param group {index}: 'params' must be a list of parameter ids (integers >= 0)"
        raise _malformed(where, detail)
    named = isinstance(names, list) and all(isinstance(n, str) for n in names)
    if names is not None and not (named and len(names) == len(params)):
        detail = f"param group {index}: 'param_names' must be null or {len(params)} strings"
        raise _malformed(where, detail)


def _check_parameters(records: list[Any], groups: list[dict[str, Any]], where: Path) -> None:
    expected: list[tuple[int, str | None]] = []
    for index, group in enumerate(groups):
        names = group.get("param_names") or [None] * len(group["params"])
        expected += [(index, name) for name in names]
    if len(records) != len(expected):
        detail = f"{len(records)} parameter records for {len(expected)} parameters in param_groups"
        raise _malformed(where, detail)
    for position, (record, (group_index, name)) in enumerate(zip(records, expected, strict=True)):
        _check_parameter(position, record, group_index, name, where)


def _check_parameter(position: int, record: Any, group: int, name: Any, where: Path) -> None:
    def invalid(detail: str) -> CheckpointError:
        return _malformed(where, f"parameter record {position} {detail}")

    if not isinstance(record, dict):
        raise invalid("is not a record")
    if record.get("index") != position or not _is_int(record.get("index")):
        raise invalid(f"has index {str(record.get('index'))[:40]}, expected {position}")
    if record.get("group") != group or not _is_int(record.get("group")):
        raise invalid(f"has group {str(record.get('group'))[:40]}, param_groups put it in {group}")
    if record.get("name") != name:
        raise invalid(f"has name {str(record.get('name'))[:80]!r}, param_groups say {name!r}")
    shape = record.get("shape")
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS or not all(map(_count, shape)):
        raise invalid(f"has shape {str(shape)[:80]}: expected at most {_MAX_DIMS} sizes >= 0")
    if record.get("dtype") not in DTYPE_NAMES:
        raise invalid(f"has dtype {str(record.get('dtype'))[:40]!r}, not a torch dtype name")


def _check_state_keys(state: Mapping[str, Any], where: Path) -> None:
    for key, entry in state.items():
        if not _ID.fullmatch(key):
            detail = f"state key {key[:40]!r} is not a parameter id (an integer >= 0)"
            raise _malformed(where, detail)
        if not isinstance(entry, dict):
            raise _malformed(where, f"state entry {key} is not a record of slots")


def check_values(metadata: Mapping[str, Any], tensors: Collection[str], where: Path) -> None:
    """Check that every value the metadata encodes decodes (see ``format.decode``).

    Args:
        metadata: metadata that passed :func:`check_metadata`.
        tensors: the names of the tensors in the tensor file.
        where: ``metadata.json``, for messages.

    Raises:
        CheckpointError: a value that is not a number, string, None, tagged
            tuple/list, or a reference to a tensor the file holds.
    """
    for index, group in enumerate(metadata["param_groups"]):
        for key, value in group["hyperparameters"].items():
            _check_value(value, tensors, where, f"param group {index} {key!r}")
    for key, entry in metadata["state"].items():
        for slot, value in entry.items():
            _check_value(value, tensors, where, f"state {key} {slot!r}")
    for name, value in metadata.get("extra_tensors", {}).items():
        _check_value(value, tensors, where, f"extra_tensors {name!r}")


def _check_value(value: Any, tensors: Collection[str], where: Path, label: str) -> None:
    if value is None or isinstance(value, (bool, float, str)):
        return
    if _is_int(value) and _INT_MIN <= value <= _INT_MAX:
        return
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "tensor" and isinstance(inner, str) and inner in tensors:
            return
        if tag == STRIDED_TAG and _strided(inner, tensors):
            return
        if tag in ("tuple", "list") and isinstance(inner, list):
            for item in inner:
                _check_value(item, tensors, where, label)
            return
        if tag == SUBCLASS_TAG:

            def fail() -> None:
                raise _malformed(where, f"{label} holds a malformed tensor-subclass record")

            check_encoded(inner, tensors, lambda v: _check_value(v, tensors, where, label), fail)
            return
    detail = f"{label} holds an undecodable value {str(value)[:80]}"
    if isinstance(value, dict) and value.get("tensor") is not None:
        detail += " (no such tensor in the tensor file)"
    raise _malformed(where, detail)


def _strided(inner: Any, tensors: Collection[str]) -> bool:
    """Whether a strided record names a stored tensor and lists integer strides."""
    return (
        isinstance(inner, Mapping)
        and set(inner) == {"tensor", "stride"}
        and isinstance(inner["tensor"], str)
        and inner["tensor"] in tensors
        and isinstance(inner["stride"], list)
        and all(_is_int(s) for s in inner["stride"])
    )

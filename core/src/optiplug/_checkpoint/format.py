"""The on-disk checkpoint format: encoding, decoding and integrity checks.

A checkpoint is a directory of three files::

    tensors.safetensors   every state tensor (and tensor-valued hyperparameter)
    metadata.json         schema version, algorithm, versions, parameters,
                          groups, state layout, SHA-256 of the tensor file, extra
    COMMITTED             written last: checkpoint id and SHA-256 of metadata.json

Values in ``metadata.json`` that JSON cannot tell apart are tagged: a tuple
is ``{"tuple": [...]}``, a list ``{"list": [...]}`` and a tensor
``{"tensor": "<name in tensors.safetensors>"}`` (``{"strided": {"tensor": ...,
"stride": [...]}}`` for one of another dense layout, see
:mod:`~optiplug._checkpoint.layout`); every other dict is an error.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors.torch import load as safetensors_load

from ..errors import CheckpointError
from .io import OpenDirectory
from .layout import STRIDED_TAG, dense_stride, restrided, strided_record
from .schema import check_marker, check_metadata, check_values, parse_object
from .subclass import TAG as SUBCLASS_TAG
from .subclass import decode_subclass, encode_subclass, is_subclass

__all__ = [
    "ALLOWED_FILES",
    "FORMAT",
    "MARKER",
    "METADATA",
    "SCHEMA_VERSION",
    "TENSORS",
    "Stored",
    "check_stored",
    "decode",
    "encode",
    "read_checkpoint",
    "sha256",
]

FORMAT = "optiplug-checkpoint"
SCHEMA_VERSION = 1
TENSORS = "tensors.safetensors"
METADATA = "metadata.json"
MARKER = "COMMITTED"
ALLOWED_FILES = (TENSORS, METADATA, MARKER)

_ATTEMPTS = 8
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_MARKER_LIMIT = 1 << 16
_METADATA_LIMIT = 1 << 28
_HEADER_LIMIT = 100 * (1 << 20)
_ITEM_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def encode(value: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Encode a state or hyperparameter value for ``metadata.json``.

    Args:
        value: a tensor (a wrapper tensor subclass too, see
            :mod:`optiplug._checkpoint.subclass`), None, bool, int, float,
            str, or a tuple/list of those.
        name: where it lives (``state.0.exp_avg``); also its tensor's name.
        tensors: receives the tensors to store, by name.

    Returns:
        A JSON-serialisable value.

    Raises:
        CheckpointError: a value of another type.
    """
    if is_subclass(value):  # a quantized state: its inner tensors, and how to rebuild it
        return encode_subclass(value, name, tensors, encode)
    if isinstance(value, torch.Tensor):
        tensors[name] = value.detach().to("cpu").contiguous()
        stride = dense_stride(value)
        return {"tensor": name} if stride is None else strided_record(name, stride)
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX:
        raise CheckpointError(f"cannot save {name}: an integer outside the 64-bit range")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        tag = "tuple" if isinstance(value, tuple) else "list"
        return {tag: [encode(item, f"{name}.{i}", tensors) for i, item in enumerate(value)]}
    message = (
        f"cannot save {name}: a {type(value).__name__} is not a tensor, number, string, "
        "None, tuple or list"
    )
    raise CheckpointError(message)


def decode(value: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    """Invert :func:`encode`.

    Raises:
        CheckpointError: a value :func:`encode` cannot have written.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "tensor" and isinstance(inner, str) and inner in tensors:
            return tensors[inner]
        if tag in ("tuple", "list") and isinstance(inner, list):
            items = [decode(item, tensors, where) for item in inner]
            return tuple(items) if tag == "tuple" else items
        if tag == SUBCLASS_TAG:
            return decode_subclass(inner, tensors, where, decode)
        rebuilt = restrided(inner, tensors) if tag == STRIDED_TAG else None
        if rebuilt is not None:
            return rebuilt
    raise _malformed(f"{where} holds an undecodable value {str(value)[:80]}")


def _malformed(detail: str) -> CheckpointError:
    return CheckpointError(f"{METADATA} is malformed: {detail}")


@attrs.frozen
class Stored:
    """A verified checkpoint read from disk.

    Attributes:
        path: its directory.
        metadata: the parsed ``metadata.json``.
        tensors: every tensor of ``tensors.safetensors``, by name.
    """

    path: Path
    metadata: dict[str, Any] = attrs.field(eq=False)
    tensors: dict[str, torch.Tensor] = attrs.field(eq=False)


def read_checkpoint(path: Path) -> Stored:
    """Read and verify a checkpoint directory before anything uses it.

    Checks, in order: the directory and its commit marker; the metadata
    against the marker's hash; the metadata's format, schema version and
    every field (:func:`~optiplug._checkpoint.schema.check_metadata`); the
    tensor file's size, safetensors header (bounded, offsets consistent),
    checkpoint id and SHA-256; the tensors and values the metadata names.
    Only regular files are read, through one handle on the directory: a
    checkpoint replaced by another process while it is read is read again
    (a few times), never reported as tampered with.

    Args:
        path: the checkpoint directory.

    Returns:
        The verified :class:`Stored` checkpoint.

    Raises:
        CheckpointError: naming what is missing, truncated, tampered or foreign.
    """
    path = Path(path)
    for _ in range(_ATTEMPTS):
        with OpenDirectory(path) as directory:
            try:
                return _read(directory)
            except CheckpointError:
                if not directory.replaced():
                    raise
    message = (
        f"{path} was replaced {_ATTEMPTS} times while being read: another process keeps "
        "saving to it; try again"
    )
    raise CheckpointError(message)


def _read(directory: OpenDirectory) -> Stored:
    path = directory.path
    marker = _read_marker(directory)
    metadata = _read_metadata(directory, marker)
    expected = metadata["tensors"]["bytes"]
    data = directory.read(TENSORS, "tensor file", expected, size=expected)
    _check_tensor_file(path, data, metadata)
    tensors = _load_tensors(path, data)
    check_stored(path, metadata, tensors)
    return Stored(path, metadata, tensors)


def check_stored(path: Path, metadata: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    """Check that ``metadata`` (already schema-checked) fits the tensors stored with it.

    Raises:
        CheckpointError: a tensor count that differs, or a value that does not decode.
    """
    count = metadata["tensors"]["count"]
    if count != len(tensors):
        message = f"it lists {count} tensors, the tensor file holds {len(tensors)}"
        raise CheckpointError(f"{path / METADATA} is malformed: {message}")
    check_values(metadata, tensors.keys(), path / METADATA)


def _read_marker(directory: OpenDirectory) -> dict[str, Any]:
    path = directory.path
    if not directory.has(MARKER):
        message = (
            f"{path} has no commit marker {path / MARKER}: the save did not finish (or this "
            "is not an optiplug checkpoint); refusing to use it"
        )
        raise CheckpointError(message)
    marker = parse_object(directory.read(MARKER, "commit marker", _MARKER_LIMIT), path / MARKER)
    check_marker(marker, path / MARKER, FORMAT)
    return marker


def _read_metadata(directory: OpenDirectory, marker: Mapping[str, Any]) -> dict[str, Any]:
    where = directory.path / METADATA
    data = directory.read(METADATA, "metadata", _METADATA_LIMIT)
    if sha256(data) != marker["metadata_sha256"]:
        message = (
            f"{where} does not match the commit marker's SHA-256 "
            "(modified, truncated or replaced after the save)"
        )
        raise CheckpointError(message)
    metadata = parse_object(data, where)
    check_metadata(metadata, where, FORMAT, SCHEMA_VERSION)
    if metadata["checkpoint_id"] != marker["checkpoint_id"]:
        raise CheckpointError(
            f"{directory.path / MARKER} belongs to another checkpoint than {where}"
        )
    return metadata


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_tensor_file(path: Path, data: bytes, metadata: Mapping[str, Any]) -> None:
    header = _parse_header(path, data)
    owner = header.get("__metadata__", {}).get("checkpoint_id")
    if owner != metadata["checkpoint_id"]:
        message = (
            f"{path / TENSORS} belongs to checkpoint {owner!r}, not {metadata['checkpoint_id']!r}: "
            "it was copied from another save"
        )
        raise CheckpointError(message)
    digest = sha256(data)
    if digest != metadata["tensors"]["sha256"]:
        message = (
            f"{path / TENSORS} is corrupt: SHA-256 {digest} does not match the saved "
            f"{metadata['tensors']['sha256']}"
        )
        raise CheckpointError(message)


def _parse_header(path: Path, data: bytes) -> dict[str, Any]:
    """Parse and bound-check a safetensors header without trusting its claims."""
    where = path / TENSORS
    if len(data) < 8:
        raise CheckpointError(f"{where} is truncated: {len(data)} bytes, no safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(_HEADER_LIMIT, len(data) - 8):
        message = (
            f"{where} has a corrupt safetensors header: it claims {size} header bytes "
            f"but the file has {len(data) - 8} after the length field"
        )
        raise CheckpointError(message)
    header = parse_object(data[8 : 8 + size], where)
    _check_offsets(where, header, len(data) - 8 - size)
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where} has a corrupt safetensors header (__metadata__)")
    return header


def _check_offsets(where: Path, header: Mapping[str, Any], available: int) -> None:
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        spans.append(_span(where, name, entry))
    position = 0
    for start, end, name in sorted(spans):
        if start != position:
            raise CheckpointError(f"{where} has a corrupt safetensors header at tensor {name!r}")
        position = end
    if position != available:
        message = f"{where} has {available} data bytes but its header describes {position}"
        raise CheckpointError(message)


def _span(where: Path, name: str, entry: Any) -> tuple[int, int, str]:
    corrupt = CheckpointError(f"{where} has a corrupt safetensors header at tensor {name!r}")
    if not isinstance(entry, dict) or entry.get("dtype") not in _ITEM_SIZES:
        raise corrupt
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(_count(n) for n in shape):
        raise corrupt
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_count, offsets)):
        raise corrupt
    if offsets[1] - offsets[0] != math.prod(shape) * _ITEM_SIZES[entry["dtype"]]:
        raise corrupt
    return offsets[0], offsets[1], name


def _load_tensors(path: Path, data: bytes) -> dict[str, torch.Tensor]:
    try:
        return safetensors_load(data)
    except Exception as error:
        message = f"{path / TENSORS} cannot be read as safetensors: {error}"
        raise CheckpointError(message) from error

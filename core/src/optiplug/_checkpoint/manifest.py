"""A sharded checkpoint's files: names, the commit marker and manifest, and their verification.

What the directory holds is told in :mod:`optiplug._checkpoint.sharded`.
Reading verifies before anything is trusted: the marker's SHA-256 of the
manifest, the manifest's fields and types, and each file's size and SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ..errors import CheckpointError
from .collective import _run_dcp
from .format import ALLOWED_FILES, sha256
from .io import _READ_FLAGS, OpenDirectory, _reason
from .schema import check_marker, parse_object

__all__ = [
    "DCP_METADATA",
    "FORMAT",
    "MANIFEST",
    "MARKER",
    "SCHEMA_VERSION",
    "is_sharded",
    "read_manifest",
    "read_steps",
    "verify_sharded",
]

FORMAT = "optiplug-sharded-checkpoint"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
MARKER = "COMMITTED"
DCP_METADATA = ".metadata"
MODEL, OPTIMIZER = "model", "optimizer"

_DATA_FILE = re.compile(r"__([0-9]+)_[0-9]+\.distcp")
_MARKER_LIMIT = 1 << 16
_MANIFEST_LIMIT = 1 << 28
_CHUNK = 1 << 20


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a sharded checkpoint directory.

    It is when it holds ``manifest.json``, or when its commit marker is a
    sharded checkpoint's (the manifest then went missing, and reading it as
    one names the manifest instead of calling the marker foreign).
    """
    path = Path(path)
    return os.path.lexists(path / MANIFEST) or _marker_format(path) == FORMAT


def _marker_format(path: Path) -> str | None:
    """The ``format`` field of the commit marker at ``path``, or None when it has none to read."""
    marker = _read_marker_quietly(path)
    value = marker.get("format") if marker is not None else None
    return value if isinstance(value, str) else None


def _read_marker_quietly(path: Path) -> dict[str, Any] | None:
    """The parsed commit marker at ``path``, or None when there is none to read."""
    try:
        with OpenDirectory(path) as directory:
            if not directory.has(MARKER):
                return None
            data = directory.read(MARKER, "commit marker", _MARKER_LIMIT)
        return parse_object(data, path / MARKER)
    except CheckpointError:
        return None


def _allowed(path: Path) -> set[str]:
    """The names a checkpoint (sharded or single-file) may hold at ``path``."""
    names = {MANIFEST, MARKER, DCP_METADATA, *ALLOWED_FILES}
    if path.is_dir() and not path.is_symlink():
        names |= {child.name for child in path.iterdir() if _DATA_FILE.fullmatch(child.name)}
    return names


def _owner(name: str, world: int) -> int:
    """The rank that wrote (and hashes) ``name``: DCP names data files ``__RANK_N.distcp``."""
    found = _DATA_FILE.fullmatch(name)
    owner = int(found[1]) if found else 0
    return owner if owner < world else 0


# ----------------------------------------------------------------- reading
def read_manifest(directory: OpenDirectory) -> dict[str, Any]:
    """The marker and manifest of a sharded checkpoint, checked against each other.

    Raises:
        CheckpointError: naming the file: missing marker, a manifest that does
            not match it, or fields of the wrong type.
    """
    path = directory.path
    if not directory.has(MARKER):
        raise CheckpointError(
            f"{path} has no commit marker {path / MARKER}: the save did not finish (or this "
            "is not an optiplug checkpoint); refusing to use it"
        )
    marker = parse_object(directory.read(MARKER, "commit marker", _MARKER_LIMIT), path / MARKER)
    check_marker(marker, path / MARKER, FORMAT)
    data = directory.read(MANIFEST, "manifest", _MANIFEST_LIMIT)
    where = path / MANIFEST
    if sha256(data) != marker["metadata_sha256"]:
        raise CheckpointError(
            f"{where} does not match the commit marker's SHA-256 "
            "(modified, truncated or replaced after the save)"
        )
    manifest = parse_object(data, where)
    _check_manifest(manifest, where)
    if manifest["checkpoint_id"] != marker["checkpoint_id"]:
        raise CheckpointError(f"{where} belongs to another save than {path / MARKER}")
    return manifest


_MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "schema_version": int,
    "checkpoint_id": str,
    "created": str,
    "world_size": int,
    "algorithm": str,
    "implementation": (str, type(None)),
    "optimizer_class": str,
    "plugin": (dict, type(None)),
    "versions": dict,
    "parameters": list,
    "param_groups": list,
    "optimizer_state": bool,
    "extra": dict,
    "ranks": list,
    "files": dict,
    "tensor_count": int,
}


def _check_manifest(manifest: Mapping[str, Any], where: Path) -> None:
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not an optiplug sharded checkpoint manifest")
    version = manifest.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise CheckpointError(
            f"{where} has schema version {version}; this optiplug reads up to {SCHEMA_VERSION} "
            "(saved by a newer optiplug?)"
        )
    for field, kind in _MANIFEST_FIELDS.items():
        value = manifest.get(field)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise CheckpointError(f"{where} is malformed: field {field!r}")
    if manifest["world_size"] < 1 or len(manifest["ranks"]) != manifest["world_size"]:
        raise CheckpointError(f"{where} is malformed: field 'ranks' (one entry per saving rank)")
    for name, info in manifest["files"].items():
        ok = isinstance(info, dict) and isinstance(info.get("sha256"), str)
        size = info.get("bytes") if isinstance(info, dict) else None
        safe = name == DCP_METADATA or _DATA_FILE.fullmatch(name)
        if not ok or not safe or isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise CheckpointError(f"{where} is malformed: field 'files', entry {name!r}")
    for index, record in enumerate(manifest["parameters"]):
        if not _parameter_record(record):
            raise CheckpointError(f"{where} is malformed: field 'parameters', entry {index}")
    for index, group in enumerate(manifest["param_groups"]):
        ok = isinstance(group, dict) and isinstance(group.get("hyperparameters"), dict)
        if not ok or not _strings(group.get("params")):
            raise CheckpointError(f"{where} is malformed: field 'param_groups', entry {index}")
    if DCP_METADATA not in manifest["files"]:
        raise CheckpointError(f"{where} is malformed: field 'files' does not list {DCP_METADATA}")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parameter_record(record: Any) -> bool:
    """Whether a manifest's parameter record has every field, of its type."""
    if not isinstance(record, dict):
        return False
    shape = record.get("shape")
    return (
        _count(record.get("index"))
        and _count(record.get("group"))
        and isinstance(record.get("name"), (str, type(None)))
        and isinstance(shape, list)
        and all(_count(size) for size in shape)
        and isinstance(record.get("dtype"), str)
        and _strings(record.get("slots"))
    )


def _check_files(
    directory: OpenDirectory, manifest: Mapping[str, Any], names: Iterable[str]
) -> list[str]:
    """Each problem with the files ``names``: missing, not regular, wrong size, wrong SHA-256."""
    problems = []
    for name in names:
        where = directory.path / name
        info = manifest["files"][name]
        try:
            descriptor = os.open(name, _READ_FLAGS, dir_fd=directory.descriptor)
        except FileNotFoundError:
            problems.append(f"{where} is missing (the save wrote {info['bytes']} bytes)")
            continue
        except OSError as error:
            problems.append(f"cannot read {where}: {_reason(error)}")
            continue
        try:
            problems += _check_open_file(descriptor, where, info)
        except OSError as error:
            problems.append(f"cannot read {where}: {_reason(error)}")
        finally:
            os.close(descriptor)
    return problems


def _check_open_file(descriptor: int, where: Path, info: Mapping[str, Any]) -> list[str]:
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        return [f"{where} is not a regular file; refusing to read it"]
    if status.st_size != info["bytes"]:
        state = "truncated" if status.st_size < info["bytes"] else "longer than saved"
        return [f"{where} is {state}: {status.st_size} bytes, the save wrote {info['bytes']}"]
    if _digest(descriptor)[0] != info["sha256"]:
        return [f"{where} does not match its SHA-256 in {MANIFEST} (modified after the save)"]
    return []


def _digest(descriptor: int) -> tuple[str, int]:
    """The SHA-256 and size of what remains to read of the open file ``descriptor``."""
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(descriptor, _CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _extra_files(directory: OpenDirectory, manifest: Mapping[str, Any]) -> list[str]:
    present = set(os.listdir(directory.descriptor))
    unknown = sorted(present - set(manifest["files"]) - {MANIFEST, MARKER})
    return [f"{directory.path / name} is not part of this checkpoint" for name in unknown]


def _dcp_metadata(path: Path) -> Metadata:
    """DCP's index of the checkpoint (call only after its SHA-256 was checked)."""
    try:
        return FileSystemReader(path).read_metadata()
    except Exception as error:  # any failure to unpickle is a damaged checkpoint
        raise CheckpointError(f"cannot read {path / DCP_METADATA}: {error}") from error


def verify_sharded(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Metadata]:
    """Verify a whole sharded checkpoint in this process: marker, manifest, every file's hash.

    Returns:
        The manifest and DCP's metadata.

    Raises:
        CheckpointError: every missing, truncated or modified file, named.
    """
    path = Path(path)
    with OpenDirectory(path) as directory:
        manifest = read_manifest(directory)
        problems = _check_files(directory, manifest, sorted(manifest["files"]))
        problems += _extra_files(directory, manifest)
    if problems:
        raise CheckpointError(_damaged(path, problems))
    return manifest, _dcp_metadata(path)


def read_steps(path: str | os.PathLike[str], index: Metadata) -> tuple[float, ...]:
    """The distinct values of the optimizer's ``step`` slots, read alone from a verified checkpoint.

    Only the ``optimizer.state.<fqn>.step`` entries are read (in this
    process, whatever the world size that saved them).

    Raises:
        CheckpointError: DCP could not read them.
    """
    wanted: dict[str, Any] = {
        key: torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
        for key, entry in index.state_dict_metadata.items()
        if key.startswith(f"{OPTIMIZER}.state.")
        and key.endswith(".step")
        and isinstance(entry, TensorStorageMetadata)
        and entry.size.numel() == 1
    }
    if not wanted:
        return ()
    reader = FileSystemReader(Path(path))
    try:
        _run_dcp(lambda: dcp_load(wanted, storage_reader=reader, no_dist=True))
    except (RuntimeError, CheckpointException) as error:
        raise CheckpointError(f"cannot read the step values of {path}: {error}") from None
    return tuple(sorted({float(value.reshape(())) for value in wanted.values()}))


def _damaged(path: Path, problems: list[str]) -> str:
    lines = "\n".join(f"  - {problem}" for problem in sorted(set(problems)))
    return f"{path} is damaged ({len(set(problems))} problem(s)); nothing was loaded:\n{lines}"

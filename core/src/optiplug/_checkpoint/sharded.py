"""Sharded checkpoints: one directory written by every rank through ``torch.distributed.checkpoint``.

The model and optimizer state are taken with PyTorch's own
``get_model_state_dict``/``get_optimizer_state_dict`` (keyed by parameter
FQN; an FSDP2 parameter is a ``DTensor`` and each rank holds its shards) and
written with ``dcp.save`` into a staging directory, each rank its own files.
optiplug adds what the single-file format guarantees::

    NAME/
      __0_0.distcp ...   DCP's data files, one per rank that wrote
      .metadata          DCP's index of every tensor's chunks (written by rank 0)
      manifest.json      rank 0: format, id, world size, algorithm, parameters,
                         every file's SHA-256 and size, extra data, per-rank data
      COMMITTED          rank 0, last: format, id, SHA-256 of manifest.json

Saving: every rank validates its own part (as loading would), all ranks
agree (``all_gather_object``) before anything is written; rank 0 creates the
staging directory and tells the others its name; ``dcp.save`` writes and
fsyncs; each rank hashes the files it wrote; a gather (the barrier that
confirms every rank finished) brings the hashes to rank 0, which writes the
manifest and then the marker, and renames the directory into place. A rank
that dies (or fails) before that leaves no marker and an earlier checkpoint
at ``NAME`` untouched. Every rank knows the save's checkpoint id, so a rank
whose save fails once rank 0 may have committed (rank 0 died right after the
rename, say) reads the marker at ``NAME`` and says which checkpoint is there.

Loading: every rank reads the marker and manifest, hashes its share of the
files, checks the target's keys, shapes and dtypes against DCP's index, reads
the state into copies, validates them (finite values, the optimizer's rules)
and only when every rank found nothing applies them with ``set_*_state_dict``.
Every problem found on any rank is reported on every rank. DCP reshards on
load, so the world size may differ from the save's (or be a single process
without ``torch.distributed``).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import os
import re
import stat
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .._core.specs import Problem
from .._state.codec import QuantizedState, decoded, local_of
from .._state.load import registry_of, spec_of, validate_state_dict
from ..errors import CheckpointError, StateDictError
from .format import ALLOWED_FILES, sha256
from .io import (
    _DIRECTORY_MODE,
    OpenDirectory,
    _discard,
    _install,
    _reason,
    _staging_prefix,
    _sync_parent,
    check_replaceable,
    fsync_directory,
    remove_stale_staging,
    write_durable,
)
from .schema import check_marker, parse_object
from .state import _origin

__all__ = [
    "DCP_METADATA",
    "FORMAT",
    "MANIFEST",
    "MARKER",
    "SCHEMA_VERSION",
    "ShardedLoad",
    "is_sharded",
    "load_sharded",
    "read_steps",
    "save_sharded",
    "uses_dtensors",
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
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_T = TypeVar("_T")


@attrs.frozen
class ShardedLoad:
    """What :func:`load_sharded` read and applied.

    Attributes:
        path: the checkpoint directory.
        manifest: the verified ``manifest.json`` (``extra``, ``ranks``, ``world_size``...).
    """

    path: Path
    manifest: dict[str, Any] = attrs.field(eq=False)


# ----------------------------------------------------------------- ranks
def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _active() else 0


def _world() -> int:
    return dist.get_world_size() if _active() else 1


def _gather(value: _T) -> list[_T]:
    """Every rank's ``value``, in rank order (``[value]`` without a process group)."""
    if not _active():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def _from_rank0(value: _T) -> _T:
    """Rank 0's ``value`` on every rank."""
    if not _active():
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def _collective(
    path: Path, action: str, call: Callable[[], _T], on_disk: Callable[[], str] | None = None
) -> _T:
    """Run a collective step; a rank that died or timed out becomes a :class:`CheckpointError`.

    Args:
        path: the checkpoint, for the message.
        action: ``"saving"`` or ``"loading"``.
        call: the collective.
        on_disk: once the failure is known, says what ``path`` holds now
            (a save whose rank 0 may have committed before the failure);
            None: nothing can have been committed.
    """
    try:
        return call()
    except (RuntimeError, CheckpointException) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        outcome = on_disk() if on_disk is not None else "nothing was committed"
        message = (
            f"{action} {path} failed on rank {_rank()}: another rank failed or stopped "
            f"answering ({first[:300]}); {outcome}"
        )
        raise CheckpointError(message) from None


def _run_dcp(call: Callable[[], _T]) -> _T:
    """A DCP call; without a process group, minus DCP's warning that it runs in one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return call()


def uses_dtensors(module: torch.nn.Module) -> bool:
    """Whether any of ``module``'s parameters is a ``DTensor`` (FSDP2's ``fully_shard``)."""
    return any(isinstance(p, DTensor) for p in module.parameters())


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


# ----------------------------------------------------------------- checks
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


# ----------------------------------------------------------------- saving
def save_sharded(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    extra: Mapping[str, Any] | None = None,
    per_rank: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Save ``model`` and ``optimizer`` from every rank into the directory ``path``.

    Call it on every rank (or in a single process without ``torch.distributed``).

    Args:
        path: the checkpoint directory (parents are created).
        model: the module (FSDP2 ``fully_shard``-ed, or plain).
        optimizer: its optimizer.
        extra: JSON data kept in the manifest (rank 0's).
        per_rank: JSON data of this rank, kept in the manifest's ``ranks`` list.

    Returns:
        The manifest written (the same on every rank).

    Raises:
        TypeError: ``extra`` or ``per_rank`` is not JSON-serialisable.
        StateDictError: on any rank, the state would not load back (NaN or
            inf, an invalid optimizer state); nothing was written.
        CheckpointError: ``path`` holds something other than a checkpoint,
            the file system refused, or a rank failed or died; no marker was
            written and an earlier checkpoint at ``path`` is unchanged, unless
            rank 0 had committed before the failure: the message then says
            ``path`` holds this save's new checkpoint.
    """
    path = Path(path)
    _json_ready("extra data", dict(extra or {}))
    _json_ready("per-rank data", dict(per_rank or {}))
    had_state = bool(optimizer.state)
    model_state = get_model_state_dict(model)
    optimizer_state = get_optimizer_state_dict(model, optimizer)
    if not had_state:  # torch initialised the lazy state with a zero step; undo, save none
        optimizer.state.clear()
        optimizer_state = {**optimizer_state, "state": {}}
    problems = _nonfinite(MODEL, model_state)
    problems += validate_state_dict(optimizer, optimizer_state)
    gathered = _collective(path, "saving", lambda: _gather(problems))
    found = _dedup(gathered)
    if found:
        header = (
            f"refusing to save a sharded checkpoint to {path}: the state would not load back, "
            "so nothing was written (an earlier checkpoint there is unchanged)"
        )
        raise StateDictError(found, header=header)
    staging, checkpoint_id = _prepare_staging(path)
    published = False
    on_disk = functools.partial(_on_disk, path, checkpoint_id)
    try:
        own, error, count = _write_shards(path, staging, model_state, optimizer_state)
        record = _record(model, optimizer, optimizer_state, extra, per_rank, had_state)
        outcomes = _collective(
            path, "saving", lambda: _gather((own, error, record["rank"])), on_disk
        )
        errors = [text for _, text, _ in outcomes if text is not None]
        manifest: dict[str, Any] | None = None
        outcome: str | None = "; ".join(errors) or None
        if _rank() == 0 and outcome is None:
            manifest = {**record["manifest"], "ranks": [data for _, _, data in outcomes]}
            manifest["checkpoint_id"] = checkpoint_id
            manifest["tensor_count"] = count
            manifest["files"] = {
                name: info for files, _, _ in outcomes for name, info in files.items()
            }
            outcome = _publish(path, staging, manifest)
            published = outcome is None
        final = (outcome, manifest)
        outcome, manifest = _collective(path, "saving", lambda: _from_rank0(final), on_disk)
    finally:
        if _rank() == 0 and not published:
            _discard(staging, MARKER)
    if outcome is not None or manifest is None:
        raise CheckpointError(f"cannot save {path}: {outcome}")
    return manifest


def _prepare_staging(path: Path) -> tuple[Path, str]:
    """Rank 0 creates the staging directory and the save's checkpoint id; every rank learns both.

    Every rank knowing the id lets a rank whose save failed after rank 0 may
    have committed tell, from the marker at ``path``, whether it did.

    Raises:
        CheckpointError: rank 0 could not create it (its error, on every rank).
    """
    result: tuple[str | None, str] = (None, f"cannot save {path}")
    if _rank() == 0:
        try:
            check_replaceable(path, _allowed(path))
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_staging(path, marker=MARKER)
            staging = tempfile.mkdtemp(prefix=_staging_prefix(path), dir=path.parent)
            os.chmod(staging, _DIRECTORY_MODE)
            result = (staging, uuid.uuid4().hex)
        except CheckpointError as error:
            result = (None, str(error))
        except OSError as error:
            result = (None, f"cannot save {path}: {_reason(error)}; nothing was changed there")
    staging_name, text = _collective(path, "saving", lambda: _from_rank0(result))
    if staging_name is None:
        raise CheckpointError(text)
    return Path(staging_name), text


def _on_disk(path: Path, checkpoint_id: str) -> str:
    """What ``path`` holds now, said for a save of ``checkpoint_id`` whose ranks lost touch.

    Rank 0 may have committed (installed the directory with its marker) just
    before the failure; the marker at ``path`` tells whether it did.
    """
    marker = _read_marker_quietly(path)
    found = marker.get("checkpoint_id") if marker is not None else None
    if marker is not None and marker.get("format") == FORMAT and found == checkpoint_id:
        return (
            f"yet this save was committed (rank 0 installed it before the failure): {path} "
            f"holds its new checkpoint {checkpoint_id}; check it with optiplug check before "
            "relying on it"
        )
    if isinstance(found, str) and found:
        return f"nothing was committed: {path} still holds the previous checkpoint {found}"
    if not os.path.lexists(path):
        return f"nothing was committed: there is no checkpoint at {path}"
    return f"nothing was committed: {path} has no readable commit marker"


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


def _write_shards(
    path: Path, staging: Path, model_state: Any, optimizer_state: Any
) -> tuple[dict[str, dict[str, Any]], str | None, int]:
    """``dcp.save`` into ``staging``, then hash (and fsync) this rank's files.

    Returns:
        ``{file: {"sha256", "bytes", "rank"}}`` for the files this rank
        wrote, this rank's error (hashing failed) or None, and the number
        of tensors DCP's index lists.

    Raises:
        CheckpointError: DCP failed on some rank (DCP reports it on every
            rank, so every rank raises) or a rank died.
    """
    writer = FileSystemWriter(staging, sync_files=True, single_file_per_rank=True)
    state = {MODEL: model_state, OPTIMIZER: optimizer_state}
    single = not _active()
    index = _collective(
        path,
        "saving",
        lambda: _run_dcp(lambda: dcp_save(state, storage_writer=writer, no_dist=single)),
    )
    count = _tensor_count(index)
    rank, world = _rank(), _world()
    own: dict[str, dict[str, Any]] = {}
    try:
        for name in sorted(os.listdir(staging)):
            if _owner(name, world) == rank:
                digest, size = _hash_file(staging, name, sync=True)
                own[name] = {"sha256": digest, "bytes": size, "rank": rank}
    except (OSError, CheckpointError) as error:
        reason = _reason(error) if isinstance(error, OSError) else str(error)
        message = f"rank {rank} could not hash its files: {reason}; nothing was committed"
        return own, message, count
    return own, None, count


def _tensor_count(index: Metadata) -> int:
    entries = index.state_dict_metadata.values()
    return sum(1 for entry in entries if isinstance(entry, TensorStorageMetadata))


def _owner(name: str, world: int) -> int:
    """The rank that wrote (and hashes) ``name``: DCP names data files ``__RANK_N.distcp``."""
    found = _DATA_FILE.fullmatch(name)
    owner = int(found[1]) if found else 0
    return owner if owner < world else 0


def _hash_file(directory: Path, name: str, *, sync: bool = False) -> tuple[str, int]:
    descriptor = os.open(directory / name, _READ_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise CheckpointError(f"{directory / name} is not a regular file")
        if sync:
            os.fsync(descriptor)
        digest, size = hashlib.sha256(), 0
        while chunk := os.read(descriptor, _CHUNK):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size
    finally:
        os.close(descriptor)


def _record(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    optimizer_state: Mapping[str, Any],
    extra: Mapping[str, Any] | None,
    per_rank: Mapping[str, Any] | None,
    had_state: bool,
) -> dict[str, Any]:
    registry = registry_of(optimizer)
    spec = spec_of(optimizer, registry)
    groups = []
    parameters: list[dict[str, Any]] = []
    fqn_of = {id(p): name for name, p in model.named_parameters()}
    for index, (group, saved) in enumerate(
        zip(optimizer.param_groups, optimizer_state["param_groups"], strict=True)
    ):
        names = list(saved["params"])
        for name, param in zip(names, group["params"], strict=True):
            parameters.append(
                {
                    "index": len(parameters),
                    "name": str(fqn_of.get(id(param), name)),
                    "group": index,
                    "shape": list(param.shape),
                    "dtype": str(param.dtype).removeprefix("torch."),
                    "slots": sorted(optimizer_state["state"].get(name, {})),
                }
            )
        hyper = {k: _plain(v) for k, v in saved.items() if k not in ("params", "param_names")}
        groups.append({"params": [str(n) for n in names], "hyperparameters": hyper})
    manifest = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "checkpoint_id": "",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "world_size": _world(),
        **_origin(optimizer, spec),
        "parameters": parameters,
        "param_groups": groups,
        "optimizer_state": had_state,
        "extra": dict(extra or {}),
    }
    return {"manifest": manifest, "rank": dict(per_rank or {})}


def _plain(value: Any) -> Any:
    """A hyperparameter as JSON (tensors as their value): descriptive only, DCP holds the real ones."""
    if isinstance(value, torch.Tensor):
        local = _local(value)
        return float(local.reshape(-1)[0]) if local.numel() == 1 else None
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _publish(path: Path, staging: Path, manifest: dict[str, Any]) -> str | None:
    """Rank 0: check the files, write manifest then marker, move into place. The error, or None."""
    unfinished = "nothing was committed, an earlier checkpoint there is unchanged"
    try:
        listed = set(os.listdir(staging))
        unowned = sorted(listed - set(manifest["files"]))
        if unowned or DCP_METADATA not in listed:
            found = ", ".join(unowned) or f"no {DCP_METADATA}"
            return f"unexpected files after the save ({found}); {unfinished}"
        text = json.dumps(manifest, indent=1).encode("utf-8")
        write_durable(staging / MANIFEST, text)
        marker = {
            "format": FORMAT,
            "checkpoint_id": manifest["checkpoint_id"],
            "metadata_sha256": sha256(text),
        }
        write_durable(staging / MARKER, json.dumps(marker).encode("utf-8"))
        fsync_directory(staging)
        _install(staging, path)
    except OSError as error:
        return f"{_reason(error)}; {unfinished}"
    _discard(staging, MARKER)  # now the replaced checkpoint, if any
    try:
        _sync_parent(path)
    except CheckpointError as error:  # saved, but not known to be durable
        return str(error)
    with contextlib.suppress(OSError):  # the save is done; the sweep is housekeeping
        remove_stale_staging(path, marker=MARKER, committed=True)
    return None


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
    digest = hashlib.sha256()
    while chunk := os.read(descriptor, _CHUNK):
        digest.update(chunk)
    if digest.hexdigest() != info["sha256"]:
        return [f"{where} does not match its SHA-256 in {MANIFEST} (modified after the save)"]
    return []


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


# ----------------------------------------------------------------- loading
def load_sharded(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    check: Callable[[Mapping[str, Any]], None] | None = None,
) -> ShardedLoad:
    """Verify the sharded checkpoint at ``path`` on every rank, then load it, all or nothing.

    Call it on every rank. The ranks share the hashing of the files; each
    checks the target against DCP's index, reads its part into copies and
    validates them; every problem of every rank is gathered, and only if
    there is none anywhere are model and optimizer set.

    Args:
        path: the checkpoint directory.
        model: the module to load into (FSDP2-sharded at any world size, or plain).
        optimizer: its optimizer.
        check: called on every rank with the verified manifest before
            anything is read into the model; a :class:`CheckpointError` it
            raises is gathered with the other ranks' problems (``Graph.load``
            checks its record here).

    Returns:
        A :class:`ShardedLoad` (its manifest holds ``extra`` and ``ranks``).

    Raises:
        CheckpointError: missing, truncated or modified files (on any rank),
            or a rank failed or died; nothing was changed.
        StateDictError: the checkpoint does not fit ``model``/``optimizer``
            (keys, shapes, dtypes, non-finite values, optimizer rules);
            nothing was changed.
    """
    path = Path(path)
    manifest, identity, problems = _verify_share(path)
    if manifest is not None and check is not None and not problems:
        try:
            check(manifest)
        except CheckpointError as error:
            problems.append(str(error))
    gathered = _collective(
        path, "loading", lambda: _gather((problems, manifest and manifest["checkpoint_id"]))
    )
    damaged = [p for batch, _ in gathered for p in batch]
    if not damaged and len({checkpoint_id for _, checkpoint_id in gathered}) != 1:
        damaged = [f"{path} was replaced while the ranks read it; try again"]
    if damaged or manifest is None:
        raise CheckpointError(_damaged(path, damaged))
    metadata = _dcp_metadata(path)
    had_state = bool(optimizer.state)
    try:
        return _load_verified(path, model, optimizer, manifest, metadata, identity)
    except BaseException:
        if not had_state:  # torch's lazy initialisation of the state, undone
            optimizer.state.clear()
        raise


def _verify_share(path: Path) -> tuple[dict[str, Any] | None, tuple[int, int], list[str]]:
    """This rank's part of the integrity check: marker, manifest and its share of the files."""
    try:
        with OpenDirectory(path) as directory:
            manifest = read_manifest(directory)
            status = os.fstat(directory.descriptor)
            names = sorted(manifest["files"])
            share = [DCP_METADATA] + [n for n in names[_rank() :: _world()] if n != DCP_METADATA]
            problems = _check_files(directory, manifest, share)
            if _rank() == 0:
                problems += _extra_files(directory, manifest)
            return manifest, (status.st_dev, status.st_ino), problems
    except CheckpointError as error:
        return None, (0, 0), [str(error)]


def _load_verified(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    manifest: Mapping[str, Any],
    metadata: Metadata,
    identity: tuple[int, int],
) -> ShardedLoad:
    model_state = get_model_state_dict(model)
    optimizer_state = get_optimizer_state_dict(model, optimizer)
    if not manifest["optimizer_state"]:
        optimizer_state = {**optimizer_state, "state": {}}
    target = {MODEL: model_state, OPTIMIZER: optimizer_state}
    problems = _against_index(target, metadata)
    algorithm = spec_of(optimizer, registry_of(optimizer)).name
    if manifest["algorithm"] != algorithm:
        wanted, saved = f"a checkpoint of {algorithm}", f"a checkpoint of {manifest['algorithm']}"
        problems.append(Problem(slot="algorithm", kind="algorithm", expected=wanted, found=saved))
    found = _dedup(_collective(path, "loading", lambda: _gather(problems)))
    if found:
        raise StateDictError(
            found, header=f"{path} does not fit this model and optimizer; nothing was changed"
        )
    copies = _copied(target, metadata.state_dict_metadata)
    reader = FileSystemReader(path)
    _collective(
        path,
        "loading",
        lambda: _run_dcp(lambda: dcp_load(copies, storage_reader=reader, no_dist=not _active())),
    )
    problems = _nonfinite(MODEL, copies[MODEL])
    problems += validate_state_dict(optimizer, copies[OPTIMIZER])
    replaced = _identity(path) != identity
    outcome = _collective(path, "loading", lambda: _gather((problems, replaced)))
    if any(moved for _, moved in outcome):
        raise CheckpointError(
            f"{path} was replaced while being loaded; nothing was changed, try again"
        )
    found = _dedup(batch for batch, _ in outcome)
    if found:
        raise StateDictError(
            found, header=f"{path} holds state that does not fit; nothing was changed"
        )
    set_optimizer_state_dict(model, optimizer, copies[OPTIMIZER])
    if not manifest["optimizer_state"]:
        optimizer.state.clear()
    set_model_state_dict(model, copies[MODEL])
    return ShardedLoad(path, dict(manifest))


def _identity(path: Path) -> tuple[int, int]:
    try:
        status = os.stat(path)
    except OSError:
        return (-1, -1)
    return status.st_dev, status.st_ino


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


def _copied(tree: Any, saved: Mapping[str, Any], path: tuple[str, ...] = ()) -> Any:
    """A deep copy of the state-dict tree: tensors cloned (a DTensor stays sharded), the rest copied.

    Low-precision state is copied decoded: DCP reads a saved shard into the
    region of each target it overlaps, which a quantized target (its codes
    shared by blocks) cannot take; the optimizer encodes it again as it
    loads (``convert_state``), giving back the same codes when the sharding
    is the one saved. A slot with low-rank factors stays quantized where
    one saved chunk is exactly its shard (``saved``: the checkpoint's index,
    keyed as DCP flattens ``path``): DCP then copies the saved codes, scales
    and factors in whole, since encoding the decoded value again would take
    new factors and a different residual.
    """
    if isinstance(tree, torch.Tensor):
        if _read_whole(tree, saved.get(".".join(path))):
            return tree.detach().clone()
        return decoded(tree).detach().clone()
    if isinstance(tree, Mapping):
        return {key: _copied(value, saved, (*path, str(key))) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_copied(value, saved, (*path, str(i))) for i, value in enumerate(tree)]
    if isinstance(tree, tuple):
        return tuple(_copied(value, saved, (*path, str(i))) for i, value in enumerate(tree))
    return tree


def _read_whole(value: torch.Tensor, saved: Any) -> bool:
    """Whether ``value`` is a slot with factors whose shard one saved chunk covers exactly."""
    local = local_of(value)
    if not isinstance(local, QuantizedState) or local.factors is None:
        return False
    if not isinstance(saved, TensorStorageMetadata):
        return False
    offsets: tuple[int, ...] = (0,) * value.ndim
    if isinstance(value, DTensor):
        _, found = compute_local_shape_and_global_offset(
            value.shape, value.device_mesh, value.placements
        )
        offsets = tuple(found)
    shape = tuple(local.shape)
    return any(
        tuple(chunk.offsets) == offsets and tuple(chunk.sizes) == shape for chunk in saved.chunks
    )

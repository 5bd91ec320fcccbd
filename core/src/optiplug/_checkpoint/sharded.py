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

Saving is here; the files, marker and manifest are :mod:`.manifest`'s,
loading :mod:`.sharded_load`'s, the state checks :mod:`.shard_checks`' and
the ranks' collectives :mod:`.collective`'s, all re-exported from here.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import stat
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor

from .._state.load import registry_of, spec_of, validate_state_dict
from ..errors import CheckpointError, StateDictError
from .collective import _active, _collective, _from_rank0, _gather, _rank, _run_dcp, _world
from .format import sha256
from .io import (
    _DIRECTORY_MODE,
    _READ_FLAGS,
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
from .manifest import (
    DCP_METADATA,
    FORMAT,
    MANIFEST,
    MARKER,
    MODEL,
    OPTIMIZER,
    SCHEMA_VERSION,
    _allowed,
    _digest,
    _owner,
    _read_marker_quietly,
    is_sharded,
    read_manifest,
    read_steps,
    verify_sharded,
)
from .shard_checks import _dedup, _json_ready, _local, _nonfinite
from .sharded_load import ShardedLoad, load_sharded
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
    "read_manifest",
    "read_steps",
    "save_sharded",
    "uses_dtensors",
    "verify_sharded",
]


def uses_dtensors(module: torch.nn.Module) -> bool:
    """Whether any of ``module``'s parameters is a ``DTensor`` (FSDP2's ``fully_shard``)."""
    return any(isinstance(p, DTensor) for p in module.parameters())


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


def _hash_file(directory: Path, name: str, *, sync: bool = False) -> tuple[str, int]:
    descriptor = os.open(directory / name, _READ_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise CheckpointError(f"{directory / name} is not a regular file")
        if sync:
            os.fsync(descriptor)
        return _digest(descriptor)
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

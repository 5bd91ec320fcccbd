"""Loading a sharded checkpoint: verified on every rank, then applied all or nothing.

How is told in :mod:`optiplug._checkpoint.sharded` (its "Loading" paragraph).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .._core.specs import Problem
from .._state.codec import QuantizedState, decoded, local_of
from .._state.load import registry_of, spec_of, validate_state_dict
from ..errors import CheckpointError, StateDictError
from .collective import _active, _collective, _gather, _rank, _run_dcp, _world
from .io import OpenDirectory
from .manifest import (
    DCP_METADATA,
    MODEL,
    OPTIMIZER,
    _check_files,
    _damaged,
    _dcp_metadata,
    _extra_files,
    read_manifest,
)
from .shard_checks import _against_index, _dedup, _nonfinite

__all__ = ["ShardedLoad", "load_sharded"]


@attrs.frozen
class ShardedLoad:
    """What :func:`load_sharded` read and applied.

    Attributes:
        path: the checkpoint directory.
        manifest: the verified ``manifest.json`` (``extra``, ``ranks``, ``world_size``...).
    """

    path: Path
    manifest: dict[str, Any] = attrs.field(eq=False)


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

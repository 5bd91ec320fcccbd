"""A Graph's checkpoints: what ``Graph.save`` writes and what ``Graph.load`` checks and reads.

A module with ``DTensor`` parameters (FSDP) is saved as a sharded checkpoint,
every rank writing its shards; any other in optiplug's single-file format,
by rank 0. Loading reads either, and checks everything before anything
changes: the files, the model state's keys, shapes, dtypes and values, the
graph record (:mod:`.record`) and the optimizer state.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .. import checkpoint
from .._checkpoint.format import read_checkpoint
from .._checkpoint.sharded import is_sharded, load_sharded, save_sharded, uses_dtensors
from .._core import ranks as _ranks
from ..checkpoint import extra_tensors, load_stored
from ..errors import CheckpointError, GraphError
from .buffers import BufferKeeper
from .record import GraphRecord, rank_record, read_rank_record, read_record, torch_rng_states

__all__ = ["Checkpointer", "jsonable"]


class Checkpointer:
    """Saves and loads one Graph's module and optimizer with its graph record.

    Args:
        module: the (unwrapped) module.
        buffers: the module's buffers as of the last step (which may be non-finite).
    """

    def __init__(self, module: torch.nn.Module, buffers: BufferKeeper) -> None:
        self._module = module
        self._buffers = buffers

    def save(
        self,
        path: str | os.PathLike[str],
        optimizer: torch.optim.Optimizer,
        record: dict[str, Any],
        found: str | None,
    ) -> None:
        """Write the checkpoint, unless ``found`` (agreed across ranks) names a non-finite value.

        Raises:
            GraphError: ``found`` is not None; nothing is written.
            CheckpointError: ``path`` holds something other than a checkpoint.
        """
        if found is not None:
            raise GraphError(
                f"Graph.save: refusing to save a non-finite state ({found} holds NaN or inf); "
                f"nothing was written, {os.fspath(path)} is untouched"
            )
        if uses_dtensors(self._module):
            extra = {"graph": record}
            save_sharded(path, self._module, optimizer, extra=extra, per_rank=rank_record())
            return
        if _ranks.rank() == 0:
            tensors = {f"model/{k}": v for k, v in self._module.state_dict().items()}
            tensors.update(torch_rng_states())
            checkpoint.save(path, optimizer, tensors=tensors, graph=record)
        if _ranks.active():
            torch.distributed.barrier()

    def load(
        self, path: str | os.PathLike[str], optimizer: torch.optim.Optimizer, scaler: str | None
    ) -> GraphRecord:
        """Check the checkpoint at ``path``, load the module and optimizer, return its record.

        Args:
            path: the checkpoint.
            optimizer: the Graph's optimizer.
            scaler: the device type of the Graph's GradScaler, or None without one.

        Raises:
            CheckpointError: damaged files, a malformed record, or model
                tensors that do not fit the module or hold NaN or inf.
            StateDictError: optimizer state that does not fit the optimizer.
        """
        if is_sharded(path):
            return self._load_sharded(path, optimizer, scaler)
        stored = read_checkpoint(Path(path))
        tensors = extra_tensors(stored)
        extra = stored.metadata.get("extra", {})
        record = read_record(extra, tensors, len(optimizer.param_groups), path, scaler)
        model_state = {
            k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")
        }
        self._check_model_state(model_state, path)
        self._check_model_finite(model_state, path)
        load_stored(stored, optimizer, strict=True)  # validates first: all or nothing
        self._module.load_state_dict(model_state)
        warn_if_another_implementation(stored.metadata.get("implementation"), optimizer)
        return record

    def _load_sharded(
        self, path: str | os.PathLike[str], optimizer: torch.optim.Optimizer, scaler: str | None
    ) -> GraphRecord:
        groups = len(optimizer.param_groups)
        records: list[GraphRecord] = []

        def check(manifest: Mapping[str, Any]) -> None:
            records.append(read_rank_record(manifest, groups, path, scaler, _ranks.rank()))

        load_sharded(path, self._module, optimizer, check=check)
        return records[-1]

    def _check_model_state(self, saved: Mapping[str, torch.Tensor], path: Any) -> None:
        own = self._module.state_dict()
        problems = [f"missing {k}" for k in own if k not in saved]
        problems += [f"unexpected {k}" for k in saved if k not in own]
        problems += [
            f"{k}: expected {tuple(v.shape)} {v.dtype}, found {tuple(saved[k].shape)} {saved[k].dtype}"
            for k, v in own.items()
            if k in saved and (saved[k].shape != v.shape or saved[k].dtype != v.dtype)
        ]
        if problems:
            raise CheckpointError(
                f"{path}: the model state does not fit this module: {'; '.join(problems[:10])}"
            )

    def _check_model_finite(self, saved: Mapping[str, torch.Tensor], path: Any) -> None:
        """Refuse saved model tensors holding NaN or inf (a buffer built so excepted)."""
        found = self._buffers.made_nonfinite(saved)
        if found:
            raise CheckpointError(
                f"{path}: the model state holds NaN or inf in {', '.join(found[:10])} "
                "(made so by training); refusing to load it, nothing was changed"
            )


def jsonable(value: Any) -> Any:
    """``value`` with its tuples made lists, recursively (for JSON metadata)."""
    return [jsonable(item) for item in value] if isinstance(value, (tuple, list)) else value


def warn_if_another_implementation(saved: object, optimizer: torch.optim.Optimizer) -> None:
    """Warn when ``optimizer`` runs another implementation than the checkpoint's saver did.

    Two implementations of one algorithm (``foreach`` and ``fused``) agree to
    rounding, not bit for bit, so the resumed run then continues, but not
    bit-identically. It happens when the implementation is chosen by
    measurement and the near-equal candidates' order changed between the
    saving process and this one (the chooser writes no choice it doubts to
    the cache file); forcing ``impl=`` makes a resume bit-identical.
    """
    current = getattr(optimizer, "impl", None)
    if isinstance(saved, str) and isinstance(current, str) and saved != current:
        warnings.warn(
            f"Graph.load: the checkpoint was written by the {saved!r} implementation and this "
            f"optimizer runs {current!r}: the run resumes, but not bit-identically (the two "
            f"agree to rounding); set_optimizer(..., impl={saved!r}) resumes bit-identically",
            UserWarning,
            stacklevel=3,
        )

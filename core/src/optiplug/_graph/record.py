"""The graph record of a checkpoint: read and checked in full before ``Graph.load`` applies it.

``Graph.save`` keeps its counters, schedule, lrs, data position and the
Python and NumPy RNG states in the checkpoint's metadata (``extra.graph``) and
the torch RNG states among its tensors (``rng/...``). A sharded checkpoint
(FSDP) keeps the record in its manifest's ``extra.graph`` and every rank's
RNG states in its ``ranks`` list (:func:`rank_record`; the torch states as
hex text), which :func:`read_rank_record` turns back into the same form
before checking it. :func:`read_record`
turns them into a :class:`GraphRecord` whose every value is known to be
applicable: RNG states are tried on scratch generators, the schedule is built.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any, cast

import attrs
import numpy as np
import torch

from .._api import schedule as build_schedule
from .._schedules.base import Schedule
from ..errors import CheckpointError, OptiplugError

__all__ = [
    "GRAPH_KEYS",
    "GraphRecord",
    "numpy_rng_state",
    "rank_record",
    "read_rank_record",
    "read_record",
    "torch_rng_states",
]

GRAPH_KEYS = (
    "training_step",
    "micro_step",
    "lr_scale",
    "base_lrs",
    "schedule",
    "data_position",
    "python_rng",
    "numpy_rng",
)
"""The fields every Graph checkpoint's record holds."""

TORCH_RNG = "rng/torch_cpu"
_CUDA_RNG = "rng/cuda_"


@attrs.frozen
class GraphRecord:
    """A checked graph record, ready to apply.

    Attributes:
        training_step: optimizer steps taken.
        micro_step: micro-batches counted.
        lr_scale: the lr multiplier.
        base_lrs: one base lr per param group.
        schedule: the schedule, built.
        data_position: ``(epoch, batches consumed in it)``.
        python_rng: a state for ``random.setstate``.
        numpy_rng: a state for ``np.random.set_state``.
        torch_rng: the CPU generator's state.
        cuda_rng: the CUDA generators' states, by device index.
        scaler: the GradScaler's state dict, or None.
    """

    training_step: int
    micro_step: int
    lr_scale: float
    base_lrs: tuple[float, ...]
    schedule: Schedule | None
    data_position: tuple[int, int]
    python_rng: tuple[Any, ...]
    numpy_rng: tuple[Any, ...]
    torch_rng: torch.Tensor
    cuda_rng: tuple[torch.Tensor, ...]
    scaler: dict[str, Any] | None

    def apply_rng(self) -> None:
        """Set the Python, NumPy and torch (CPU and CUDA) global RNG states."""
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.cuda_rng[: torch.cuda.device_count()])


class _Invalid(Exception):
    """A field failed its check (turned into a CheckpointError naming the field)."""


def read_record(
    extra: Any, tensors: Mapping[str, torch.Tensor], groups: int, path: Any, scaler: str | None
) -> GraphRecord:
    """Check a checkpoint's graph record and torch RNG tensors, and build the record.

    Args:
        extra: the checkpoint's ``extra`` metadata.
        tensors: its named extra tensors (``model/...``, ``rng/...``).
        groups: the optimizer's param-group count (one base lr each).
        path: the checkpoint, for messages.
        scaler: the device type of the loading Graph's GradScaler, or None.

    Returns:
        The :class:`GraphRecord`.

    Raises:
        CheckpointError: not a Graph checkpoint, or a field naming what is wrong.
    """
    state = extra.get("graph") if isinstance(extra, Mapping) else None
    if not isinstance(state, Mapping) or any(key not in state for key in GRAPH_KEYS):
        raise CheckpointError(
            f"{path}: not a Graph checkpoint (saved by optiplug.checkpoint.save, not Graph.save?)"
        )
    fields: dict[str, Any] = {}
    for key, check in _CHECKS.items():
        try:
            fields[key] = check(state.get(key), groups)
        except _Invalid as error:
            raise CheckpointError(
                f"{path}: the graph record's field {key!r} is invalid: {error}"
            ) from None
    fields["scaler"] = _scaler(state.get("scaler"), scaler, path)
    return GraphRecord(**fields, **_torch_rng(tensors, path))


def _count(value: Any, _groups: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Invalid(f"expected an integer >= 0, found {str(value)[:60]}")
    return value


def _lr_scale(value: Any, _groups: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(f"expected a number, found {str(value)[:60]}")
    if not (math.isfinite(value) and value > 0):
        raise _Invalid(f"expected a finite number > 0, found {value}")
    return float(value)


def _base_lrs(value: Any, groups: int) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != groups:
        raise _Invalid(f"expected a list of {groups} lr(s), one per param group, found {value}")
    for lr in value:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr):
            raise _Invalid(f"expected finite numbers, found {lr!r}")
    return tuple(float(lr) for lr in value)


def _schedule(value: Any, _groups: int) -> Schedule | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _Invalid(f"expected a schedule's dict or null, found {str(value)[:60]}")
    try:
        return build_schedule(**value)
    except (OptiplugError, TypeError) as error:
        raise _Invalid(str(error)) from None


def _position(value: Any, _groups: int) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise _Invalid(f"expected [epoch, batches], found {str(value)[:60]}")
    return _count(value[0]), _count(value[1])


def _tupled(value: Any) -> Any:
    return tuple(_tupled(item) for item in value) if isinstance(value, list) else value


def _python_rng(value: Any, _groups: int) -> tuple[Any, ...]:
    state = _tupled(value)
    try:
        random.Random().setstate(state)  # a scratch generator: the global one is untouched
    except (TypeError, ValueError, OverflowError, IndexError) as error:
        raise _Invalid(f"not a Python random state ({error})") from None
    return cast(tuple[Any, ...], state)


def _numpy_rng(value: Any, _groups: int) -> tuple[Any, ...]:
    try:
        kind, keys, position, has_gauss, cached = value
        state = (kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached)
        np.random.RandomState().set_state(state)  # scratch, as above
    except (TypeError, ValueError, OverflowError, IndexError, KeyError) as error:
        raise _Invalid(f"not a NumPy random state ({error})") from None
    return state


_CHECKS = {
    "training_step": _count,
    "micro_step": _count,
    "lr_scale": _lr_scale,
    "base_lrs": _base_lrs,
    "schedule": _schedule,
    "data_position": _position,
    "python_rng": _python_rng,
    "numpy_rng": _numpy_rng,
}


def _torch_rng(tensors: Mapping[str, torch.Tensor], path: Any) -> dict[str, Any]:
    state = tensors.get(TORCH_RNG)
    if state is None:
        raise CheckpointError(f"{path}: the torch RNG state {TORCH_RNG} is missing")
    try:
        torch.Generator().set_state(state)  # scratch: checks dtype and size
    except (RuntimeError, TypeError) as error:
        message = str(error).splitlines()[0]
        raise CheckpointError(f"{path}: {TORCH_RNG} is not a torch RNG state: {message}") from None
    cuda = sorted((k for k in tensors if k.startswith(_CUDA_RNG)), key=_device_index)
    for key in cuda:
        if tensors[key].dtype != torch.uint8 or tensors[key].dim() != 1:
            raise CheckpointError(f"{path}: {key} is not a CUDA RNG state")
    return {"torch_rng": state, "cuda_rng": tuple(tensors[key] for key in cuda)}


def _device_index(key: str) -> int:
    suffix = key.removeprefix(_CUDA_RNG)
    return int(suffix) if suffix.isdigit() else -1


def _scaler(value: Any, device: str | None, path: Any) -> dict[str, Any] | None:
    if value is None or device is None:
        return None
    try:
        torch.amp.GradScaler(device).load_state_dict(value)  # scratch, as above
    except (RuntimeError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(
            f"{path}: the graph record's field 'scaler' is invalid: {error}"
        ) from None
    return dict(value)


_LegacyRngState = tuple[str, "np.ndarray[Any, np.dtype[np.uint32]]", int, int, float]
"""``np.random.get_state()`` of the global MT19937 generator (numpy's stubs also allow a dict)."""


def numpy_rng_state() -> list[Any]:
    """The global NumPy RNG state, JSON-ready (for the record)."""
    kind, keys, position, has_gauss, cached = cast(_LegacyRngState, np.random.get_state())
    return [kind, keys.tolist(), int(position), int(has_gauss), float(cached)]


def torch_rng_states() -> dict[str, torch.Tensor]:
    """The torch RNG states to save as tensors: CPU, and CUDA once initialised."""
    states = {TORCH_RNG: torch.get_rng_state()}
    # torch leaves cuda.is_initialized unannotated
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states.update({f"{_CUDA_RNG}{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states


def _json_ready(value: Any) -> Any:
    return [_json_ready(item) for item in value] if isinstance(value, (tuple, list)) else value


def rank_record() -> dict[str, Any]:
    """This process's RNG states, JSON-ready: its entry in a sharded checkpoint's ``ranks``.

    Returns:
        ``python_rng`` and ``numpy_rng`` as in the graph record, and
        ``torch_rng``: each torch generator's state (``rng/torch_cpu``,
        ``rng/cuda_N``) as hex text.
    """
    return {
        "python_rng": _json_ready(random.getstate()),
        "numpy_rng": numpy_rng_state(),
        "torch_rng": {
            key: bytes(state.tolist()).hex() for key, state in torch_rng_states().items()
        },
    }


def read_rank_record(
    manifest: Mapping[str, Any], groups: int, path: Any, scaler: str | None, rank: int
) -> GraphRecord:
    """Check a sharded checkpoint's graph record with this rank's RNG states, and build it.

    Rank ``rank`` takes the RNG states saved by the rank of the same number;
    when the checkpoint was saved by fewer ranks, those of ``rank`` modulo
    their number (a resume at another world size cannot repeat the
    uninterrupted run's random draws anyway).

    Args:
        manifest: the verified manifest (``extra.graph`` and ``ranks``).
        groups: the optimizer's param-group count.
        path: the checkpoint, for messages.
        scaler: the device type of the loading Graph's GradScaler, or None.
        rank: this process's rank.

    Returns:
        The :class:`GraphRecord`.

    Raises:
        CheckpointError: not a Graph checkpoint, or a field naming what is wrong.
    """
    extra = manifest.get("extra")
    ranks = manifest.get("ranks")
    state = extra.get("graph") if isinstance(extra, Mapping) else None
    if not isinstance(state, Mapping) or not isinstance(ranks, list) or not ranks:
        raise CheckpointError(
            f"{path}: not a Graph checkpoint (saved by optiplug.checkpoint.save_sharded, "
            "not Graph.save?)"
        )
    saved = rank % len(ranks)
    entry = ranks[saved]
    where = f"{path}: the graph record's entry for rank {saved}"
    if not isinstance(entry, Mapping) or not isinstance(entry.get("torch_rng"), Mapping):
        raise CheckpointError(f"{where} is missing or holds no torch RNG states")
    tensors: dict[str, torch.Tensor] = {}
    for key, text in entry["torch_rng"].items():
        try:
            data = bytes.fromhex(text) if isinstance(text, str) else None
        except ValueError:
            data = None
        if data is None or not data:
            raise CheckpointError(f"{where}: {key} is not a hex-encoded RNG state")
        tensors[str(key)] = torch.tensor(list(data), dtype=torch.uint8)
    merged = {**state, "python_rng": entry.get("python_rng"), "numpy_rng": entry.get("numpy_rng")}
    return read_record({"graph": merged}, tensors, groups, path, scaler)

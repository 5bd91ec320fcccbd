"""How much memory an optimizer's state takes: measured (:func:`memory_report`) or estimated.

:func:`memory_report` walks a live optimizer's ``state`` and ``param_groups``
(any ``torch.optim.Optimizer``; ``multi`` exposes its sub-optimizers' state and
groups that way) and counts every tensor's storage once. :func:`estimate`
derives the bytes from an algorithm's declared :class:`~optiplug.StateSlot`\\ s
and a parameter count, without building anything.

Importing this module does not import torch (``optiplug show --params`` runs
without it); :func:`memory_report` imports it when called.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .._core.specs import OptimizerSpec, StateSlot
from ..errors import HyperparameterError
from .precision import state_bytes_per_element

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPE_BYTES",
    "PARAMETERS_PER_TENSOR",
    "MemoryEstimate",
    "MemoryReport",
    "dtype_bytes",
    "estimate",
    "memory_report",
]

DTYPE_BYTES: Mapping[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
"""Bytes per element of the parameter dtypes an estimate accepts."""

_DTYPE_ALIASES = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
}

PARAMETERS_PER_TENSOR = 1_000_000
"""Without ``num_tensors``, an estimate assumes one parameter tensor per this many
parameters (rounded up, at least one) for its scalar slots (``step``)."""


@attrs.frozen
class MemoryReport:
    """The bytes an optimizer's state takes, by slot and by param group.

    Every tensor's storage is counted once: tensors that share a storage
    (views, aliases, one tensor under two keys) count once, under the first
    slot and group that hold it, and state that shares a parameter's storage
    counts nothing (it is the parameter). A tensor subclass (a quantized
    state) counts the storages of the tensors ``__tensor_flatten__`` names,
    recursively, each once (a code book shared by many states counts once). Tensor-valued hyperparameters (a
    tensor ``lr``) count under their key. Non-tensor values count nothing.

    Attributes:
        total: bytes of every state tensor and tensor hyperparameter.
        by_slot: bytes per state slot name (``"exp_avg"``, ``"step"``...) and
            per tensor hyperparameter key (``"lr"``).
        by_group: bytes per param group, in ``param_groups`` order (state of
            parameters no group lists counts in ``total`` and ``by_slot`` only).
        parameters: bytes of the parameters themselves, for comparison.
        num_parameters: elements in the parameters.
    """

    total: int
    by_slot: dict[str, int]
    by_group: tuple[int, ...]
    parameters: int
    num_parameters: int


@attrs.frozen
class MemoryEstimate:
    """The state memory an algorithm needs for ``num_parameters`` parameters.

    Attributes:
        algorithm: the algorithm's name.
        dtype: the parameters' dtype name (``"bfloat16"``).
        num_parameters: parameter elements.
        num_tensors: parameter tensors assumed for scalar slots.
        total: estimated bytes of the state.
        by_slot: estimated bytes per slot counted.
        parameters: bytes of the parameters themselves.
        omitted: slots not counted, each with why (``"max_exp_avg_sq: amsgrad
            is False"``); a slot whose condition is None (decided per param
            group, such as Muon's ``use_muon``) is listed here too.
    """

    algorithm: str
    dtype: str
    num_parameters: int
    num_tensors: int
    total: int
    by_slot: dict[str, int]
    parameters: int
    omitted: tuple[str, ...] = ()


def dtype_bytes(dtype: str) -> tuple[str, int]:
    """The canonical name and element size of a parameter dtype name.

    Args:
        dtype: ``"float32"``, ``"bfloat16"``, ``"fp16"``, ``"torch.float32"``...

    Returns:
        ``(canonical name, bytes per element)``.

    Raises:
        HyperparameterError: an unknown dtype name (the known ones listed).
    """
    name = str(dtype).strip().lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        known = ", ".join([*DTYPE_BYTES, *_DTYPE_ALIASES])
        raise HyperparameterError("dtype", dtype, f"must be one of {known}", algorithm="memory")
    return name, DTYPE_BYTES[name]


# ------------------------------------------------------------------ measured
def memory_report(optimizer: Any) -> MemoryReport:
    """Measure ``optimizer``'s state memory (see :class:`MemoryReport` for what counts).

    Args:
        optimizer: any ``torch.optim.Optimizer`` (or an object with its
            ``state`` and ``param_groups``).

    Returns:
        The bytes, by slot and by group.

    Raises:
        TypeError: ``optimizer`` has no ``state`` mapping or ``param_groups`` list.
    """
    import torch  # deferred: imports torch

    state = getattr(optimizer, "state", None)
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(state, Mapping) or not isinstance(groups, list):
        raise TypeError(
            f"optiplug.memory needs a torch optimizer (state and param_groups), got "
            f"{type(optimizer).__name__}"
        )
    seen: set[tuple[Any, ...]] = set()
    parameter_bytes = numel = 0
    for group in groups:
        for param in group.get("params", ()):
            key, size = _storage(param)
            if key not in seen:
                seen.add(key)
                parameter_bytes += size
                numel += param.numel()
    by_slot: dict[str, int] = {}
    by_group: list[int] = []
    listed: set[int] = set()
    for group in groups:
        in_group = 0
        for param in group.get("params", ()):
            listed.add(id(param))
            for slot, tensor in _tensors(state.get(param, {}), torch.Tensor):
                in_group += _count(tensor, slot, seen, by_slot)
        for key, value in group.items():
            if key != "params":
                for _, tensor in _tensors({key: value}, torch.Tensor):
                    in_group += _count(tensor, key, seen, by_slot)
        by_group.append(in_group)
    for param, slots in state.items():  # state of parameters no group lists, or under other keys
        if id(param) not in listed:
            entry = slots if isinstance(slots, Mapping) else {str(param): slots}
            for slot, tensor in _tensors(entry, torch.Tensor):
                _count(tensor, slot, seen, by_slot)
    return MemoryReport(
        total=sum(by_slot.values()),
        by_slot=by_slot,
        by_group=tuple(by_group),
        parameters=parameter_bytes,
        num_parameters=numel,
    )


def _tensors(slots: Any, tensor_type: type[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(slot, tensor)`` for each tensor in a state entry, looking inside lists and dicts."""
    if not isinstance(slots, Mapping):
        return
    for slot, value in slots.items():
        pending = [value]
        while pending:
            item = pending.pop()
            if isinstance(item, tensor_type):
                yield str(slot), item
            elif isinstance(item, (list, tuple)):
                pending.extend(reversed(item))
            elif isinstance(item, Mapping):
                pending.extend(reversed(list(item.values())))


def _storage(tensor: torch.Tensor) -> tuple[tuple[Any, ...], int]:
    """A key identifying ``tensor``'s storage, and that storage's size in bytes.

    A DTensor counts its local shard (this rank's memory). Tensors without a
    real storage (meta, fake) count ``element_size * numel`` under their id.
    """
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    try:
        storage = local.untyped_storage()
        pointer = storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        pointer = 0
    if pointer == 0 or local.device.type == "meta":
        return ("id", id(local)), local.element_size() * local.numel()
    return (str(local.device), pointer), storage.nbytes()


def _flattened(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The tensors holding ``tensor``'s data: itself, or a subclass's inner tensors.

    A wrapper subclass (a quantized optimizer state) has no storage of its
    own; ``__tensor_flatten__`` names the attributes holding its tensors,
    which may be subclasses again. A DTensor is its local shard's.
    """
    if _is_dtensor(tensor):  # this rank's shard, itself perhaps quantized
        local = getattr(tensor, "_local_tensor", None)
        yield from _flattened(tensor.to_local() if local is None else local)  # type: ignore[attr-defined]  # a DTensor's
        return
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is None or type(tensor).__name__ in ("Tensor", "Parameter"):
        yield tensor
        return
    names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    for name in names:
        yield from _flattened(getattr(tensor, name))


def _is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (its local shard is what this rank holds)."""
    return hasattr(tensor, "to_local")


def _count(
    tensor: torch.Tensor, slot: str, seen: set[tuple[Any, ...]], by_slot: dict[str, int]
) -> int:
    by_slot.setdefault(slot, 0)
    counted = 0
    for part in _flattened(tensor):
        key, size = _storage(part)
        if key not in seen:
            seen.add(key)
            counted += size
    by_slot[slot] += counted
    return counted


# ------------------------------------------------------------------ estimated
def estimate(
    spec: OptimizerSpec,
    num_parameters: float,
    *,
    dtype: str = "float32",
    num_tensors: int | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> MemoryEstimate:
    """Estimate the state memory of ``spec``'s algorithm from its declared slots.

    A ``"param"``-shaped slot takes ``num_parameters`` elements: of the
    parameter dtype (slot dtype ``"param"`` or ``"float"``) or 4 bytes
    (``"float32"``); with a ``state_precision`` hyperparameter other than
    ``"fp32"``, the codes and scales of that precision instead
    (:func:`~optiplug.base.QuantizedState`: 2 bytes for bf16, 1 + 4/256 for
    int8, 0.5 + 4/128 for int4). A ``"scalar"`` slot takes one element per parameter
    tensor, ``num_tensors`` of them (default: one per
    :data:`PARAMETERS_PER_TENSOR` parameters, rounded up). A slot present
    ``when`` a hyperparameter is truthy counts when the algorithm's default,
    overridden by ``hparams``, is truthy; when that value is None (decided per
    param group) or the key is no hyperparameter, the slot is omitted and
    listed in :attr:`MemoryEstimate.omitted`. Values are not validated, only
    names.

    Args:
        spec: the algorithm (its ``state_slots`` must be declared).
        num_parameters: parameter elements (``7e9`` is accepted: any
            integral number >= 0).
        dtype: the parameters' dtype name.
        num_tensors: parameter tensors, for scalar slots; None estimates.
        hparams: hyperparameters that decide conditional slots (``amsgrad``).

    Returns:
        The estimate.

    Raises:
        HyperparameterError: a negative or fractional count, an unknown dtype
            or hyperparameter name, or an algorithm that declares no state slots.
    """
    count = _whole("num_parameters", num_parameters, spec.name)
    dtype_name, size = dtype_bytes(dtype)
    tensors = (
        max(1, math.ceil(count / PARAMETERS_PER_TENSOR))
        if num_tensors is None
        else _whole("num_tensors", num_tensors, spec.name)
    )
    if spec.state_slots is None:
        raise HyperparameterError(
            "algorithm",
            spec.name,
            "declares no state slots, so its memory cannot be estimated "
            "(measure a real optimizer with optiplug.memory)",
            algorithm=spec.name,
        )
    values = _hyperparameters(spec, hparams or {})
    precision = str(values.get("state_precision", "fp32"))
    by_slot: dict[str, int] = {}
    omitted: list[str] = []
    for slot in spec.state_slots:
        why = _absent(slot, values) or _unsized(slot)
        if why:
            omitted.append(f"{slot.name}: {why}")
            continue
        if slot.kind == "number":  # a Python number in the state, not a tensor
            by_slot[slot.name] = 0
            continue
        by_slot[slot.name] = _slot_bytes(slot, count, tensors, size, precision)
    return MemoryEstimate(
        algorithm=spec.name,
        dtype=dtype_name,
        num_parameters=count,
        num_tensors=tensors,
        total=sum(by_slot.values()),
        by_slot=by_slot,
        parameters=count * size,
        omitted=tuple(omitted),
    )


def _slot_bytes(slot: StateSlot, count: int, tensors: int, size: int, precision: str) -> int:
    """Bytes of one slot: a parameter-shaped one in ``precision`` (codes and scales).

    Low precisions are counted at their large-tensor rate (every tensor of
    at least :data:`~optiplug.base.MIN_QUANTIZED_NUMEL` elements, whole
    blocks); smaller tensors, which stay full precision, are not told apart.
    """
    if slot.dtype == "float32":  # a step counter kept as a float32 tensor
        return 4 * (count if slot.shape == "param" else tensors)
    if slot.shape != "param":
        return size * tensors
    if precision == "fp32":
        return size * count
    return math.ceil(state_bytes_per_element(precision) * count)


def _whole(name: str, value: Any, algorithm: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or value != int(value)
    ):
        raise HyperparameterError(name, value, "must be a whole number >= 0", algorithm=algorithm)
    return int(value)


def _hyperparameters(spec: OptimizerSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    values = {h.name: h.default for h in spec.hyperparameters}
    values.update(spec.defaults)
    conditions = {slot.when for slot in spec.state_slots or () if slot.when}
    unknown = sorted(set(given) - set(values) - conditions)
    if unknown:
        known = ", ".join(sorted(set(values) | conditions))
        raise HyperparameterError(
            unknown[0],
            given[unknown[0]],
            f"unknown; {spec.name} takes {known}",
            algorithm=spec.name,
        )
    values.update(given)
    return values


def _unsized(slot: StateSlot) -> str:
    """Why a slot's size cannot be derived from the parameter count ('' when it can)."""
    if slot.kind == "number":
        return ""
    if slot.kind != "tensor" or slot.shape == "any":
        return "its size is not declared (measure a real optimizer with optiplug.memory)"
    return ""


def _absent(slot: StateSlot, values: Mapping[str, Any]) -> str:
    """Why ``slot`` is not counted ('' when it is)."""
    if slot.when is None:
        return ""
    if slot.when not in values:
        return (
            f"present when {slot.when}, which is not a hyperparameter (set it with {slot.when}=...)"
        )
    value = values[slot.when]
    if value is None:
        return f"present when {slot.when}, which is None here (decided per param group)"
    return "" if value else f"{slot.when} is {value!r}"

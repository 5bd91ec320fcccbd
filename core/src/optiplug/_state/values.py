"""Checks of single values in an optimizer state dict: slot tensors and hyperparameters.

Each check returns *findings* ``(kind, expected, found)``; the caller places
them (group, parameter, slot) into :class:`~optiplug.Problem` records. No
check raises on odd input: anything unexpected is itself a finding.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from .._core.specs import OptimizerSpec, StateSlot
from ..errors import HyperparameterError
from ..validators import learning_rate, validate_hyperparameters
from .codec import QuantizedState, local_of
from .quantized_check import structure_findings

__all__ = [
    "IMPLEMENTATION_FLAGS",
    "OPTIONAL_GROUP_KEYS",
    "Finding",
    "ParamInfo",
    "config_fields",
    "copied_tensor",
    "describe",
    "generic_findings",
    "hyperparameter_findings",
    "inner_tensors",
    "is_subclass_tensor",
    "plain_value_error",
    "same_value",
    "slot_findings",
    "truthy",
]

Finding = tuple[str, str, str]
"""``(kind, expected, found)``."""

IMPLEMENTATION_FLAGS = frozenset(
    {"foreach", "fused", "capturable", "differentiable", "state_precision"}
)
"""Group keys describing how an optimizer runs or stores its state, not the state itself: the
loading optimizer keeps its own (a full-precision checkpoint loads into an int8 optimizer,
whose state is then stored in int8, and back)."""

OPTIONAL_GROUP_KEYS = IMPLEMENTATION_FLAGS | {"maximize", "decoupled_weight_decay", "initial_lr"}
"""Group keys a state dict may lack (older torch) or carry extra (schedulers) without error."""

_GENERIC_CLASS_KEYS = frozenset({"decoupled_weight_decay"})
_SIMPLE = (type(None), bool, int, float, str)
_MAX_REPR = 60


@attrs.frozen
class ParamInfo:
    """What state checks need to know about a parameter.

    Attributes:
        shape: the parameter's shape.
        dtype: its dtype.
        layout: its layout (``torch.strided`` for dense tensors).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: torch.layout = torch.strided

    @classmethod
    def of(cls, tensor: torch.Tensor) -> ParamInfo:
        """Describe ``tensor``."""
        return cls(tuple(tensor.shape), tensor.dtype, tensor.layout)


def describe(value: Any) -> str:
    """A short description of ``value`` for a problem report."""
    if isinstance(value, torch.Tensor):
        kind = type(value).__name__ if is_subclass_tensor(value) else "tensor"
        return f"{kind}{list(value.shape)} {_dtype_name(value.dtype)}"
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape_text(shape: tuple[int, ...]) -> str:
    return str(list(shape))


def _floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _tensor_kind(value: Any) -> Finding | None:
    if not isinstance(value, torch.Tensor):
        return ("type", "a tensor", f"{type(value).__name__} {describe(value)}")
    if value.layout is not torch.strided:
        return ("layout", "a dense (strided) tensor", str(value.layout))
    return None


def _expected_dtype(slot: StateSlot, param: ParamInfo) -> torch.dtype | None:
    return {"param": param.dtype, "float32": torch.float32}.get(slot.dtype)


def _dtype_finding(slot: StateSlot, value: torch.Tensor, param: ParamInfo) -> Finding | None:
    if slot.dtype == "any":
        return None
    expected = _expected_dtype(slot, param)
    if expected is None:
        if _floating(value.dtype):
            return None
        return ("dtype", "a floating dtype", _dtype_name(value.dtype))
    if value.dtype == expected:
        return None
    why = " (the parameter's dtype)" if slot.dtype == "param" else ""
    return ("dtype", f"{_dtype_name(expected)}{why}", _dtype_name(value.dtype))


def slot_findings(slot: StateSlot, value: Any, param: ParamInfo) -> list[Finding]:
    """Check one declared slot's value against its rule and the parameter.

    Never raises: a value whose check fails (a tensor subclass without the
    operator a check needs) is an ``uninspectable`` finding.

    Args:
        slot: the declared slot.
        value: the value found in the state dict.
        param: the parameter the state belongs to.

    Returns:
        Every finding: type, layout, shape, dtype, then constraint breaches.
    """
    try:
        if slot.kind == "any":
            return []
        if slot.kind == "number":
            return _number_findings(slot, value)
        if slot.kind == "tensors":
            return _list_findings(slot, value, param)
        return _tensor_findings(slot, value, param)
    except Exception as error:  # a value no check can read: report it, never crash
        return [_uninspectable(value, error)]


def _uninspectable(value: Any, error: Exception) -> Finding:
    found = f"{type(value).__name__}: {type(error).__name__}: {error}"
    return ("uninspectable", "a value optiplug can check", found[:200])


def _number_findings(slot: StateSlot, value: Any) -> list[Finding]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [("type", "a number", f"{type(value).__name__} {describe(value)}")]
    if "finite" in slot.constraints and not math.isfinite(value):
        return [("non-finite", "a finite number", repr(value))]
    if "non_negative" in slot.constraints and value < 0:
        return [("negative", "a number >= 0", repr(value))]
    if "integral" in slot.constraints and math.isfinite(value) and value != int(value):
        return [("non-integral", "a whole number", repr(value))]
    return []


def _list_findings(slot: StateSlot, value: Any, param: ParamInfo) -> list[Finding]:
    if not isinstance(value, (list, tuple)):
        return [("type", "a list or tuple of tensors", f"{type(value).__name__} {describe(value)}")]
    found: list[Finding] = []
    for index, item in enumerate(value):
        wrong = _tensor_kind(item)
        if wrong is not None:
            found.append((wrong[0], f"item {index}: {wrong[1]}", wrong[2]))
            continue
        dtype = _dtype_finding(slot, item, param)
        problems = [dtype] if dtype is not None else constraint_findings(slot.constraints, item)
        found += [(kind, f"item {index}: {expected}", got) for kind, expected, got in problems]
    return found


def _tensor_findings(slot: StateSlot, value: Any, param: ParamInfo) -> list[Finding]:
    wrong = _tensor_kind(value)
    if wrong is not None:
        return [wrong]
    found: list[Finding] = []
    expected_shape = {"param": param.shape, "scalar": ()}.get(slot.shape)
    if expected_shape is not None and tuple(value.shape) != expected_shape:
        rule = "the parameter's shape" if slot.shape == "param" else "a scalar"
        found.append(
            ("shape", f"{_shape_text(expected_shape)} ({rule})", _shape_text(tuple(value.shape)))
        )
    dtype = _dtype_finding(slot, value, param)
    if dtype is not None:
        return [*found, dtype, *_device_findings(value)]
    return found + constraint_findings(slot.constraints, value)


def _device_findings(value: torch.Tensor) -> list[Finding]:
    """A meta tensor has no data: it can be neither checked nor loaded."""
    if value.device.type == "meta":
        return [("device", "a tensor with data (not on the meta device)", "meta")]
    return []


def inner_tensors(value: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors a tensor subclass is made of (``__tensor_flatten__``), recursively.

    A plain tensor is its own single inner tensor.
    """
    flatten = getattr(type(value), "__tensor_flatten__", None)
    if type(value) is torch.Tensor or type(value) is torch.nn.Parameter or flatten is None:
        return [value]
    names, _ = value.__tensor_flatten__()  # type: ignore[attr-defined]
    found: list[torch.Tensor] = []
    for name in names:
        inner = getattr(value, name)
        if isinstance(inner, torch.Tensor):  # a DTensor also names its (non-tensor) device mesh
            found += inner_tensors(inner)
    return found


def is_subclass_tensor(value: torch.Tensor) -> bool:
    """Whether ``value`` is a wrapper tensor subclass (``__tensor_flatten__``), not plain data.

    A ``DTensor`` (FSDP2's sharded state) is not: it is a shard of plain
    data, which torch copies, moves and checkpoints as such.
    """
    kind = type(value)
    if kind in (torch.Tensor, torch.nn.Parameter) or not hasattr(kind, "__tensor_flatten__"):
        return False
    distributed = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(distributed, "DTensor", None) if distributed is not None else None
    return dtensor is None or not isinstance(value, dtensor)


def copied_tensor(value: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """A copy of ``value`` (on ``device``) that shares no storage with it.

    A tensor subclass is rebuilt (``__tensor_unflatten__``) from copies of
    its inner tensors: some subclasses' ``Tensor.to(copy=True)`` returns
    one sharing their inner tensors.

    Args:
        value: a tensor or tensor subclass.
        device: where the copy goes; None keeps the device.

    Returns:
        The copy, detached.
    """
    cls = type(value)
    if is_subclass_tensor(value) and hasattr(cls, "__tensor_unflatten__"):
        names, context = value.__tensor_flatten__()  # type: ignore[attr-defined]
        inner = {name: copied_tensor(getattr(value, name), device) for name in names}
        rebuilt: torch.Tensor = cls.__tensor_unflatten__(
            inner, context, value.shape, value.stride()
        )
        return rebuilt
    return value.detach().to(device=value.device if device is None else device, copy=True)


def constraint_findings(constraints: tuple[str, ...], value: torch.Tensor) -> list[Finding]:
    """Check ``finite``, ``non_negative`` and ``integral`` constraints on a tensor.

    A meta tensor (no data) is a ``device`` finding instead. optiplug's
    own :class:`~optiplug.base.QuantizedState` (or a ``DTensor`` shard of
    one) is checked structurally first
    (:func:`~optiplug._state.quantized_check.structure_findings`), then its
    decoded value takes the constraints; another tensor subclass is checked
    through its floating inner tensors, for ``finite`` only: its other
    constraints are about the values it encodes, which only it can decode.
    """
    local = local_of(value)
    if isinstance(local, QuantizedState):
        return structure_findings(local) or constraint_findings(constraints, local.dequantize())
    if is_subclass_tensor(value):
        found: list[Finding] = []
        for inner in inner_tensors(value):
            if inner.is_floating_point() and "finite" in constraints:
                found += constraint_findings(("finite",), inner)
        return found[:1]
    if value.device.type == "meta":
        return _device_findings(value)
    if value.numel() == 0 or not _floating(value.dtype):
        return []
    if value.dtype.itemsize == 1:  # float8: CPU kernels (isfinite...) need a wider dtype, exact
        value = value.float()
    found = []
    finite = torch.isfinite(value)
    if "finite" in constraints and not bool(finite.all()):
        nans = int(torch.isnan(value).sum())
        infs = int((~finite).sum()) - nans
        found.append(("non-finite", "finite values", f"{nans} NaN, {infs} Inf"))
    if value.is_complex():
        return found
    if "non_negative" in constraints and bool((value < 0).any()):
        found.append(("negative", "values >= 0", f"minimum {value.min().item()!r}"))
    if "integral" in constraints:
        kept = value[finite]
        if bool((kept != kept.round()).any()):
            found.append(("non-integral", "whole numbers", describe_values(value)))
    return found


def describe_values(value: torch.Tensor) -> str:
    """The value of a small tensor (or its first few elements)."""
    flat = value.detach().reshape(-1)[:4].tolist()
    return repr(flat[0]) if value.ndim == 0 else repr(flat)


def generic_findings(value: Any, param: ParamInfo) -> list[Finding]:
    """Checks for an optimizer without declared slots.

    A tensor must be dense, floating, shaped like the parameter (with its
    dtype) or a scalar, and finite; a plain number must be finite; ``None``
    is accepted; a list or tuple is checked item by item (any shape, since
    factored and preconditioner states have their own); anything else is a
    type problem. Never raises: a value no check can read is an
    ``uninspectable`` finding.
    """
    try:
        return _generic(value, param, nested=False)
    except Exception as error:  # a value no check can read: report it, never crash
        return [_uninspectable(value, error)]


def _generic(value: Any, param: ParamInfo, *, nested: bool) -> list[Finding]:
    if value is None or isinstance(value, (bool, int)):
        return []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [("non-finite", "a finite number", repr(value))]
    if isinstance(value, (list, tuple)):
        return [f for item in value for f in _generic(item, param, nested=True)][:1]
    wrong = _tensor_kind(value)
    if wrong is not None:
        expected = "a tensor, a number, None or a list of those"
        return [(wrong[0], expected, wrong[2])] if wrong[0] == "type" else [wrong]
    shape = tuple(value.shape)
    if not nested and shape not in (param.shape, ()):
        expected = f"{_shape_text(param.shape)} (the parameter's shape) or [] (a scalar)"
        return [("shape", expected, _shape_text(shape))]
    if not _floating(value.dtype):
        return [("dtype", "a floating dtype", _dtype_name(value.dtype)), *_device_findings(value)]
    same_shape = shape == param.shape and shape and _floating(param.dtype)
    if not nested and same_shape and value.dtype != param.dtype:
        expected = f"{_dtype_name(param.dtype)} (the parameter's dtype)"
        return [("dtype", expected, _dtype_name(value.dtype)), *_device_findings(value)]
    return constraint_findings(("finite",), value)


def truthy(value: Any) -> bool:
    """``bool(value)``, treating values that cannot be truth-tested as true."""
    try:
        return bool(value)
    except Exception:
        return True


def same_value(a: Any, b: Any) -> bool:
    """Whether two hyperparameter values are equal (tensors, tuples vs lists, 0 vs 0.0)."""
    try:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return _same_tensor(a, b)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, bool) != isinstance(b, bool):
            return False
        return bool(a == b)
    except Exception:
        return False


def _same_tensor(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu()))


def config_fields(spec: OptimizerSpec) -> dict[str, attrs.Attribute[Any]]:
    """The attrs fields of ``spec.config`` by name (empty without a config class)."""
    if spec.config is None or not attrs.has(spec.config):
        return {}
    return {field.name: field for field in attrs.fields(spec.config)}


def class_keys(spec: OptimizerSpec, current: Mapping[str, Any]) -> frozenset[str]:
    """Group keys fixed by the optimizer class, not the user (``decoupled_weight_decay``)."""
    fields = config_fields(spec)
    if not fields:
        return _GENERIC_CLASS_KEYS & current.keys()
    return frozenset(current) - fields.keys() - IMPLEMENTATION_FLAGS - {"initial_lr", "params"}


def _field_error(field: attrs.Attribute[Any], value: Any) -> str | None:
    try:
        converted = field.converter(value) if callable(field.converter) else value
        if field.validator is not None:
            field.validator(None, field, converted)
    except HyperparameterError as error:
        return error.reason
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def _single_error(
    spec: OptimizerSpec, key: str, value: Any, current: Mapping[str, Any]
) -> str | None:
    """Validate one key with the spec's config field, or the well-known rules."""
    fields = config_fields(spec)
    if key in fields:
        return _field_error(fields[key], value)
    if key == "initial_lr":
        return _field_error(attrs.fields(_InitialLr).initial_lr, value)
    try:
        validate_hyperparameters(
            spec.name,
            {key: value},
            factory=spec.factory,
            check_unknown=False,
            defaults={k: v for k, v in current.items() if k == key},
        )
    except HyperparameterError as error:
        return error.reason
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return _type_error(value)


def plain_value_error(value: Any) -> str | None:
    """Why ``value`` is no plain group value (number, bool, string, None, 0-d tensor, tuple).

    Returns:
        None when it is one, else the rule it breaks.
    """
    return _type_error(value)


def _type_error(value: Any) -> str | None:
    if isinstance(value, _SIMPLE):
        return None
    if isinstance(value, torch.Tensor) and value.ndim == 0 and value.layout is torch.strided:
        return None
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SIMPLE) for v in value):
        return None
    return "must be a number, bool, string, None, 0-d tensor or a tuple of those"


@attrs.frozen
class _InitialLr:
    """Validates ``initial_lr`` (added by torch LR schedulers) like ``lr``."""

    initial_lr: float = attrs.field(validator=learning_rate)


def hyperparameter_findings(
    spec: OptimizerSpec, values: Mapping[str, Any], current: Mapping[str, Any] | None = None
) -> dict[str, Finding]:
    """Validate saved group hyperparameters as the constructor would.

    Each key is checked alone first (so every bad value is reported), then
    the config class runs over the keys that passed, for cross-field rules
    (e.g. Nesterov needs momentum); the key it blames is reported and the
    check repeats without it.

    Args:
        spec: the algorithm.
        values: the saved group's hyperparameters to check.
        current: the loading optimizer's own group values; without a config
            class they declare shapes (how many betas).

    Returns:
        ``{key: finding}`` for each rejected key.
    """
    found: dict[str, Finding] = {}
    for key, value in values.items():
        error = _single_error(spec, key, value, current or {})
        if error is not None:
            found[key] = ("hyperparameter", error, describe(value))
    fields = config_fields(spec)
    good = {k: v for k, v in values.items() if k in fields and k not in found}
    while good:
        blamed = _cross_field_error(spec, good)
        if blamed is None:
            break
        key, reason = blamed
        found[key] = ("hyperparameter", reason, describe(good.pop(key)))
    return found


def _cross_field_error(spec: OptimizerSpec, values: dict[str, Any]) -> tuple[str, str] | None:
    try:
        validate_hyperparameters(spec.name, values, config=spec.config)
    except HyperparameterError as error:
        key = error.field if error.field in values else next(iter(values))
        return key, error.reason
    except Exception as error:
        return next(iter(values)), f"{type(error).__name__}: {error}"
    return None

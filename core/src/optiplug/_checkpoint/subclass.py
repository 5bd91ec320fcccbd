"""Tensor subclasses (quantized optimizer state) in a checkpoint's metadata.

A wrapper tensor subclass has no storage of its own: torch's traceable
subclass protocol names the plain tensors it is made of
(``__tensor_flatten__`` returns their attribute names and a context) and
rebuilds it from them (``__tensor_unflatten__(inner, context, size,
stride)``). A checkpoint stores the inner tensors like any other and
records, in ``metadata.json``::

    {"subclass": {"class": "module:QualName", "inner": {attr: value},
                  "context": value, "size": [...], "stride": [...]}}

The context is encoded like any value, plus ``{"dtype": "float32"}`` and
``{"size": [...]}`` for the dtypes and sizes subclasses keep there.

Loading imports no module a file names, other than optiplug's own codec
(:data:`_OWN_MODULES`): any other class must already be imported (the
optimizer that loads the state imported its library; verifying imports the
plugin of the checkpoint's algorithm first), and must be a ``torch.Tensor``
subclass with ``__tensor_unflatten__``; otherwise the load fails with a
:class:`~optiplug.errors.CheckpointError` naming the class and what to
install.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from ..errors import CheckpointError

__all__ = ["check_encoded", "decode_subclass", "encode_subclass", "is_subclass"]

TAG = "subclass"
_KEYS = frozenset({"class", "inner", "context", "size", "stride"})
_OWN_MODULES = frozenset({"optiplug.base", "optiplug._state.codec"})
"""Where optiplug's own tensor subclass (:class:`~optiplug.base.QuantizedState`) is named
from: the one code a checkpoint may cause to be imported, as it ships with this library."""

Encoder = Callable[[Any, str, dict[str, torch.Tensor]], Any]
Decoder = Callable[[Any, Mapping[str, torch.Tensor], str], Any]


def is_subclass(value: Any) -> bool:
    """Whether ``value`` is a wrapper tensor subclass (``__tensor_flatten__``)."""
    return (
        isinstance(value, torch.Tensor)
        and type(value) not in (torch.Tensor, torch.nn.Parameter)
        and hasattr(type(value), "__tensor_flatten__")
        and hasattr(type(value), "__tensor_unflatten__")
    )


def encode_subclass(
    value: torch.Tensor, name: str, tensors: dict[str, torch.Tensor], encode: Encoder
) -> dict[str, Any]:
    """The metadata record of a subclass tensor; its inner tensors go to ``tensors``.

    Raises:
        CheckpointError: a context value that cannot be stored.
    """
    attributes, context = value.__tensor_flatten__()  # type: ignore[attr-defined]
    cls = type(value)
    inner = {attr: encode(getattr(value, attr), f"{name}.{attr}", tensors) for attr in attributes}
    return {
        TAG: {
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "inner": inner,
            "context": _encode_context(context, f"{name}.context", tensors, encode),
            "size": list(value.shape),
            "stride": list(value.stride()),
        }
    }


def _encode_context(
    value: Any, name: str, tensors: dict[str, torch.Tensor], encode: Encoder
) -> Any:
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, (tuple, list)):
        tag = "tuple" if isinstance(value, tuple) else "list"
        items = [_encode_context(v, f"{name}.{i}", tensors, encode) for i, v in enumerate(value)]
        return {tag: items}
    return encode(value, name, tensors)


def decode_subclass(
    record: Any, tensors: Mapping[str, torch.Tensor], where: str, decode: Decoder
) -> torch.Tensor:
    """Rebuild the subclass tensor :func:`encode_subclass` recorded.

    Raises:
        CheckpointError: a malformed record, or a class that is not imported
            or is no tensor subclass.
    """
    if not isinstance(record, Mapping) or set(record) != _KEYS:
        raise CheckpointError(f"{where}: a malformed tensor-subclass record")
    cls = _imported_class(record["class"], where)
    inner = {attr: decode(v, tensors, where) for attr, v in dict(record["inner"]).items()}
    context = _decode_context(record["context"], tensors, where, decode)
    try:
        rebuilt = cls.__tensor_unflatten__(  # type: ignore[attr-defined]
            inner, context, torch.Size(record["size"]), tuple(record["stride"])
        )
    except Exception as error:
        raise CheckpointError(
            f"{where}: {record['class']} could not be rebuilt from its parts "
            f"({type(error).__name__}: {error})"
        ) from error
    if not isinstance(rebuilt, torch.Tensor):
        raise CheckpointError(f"{where}: {record['class']} rebuilt something other than a tensor")
    return rebuilt


def _imported_class(path: Any, where: str) -> type:
    module_name, _, qualname = str(path).partition(":")
    target: Any = sys.modules.get(module_name) or _own_module(module_name)
    if target is None:
        top = module_name.partition(".")[0]
        raise CheckpointError(
            f"{where} holds a {path} tensor, and {module_name} is not imported: install "
            f"the library that provides {top} (with the plugin of the checkpoint's "
            "algorithm) and import it before loading; a checkpoint imports only "
            "optiplug's own modules and its algorithm's plugin"
        )
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not (
        isinstance(target, type)
        and issubclass(target, torch.Tensor)
        and hasattr(target, "__tensor_unflatten__")
    ):
        raise CheckpointError(f"{where}: {path} is not a tensor subclass that can be rebuilt")
    return target


def _own_module(name: str) -> Any:
    """optiplug's own module ``name`` (its codec's classes), imported; None for any other."""
    if name not in _OWN_MODULES:
        return None
    return importlib.import_module(name)


def _decode_context(
    value: Any, tensors: Mapping[str, torch.Tensor], where: str, decode: Decoder
) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "dtype" and isinstance(inner, str):
            dtype = getattr(torch, inner, None)
            if isinstance(dtype, torch.dtype):
                return dtype
        if tag == "size" and isinstance(inner, list):
            return torch.Size(int(v) for v in inner)
        if tag in ("tuple", "list") and isinstance(inner, list):
            items = [_decode_context(v, tensors, where, decode) for v in inner]
            return tuple(items) if tag == "tuple" else items
    return decode(value, tensors, where)


def check_encoded(
    record: Any, tensors: Collection[str], check: Callable[[Any], None], fail: Callable[[], None]
) -> None:
    """Check a subclass record's structure (no import): ``check`` each inner value, else ``fail``."""
    if not isinstance(record, Mapping) or set(record) != _KEYS:
        fail()
        return
    sizes = (record["size"], record["stride"])
    if not isinstance(record["class"], str) or ":" not in record["class"]:
        fail()
    if not all(isinstance(s, list) and all(isinstance(v, int) for v in s) for s in sizes):
        fail()
    if not isinstance(record["inner"], Mapping) or not record["inner"]:
        fail()
        return
    for value in record["inner"].values():
        check(value)
    _check_context(record["context"], check)


def _check_context(value: Any, check: Callable[[Any], None]) -> None:
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "dtype" and isinstance(inner, str):
            return
        if tag == "size" and isinstance(inner, list) and all(isinstance(v, int) for v in inner):
            return
        if tag in ("tuple", "list") and isinstance(inner, list):
            for item in inner:
                _check_context(item, check)
            return
    check(value)

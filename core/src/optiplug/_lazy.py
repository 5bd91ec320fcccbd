"""Lazy references, so plugin modules can name factories without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

import attrs

__all__ = ["LazyCallable", "lazy"]


@attrs.frozen
class LazyCallable:
    """A picklable ``"module:attribute"`` reference, imported on first call.

    Attributes:
        target: ``"package.module:attribute"``.
        kwargs: keywords bound in front of the caller's (as ``functools.partial``).
    """

    target: str = attrs.field()
    kwargs: dict[str, Any] = attrs.field(factory=dict, converter=dict)

    @target.validator
    def _check_target(self, _: attrs.Attribute[str], value: str) -> None:
        module, _colon, attribute = value.partition(":")
        if not module or not attribute:
            raise ValueError(f"lazy target must look like 'module:attribute', got {value!r}")

    def resolve(self) -> Callable[..., Any]:
        """Import and return the referenced object."""
        module_name, _, attribute = self.target.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
        # A lazy target names a callable (a factory, a class); what an import
        # finds has no static type.
        return cast("Callable[..., Any]", obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **{**self.kwargs, **kwargs})


def lazy(target: str, **kwargs: Any) -> LazyCallable:
    """Refer to ``"module:attribute"`` without importing it yet.

    Args:
        target: ``"package.module:attribute"``, e.g. ``"optiplug_adam:Adam"``.
        **kwargs: keywords bound in front of the caller's.

    Returns:
        A picklable callable that imports the target on first call.
    """
    return LazyCallable(target, kwargs)

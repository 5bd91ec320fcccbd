"""Lazy references, so plugin modules can name factories without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any, cast

import attrs

__all__ = ["LazyCallable", "LazyConfig", "lazy", "lazy_config", "lazy_config_lookup"]


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


class LazyConfig(type):
    """Metaclass of a config class whose attrs class is built on first use.

    attrs generates and compiles each class's methods (about 0.4 ms a
    class); a bridge of a hundred entries would pay that on every ``optiplug
    list``, which never reads a schema. A class of this metaclass stands in
    for the attrs class: calling it, and reading an attribute it lacks
    (``__attrs_attrs__``, which ``attrs.fields`` and ``attrs.has`` read),
    builds the attrs class once and defers to it; an instance of the attrs
    class is an instance of the stand-in.
    """

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__optiplug"):
            raise AttributeError(name)
        return getattr(cls.built(), name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.built()(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        """An instance of the attrs class is one of this stand-in (what calling it builds)."""
        return isinstance(instance, cls.built())

    def built(cls) -> type:
        """The attrs class (built on the first call).

        It is given the stand-in's name, module and docstring, so that
        :func:`lazy_config_lookup` serves it under that name and its
        instances pickle.
        """
        real: type | None = cls.__dict__.get("__optiplug_built")
        if real is None:
            real = cls.__dict__["__optiplug_build"]()
            real.__name__ = real.__qualname__ = cls.__name__
            real.__module__, real.__doc__ = cls.__module__, cls.__doc__
            type.__setattr__(cls, "__optiplug_built", real)
        return real


def lazy_config(name: str, build: Callable[[], type], *, module: str, doc: str = "") -> type:
    """A stand-in config class that calls ``build`` for the attrs class on first use.

    Args:
        name: the class name, given to the built class too.
        build: makes the attrs config class (``attrs.make_class(...)``).
        module: the module the class belongs to (``__name__``), where
            :func:`lazy_config_lookup` serves it.
        doc: the class docstring, before and after it is built.

    Returns:
        A class of metaclass :class:`LazyConfig`.
    """
    namespace = {"__module__": module, "__doc__": doc, "__optiplug_build": build}
    return LazyConfig(name, (), namespace)


def lazy_config_lookup(configs: Iterable[type]) -> Callable[[str], type]:
    """A module ``__getattr__`` serving each lazy config's attrs class by name.

    Assigned as ``__getattr__ = lazy_config_lookup(CONFIGS.values())`` in
    the module the classes name, it makes ``from module import AcmeConfig``
    give the attrs class and lets pickle find an instance's class.

    Args:
        configs: stand-ins made by :func:`lazy_config`.

    Returns:
        A function raising ``AttributeError`` for any other name.
    """
    by_name = {cls.__name__: cls for cls in configs}

    def module_getattr(name: str) -> type:
        stand_in = by_name.get(name)
        if not isinstance(stand_in, LazyConfig):
            raise AttributeError(f"no config class named {name!r}")
        return stand_in.built()

    return module_getattr

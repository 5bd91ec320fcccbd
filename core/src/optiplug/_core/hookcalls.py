"""Calling hooks through pluggy's public API, each plugin alone in managers of its own.

Also here: checking what a hook returned (:func:`typed_records`) and
refusing functions that look like hooks but are not (:func:`unknown_hooks`).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pluggy

from ..errors import closest_name
from .hooks import HOOK_NAMES, PROJECT_NAME, HookSpecs, hookimpl
from .specs import Candidate, Problem

__all__ = [
    "UnknownHooks",
    "failure_text",
    "outcomes_of",
    "plugin_managers",
    "typed_records",
    "unknown_hooks",
]

Outcome = tuple[str, Any, "BaseException | None"]
"""``(plugin name, result or None, exception or None)``: one answer or one failure."""

_Answer = tuple[str, object]


class _Interrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` in a plugin's hook, its message naming the plugin."""


def _unpacking(hook_name: str) -> Callable[[], Generator[None, list[Any], list[Any]]]:
    @hookimpl(wrapper=True, trylast=True, specname=hook_name)
    def unpack() -> Generator[None, list[Any], list[Any]]:
        results = yield
        return list(results[0])

    return unpack


_UNPACK = types.SimpleNamespace(**{f"unpack_{name}": _unpacking(name) for name in HOOK_NAMES})
"""The innermost wrapper: it hands a plugin's wrappers what they wrap as their results."""


class _Manager(pluggy.PluginManager):
    """A pluggy manager of optiplug's hook specs: all implementations, or wrappers or not."""

    def __init__(self, wrappers: bool | None = None) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(HookSpecs)
        self.wrappers = wrappers

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        """pluggy's options for ``plugin.name``, None if it is not of the kind kept."""
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None or self.wrappers is None:
            return opts
        return (
            opts if bool(opts.get("wrapper") or opts.get("hookwrapper")) == self.wrappers else None
        )


def plugin_managers(
    plugin: object, name: str
) -> tuple[pluggy.PluginManager, pluggy.PluginManager, pluggy.PluginManager | None]:
    """Pluggy managers holding ``plugin`` alone: all of it, all but its wrappers, its wrappers.

    The last, None when ``plugin`` wraps no hook, has :data:`_UNPACK` innermost.

    Raises:
        pluggy.PluginValidationError: an implementation matches no hook spec.
    """
    alone = _Manager()
    alone.register(plugin, name=name)
    alone.check_pending()
    hooks = alone.get_hookcallers(plugin) or ()
    if not any(i.wrapper or i.hookwrapper for hook in hooks for i in hook.get_hookimpls()):
        return alone, alone, None
    plain, wrapping = _Manager(wrappers=False), _Manager(wrappers=True)
    plain.register(plugin, name=name)
    wrapping.register(plugin, name=name)
    wrapping.register(_UNPACK, name=f"{PROJECT_NAME}-unpack")
    return alone, plain, wrapping


def outcomes_of(
    hook: pluggy.HookCaller,
    plain: Mapping[str, pluggy.PluginManager],
    wrapping: Mapping[str, pluggy.PluginManager],
    kwargs: Mapping[str, Any],
) -> list[Outcome]:
    """Call ``hook``'s plugins, each in its own managers, and collect each one's outcome.

    ``hook``, of the manager holding every plugin, gives pluggy's order. Each
    wrapping plugin, outermost first, is called with what it wraps as an
    extra implementation; at the centre each other plugin is called in turn.
    A plugin that raises (``SystemExit`` included), or whose wrapper returns
    no list, is a failure that stops no other: what it wrapped passes through.

    Args:
        hook: the hook caller of the registry's manager.
        plain: each plugin's manager of all but its wrappers (:func:`plugin_managers`).
        wrapping: each wrapping plugin's manager of its wrappers.
        kwargs: the hook's arguments.

    Returns:
        ``(plugin, result, None)`` per answer the outermost wrapper returned,
        in its order (an answer a wrapper added or replaced is its plugin's),
        then ``(plugin, None, exception)`` per failure.
    """
    impls = hook.get_hookimpls()[::-1]
    wrappers = list(dict.fromkeys(i.plugin_name for i in impls if i.wrapper or i.hookwrapper))
    centre = list(dict.fromkeys(i.plugin_name for i in impls if not (i.wrapper or i.hookwrapper)))
    failures: list[Outcome] = []

    def answers(plugin: str, extra: Sequence[Callable[[], object]] = ()) -> list[object] | None:
        """``plugin``'s answers (its wrappers' when ``extra``), None when it fails."""
        manager = wrapping[plugin] if extra else plain[plugin]
        try:
            results = getattr(manager.hook, hook.name).call_extra(extra, kwargs)
            if not isinstance(results, list):
                raise TypeError(f"its wrapper returned {shown(results)}, expected a list")
        except _Interrupted:
            raise  # an inner plugin's, already named
        except KeyboardInterrupt as error:
            where = f"{hook.name} of optiplug plugin {plugin!r}"
            raise _Interrupted(f"interrupted in {where}") from error
        except BaseException as error:  # a hook may even sys.exit()
            failures.append((plugin, None, error))
            return None
        return results

    def wrapped(outer: Sequence[str]) -> list[_Answer]:
        """The answers of every plain plugin, wrapped by ``outer`` (outermost first)."""
        if not outer:
            return [(p, r) for p in centre for r in answers(p) or ()]
        inner: list[list[_Answer]] = []

        def call() -> list[object]:
            inner.append(wrapped(outer[1:]))
            return [result for _, result in inner[0]]

        results = answers(outer[0], [call])
        if results is None:
            return inner[0] if inner else wrapped(outer[1:])
        return [next((a for a in inner[0] if a[1] is r), (outer[0], r)) for r in results]

    found = wrapped(wrappers)
    return [(plugin, result, None) for plugin, result in found] + failures


_Typed = TypeVar("_Typed", Candidate, Problem)


def typed_records(result: object, kind: type[_Typed]) -> list[_Typed] | BaseException:
    """``result`` as a list of ``kind`` records, else the error describing what it was.

    None is no records. A string, a mapping, anything not iterable, or an
    iterable holding anything but ``kind`` (or raising while iterated) is an error.
    """
    expected = f"expected an iterable of {kind.__name__}"
    if result is None:
        return []
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, Iterable):
        return TypeError(f"returned {shown(result)}, {expected}")
    try:
        items = list(result)
    except Exception as error:
        return error
    for item in items:
        if not isinstance(item, kind):
            return TypeError(f"returned {type(result).__name__} holding {shown(item)}, {expected}")
    return items


def shown(value: object) -> str:
    """``str 'adamw'``: a value's type and a short repr, for error messages."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def failure_text(error: BaseException, doing: str) -> str:
    """``"ValueError: why"`` for an exception, ``"SystemExit(3) raised while loading"`` otherwise."""
    if isinstance(error, Exception):
        return f"{type(error).__name__}: {error}"
    return f"{error!r} raised while {doing}"


class UnknownHooks(Exception):
    """A plugin defines ``optiplug_*`` functions that are not hooks (typos)."""

    def __init__(self, names: Sequence[str]) -> None:
        described = []
        for name in names:
            suggestion = closest_name(name, HOOK_NAMES)
            hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
            described.append(f"{name!r}{hint}")
        super().__init__(
            f"defines {', '.join(described)}, which {'is' if len(names) == 1 else 'are'} "
            f"not an optiplug hook; hooks: {', '.join(sorted(HOOK_NAMES))}"
        )


def unknown_hooks(plugin: object) -> list[str]:
    """Names of ``optiplug_*`` callables on ``plugin`` that are not hook specs."""
    names = [name for name in dir(plugin) if name.startswith("optiplug_")]
    return sorted(
        name for name in names if name not in HOOK_NAMES and callable(getattr(plugin, name, None))
    )

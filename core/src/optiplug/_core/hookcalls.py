"""Calling optiplug's hooks through pluggy, one plugin's failure never stopping the others.

The hooks asked for records once, when a plugin loads, are called by the
registry itself; the hooks it calls on every use (:data:`CALLED_HOOKS`:
selection rules and state validators) go through pluggy, so ``tryfirst``,
``trylast`` and hook wrappers work, with each implementation wrapped
(:func:`guarded`) so that its result or exception is reported separately
(:func:`outcomes_of`). Also here: checking what a hook returned
(:func:`typed_records`) and refusing functions that look like hooks but
are not (:func:`unknown_hooks`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import pluggy

from ..errors import closest_name
from .hooks import HOOK_NAMES
from .specs import Candidate, Problem

__all__ = [
    "CALLED_HOOKS",
    "OUTCOMES",
    "Outcome",
    "UnknownHooks",
    "failure_text",
    "guarded",
    "outcomes_of",
    "typed_records",
    "unknown_hooks",
]

CALLED_HOOKS = ("optiplug_select_optimizer", "optiplug_validate_state_dict")
"""Hooks :meth:`Registry.call_each` calls; the others are asked once, when a plugin loads."""

Outcome = tuple[str, Any, "BaseException | None"]
"""``(plugin name, result or None, exception or None)`` of one hook implementation."""

OUTCOMES: contextvars.ContextVar[list[Outcome] | None] = contextvars.ContextVar(
    "optiplug_hook_outcomes", default=None
)
"""Where guarded implementations report during :meth:`Registry.call_each`."""


def guarded(function: Callable[..., object], plugin: str, hook_name: str) -> Callable[..., object]:
    """``function``, reporting its result or exception to the running :meth:`Registry.call_each`.

    Outside a ``call_each`` (no report list) it behaves as ``function``.
    """

    def call(*args: object) -> object:
        outcomes = OUTCOMES.get()
        try:
            result = function(*args)
        except KeyboardInterrupt as error:
            where = f"{hook_name} of optiplug plugin {plugin!r}"
            raise KeyboardInterrupt(f"interrupted in {where}") from error
        except BaseException as error:  # a hook may even sys.exit()
            if outcomes is None:
                raise
            outcomes.append((plugin, None, error))
            return None
        if outcomes is not None:
            outcomes.append((plugin, result, None))
        return result

    return call


def wrapper_impls(impls: Sequence[pluggy.HookImpl]) -> list[pluggy.HookImpl]:
    return [impl for impl in impls if impl.wrapper or impl.hookwrapper]


def outermost_wrapper(impls: Sequence[pluggy.HookImpl]) -> str | None:
    """The plugin of the wrapper pluggy calls first (the last in its list), or None."""
    found = wrapper_impls(impls)
    return found[-1].plugin_name if found else None


def culprit(impls: Sequence[pluggy.HookImpl], trace: TracebackType | None) -> str | None:
    """The plugin of the wrapper that raised: the innermost wrapper frame in ``trace``.

    None when no wrapper is registered (pluggy itself raised).
    """
    codes = {
        getattr(impl.function, "__code__", None): impl.plugin_name for impl in wrapper_impls(impls)
    }
    found = None
    while trace is not None:
        found = codes.get(trace.tb_frame.f_code, found)
        trace = trace.tb_next
    return found or outermost_wrapper(impls)


def kept(
    outcomes: list[Outcome], results: list[object] | None, wrapper: str | None
) -> list[Outcome]:
    """The implementations' outcomes, as far as the wrappers kept their results.

    A result the wrappers dropped counts as None; one they added or replaced
    (not identical to any implementation's) is reported as ``wrapper``'s.
    """
    if results is None:
        return outcomes
    kept = {id(result) for result in results}
    answered = {id(result) for _, result, _ in outcomes}
    reported = [
        (plugin, result if id(result) in kept else None, error)
        for plugin, result, error in outcomes
    ]
    added = [r for r in results if id(r) not in answered]
    return reported + [(wrapper, r, None) for r in added if wrapper is not None]


def outcomes_of(hook: Any, kwargs: Mapping[str, Any]) -> list[Outcome]:
    """Call ``hook`` through pluggy and collect each implementation's outcome.

    ``tryfirst``, ``trylast`` and wrappers work as in any pluggy call; the
    implementations are :func:`guarded`, so one that raises is reported and
    the others still run. A wrapper that raises is reported as its plugin's
    failure (the innermost wrapper frame of the traceback); if it raised
    before the implementations ran, they are run plainly so that each is
    still reported. A ``KeyboardInterrupt`` propagates.

    Args:
        hook: a pluggy hook caller.
        kwargs: its arguments.

    Returns:
        ``(plugin name, result or None, exception or None)`` per
        implementation, in pluggy's call order, as far as the wrappers kept
        the results (see :func:`kept`).
    """
    impls: list[pluggy.HookImpl] = hook.get_hookimpls()
    outcomes: list[Outcome] = []
    token = OUTCOMES.set(outcomes)
    try:
        results: list[object] | None = hook(**kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # only a wrapper can raise: the others are guarded
        failed = culprit(impls, error.__traceback__)
        if failed is None:
            raise
        results = None
        outcomes.append((failed, None, error))
        if len(outcomes) == 1:  # it failed before the implementations ran
            for impl in reversed(impls):
                if not (impl.wrapper or impl.hookwrapper):
                    impl.function(*(kwargs[arg] for arg in impl.argnames))
    finally:
        OUTCOMES.reset(token)
    return kept(outcomes, results, outermost_wrapper(impls))


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

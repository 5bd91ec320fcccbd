"""Hooks are called through pluggy: ``tryfirst``/``trylast`` order them, wrappers wrap them.

A plugin whose implementation (or wrapper) raises is still isolated: it is
marked failed, the right one when several wrap, and the other plugins'
answers come back. The plugins are real modules; pluggy is not mocked.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import run_python

import optiplug
import optiplug.builtin_schedules
from optiplug.errors import PluginError, PluginWarning

REQUEST = optiplug.SelectionRequest(task="text-generation")


def _rule_plugin(name: str, **opts: bool) -> types.ModuleType:
    """A plugin whose selection rule proposes ``sgd`` under rule ``name``."""
    module = types.ModuleType(name)

    @optiplug.hookimpl(**opts)
    def optiplug_select_optimizer(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
        return [optiplug.Candidate("sgd", {"lr": 0.1}, score=1.0, rule=name)]

    module.optiplug_select_optimizer = optiplug_select_optimizer  # type: ignore[attr-defined]
    return module


def _failing_plugin(name: str, **opts: bool) -> types.ModuleType:
    module = types.ModuleType(name)

    @optiplug.hookimpl(**opts)
    def optiplug_select_optimizer(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
        raise RuntimeError(f"{name} is broken")

    module.optiplug_select_optimizer = optiplug_select_optimizer  # type: ignore[attr-defined]
    return module


Wrapping = Callable[[list[Any]], list[Any]]


def _wrapper_plugin(name: str, wrap: Wrapping) -> types.ModuleType:
    """A plugin whose new-style wrapper returns ``wrap(results)``."""
    module = types.ModuleType(name)

    @optiplug.hookimpl(wrapper=True)
    def optiplug_select_optimizer(
        request: optiplug.SelectionRequest,
    ) -> Generator[None, list[Any], list[Any]]:
        results = yield
        return wrap(results)

    module.optiplug_select_optimizer = optiplug_select_optimizer  # type: ignore[attr-defined]
    return module


def _registry(*plugins: types.ModuleType, strict: bool = False) -> optiplug.Registry:
    """A registry with only ``plugins`` (and the built-ins), registered in this order."""
    registry = optiplug.Registry(autoload=False, strict=strict)
    for plugin in plugins:
        registry.register(plugin, plugin.__name__)
    return registry


def _rules(registry: optiplug.Registry, *mine: str) -> list[str]:
    """The rules of ``mine`` among ``registry``'s candidates, in the order they came back."""
    return [c.rule for c, _ in registry.candidates(REQUEST) if c.rule in mine]


# ------------------------------------------------------------------ in one process
def test_tryfirst_and_trylast_order_the_rules() -> None:
    names = ("early", "plain", "late")
    registry = _registry(
        _rule_plugin("early", tryfirst=True),  # registered first: last without tryfirst
        _rule_plugin("late", trylast=True),
        _rule_plugin("plain"),
    )
    assert _rules(registry, *names) == ["early", "plain", "late"]


def test_a_wrapper_sees_the_results_in_call_order() -> None:
    seen: list[list[str]] = []

    def record(results: list[Any]) -> list[Any]:
        seen.append([c.rule for result in results for c in result])
        return results

    registry = _registry(
        _rule_plugin("one", tryfirst=True), _rule_plugin("two"), _wrapper_plugin("spy", record)
    )
    assert _rules(registry, "one", "two") == ["one", "two"]
    assert [rule for rule in seen[0] if rule in ("one", "two")] == ["one", "two"]


def test_what_a_wrapper_drops_or_adds_counts() -> None:
    extra = [optiplug.Candidate("adam", {"lr": 1e-3}, score=2.0, rule="added")]

    def replace(results: list[Any]) -> list[Any]:
        kept = [result for result in results if all(c.rule != "dropped" for c in result)]
        return [*kept, extra]

    registry = _registry(
        _rule_plugin("dropped"), _rule_plugin("kept"), _wrapper_plugin("editor", replace)
    )
    found = {c.rule: info.name for c, info in registry.candidates(REQUEST)}
    assert "dropped" not in found
    assert found["kept"] == "kept"
    assert found["added"] == "editor"


def test_a_failing_rule_is_isolated_whatever_its_order() -> None:
    registry = _registry(_failing_plugin("broken", tryfirst=True), _rule_plugin("fine"))
    with pytest.warns(PluginWarning, match="broken is broken"):
        assert _rules(registry, "fine") == ["fine"]
    status = {info.name: info.status for info in registry.plugins()}
    assert (status["broken"], status["fine"]) == ("failed", "active")


def test_a_failing_rule_raises_in_strict_mode() -> None:
    registry = _registry(_failing_plugin("broken", trylast=True), _rule_plugin("fine"), strict=True)
    with pytest.raises(PluginError, match="broken"), pytest.warns(PluginWarning):
        registry.candidates(REQUEST)


def test_a_failing_wrapper_is_isolated() -> None:
    def fail(results: list[Any]) -> list[Any]:
        raise RuntimeError("the wrapper is broken")

    registry = _registry(_rule_plugin("fine"), _wrapper_plugin("bad_wrapper", fail))
    with pytest.warns(PluginWarning, match="the wrapper is broken"):
        assert _rules(registry, "fine") == ["fine"]
    status = {info.name: info.status for info in registry.plugins()}
    assert (status["bad_wrapper"], status["fine"]) == ("failed", "active")


def test_a_plugins_wrapper_wraps_its_registration_hooks() -> None:
    module = types.ModuleType("renamer")

    @optiplug.hookimpl
    def optiplug_schedules() -> list[optiplug.ScheduleSpec]:
        return [optiplug.ScheduleSpec("flat", optiplug.builtin_schedules.ConstantSchedule)]

    @optiplug.hookimpl(wrapper=True, specname="optiplug_schedules")
    def rename() -> Generator[None, list[Any], list[Any]]:
        results = yield
        return [[attrs.evolve(spec, name=f"my_{spec.name}") for spec in r] for r in results]

    module.optiplug_schedules = optiplug_schedules  # type: ignore[attr-defined]
    module.rename = rename  # type: ignore[attr-defined]
    registry = _registry(module, strict=True)
    assert "my_flat" in registry.schedules() and "flat" not in registry.schedules()


def _old_style_plugin(name: str, added: str) -> types.ModuleType:
    """A plugin whose old-style hookwrapper appends a candidate of rule ``added``."""
    module = types.ModuleType(name)

    @optiplug.hookimpl(hookwrapper=True)
    def optiplug_select_optimizer(request: optiplug.SelectionRequest) -> Generator[None, Any, None]:
        outcome = yield
        extra = [optiplug.Candidate("adam", {"lr": 1e-3}, score=0.5, rule=added)]
        outcome.force_result([*outcome.get_result(), extra])

    module.optiplug_select_optimizer = optiplug_select_optimizer  # type: ignore[attr-defined]
    return module


def test_tryfirst_trylast_and_both_kinds_of_wrapper_work_together() -> None:
    seen: list[list[str]] = []

    def record(results: list[Any]) -> list[Any]:
        seen.append([c.rule for result in results for c in result])
        return results

    registry = _registry(
        _rule_plugin("early", tryfirst=True),
        _rule_plugin("late", trylast=True),
        _old_style_plugin("old_style", "old"),
        _rule_plugin("plain"),
        _wrapper_plugin("new_style", record),  # registered last: the outermost wrapper
    )
    mine = ("early", "plain", "late", "old")
    assert _rules(registry, *mine) == ["early", "plain", "late", "old"]
    assert [rule for rule in seen[0] if rule in mine] == ["early", "plain", "late", "old"]
    found = {c.rule: info.name for c, info in registry.candidates(REQUEST)}
    assert found["old"] == "old_style" and found["early"] == "early"


def test_a_wrapper_runs_around_the_rules() -> None:
    events: list[str] = []
    module = types.ModuleType("around")

    @optiplug.hookimpl(wrapper=True)
    def optiplug_select_optimizer(
        request: optiplug.SelectionRequest,
    ) -> Generator[None, list[Any], list[Any]]:
        events.append("before")
        results = yield
        events.append("after")
        return results

    module.optiplug_select_optimizer = optiplug_select_optimizer  # type: ignore[attr-defined]

    def rule(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
        events.append("rule")
        return []

    ruling = types.ModuleType("ruling")
    ruling.optiplug_select_optimizer = optiplug.hookimpl(rule)  # type: ignore[attr-defined]
    _registry(ruling, module).candidates(REQUEST)
    assert events == ["before", "rule", "after"]


def _raising_wrapper(name: str, before: bool) -> types.ModuleType:
    """A plugin whose wrapper raises before or after the rules ran."""

    def fail(results: list[Any]) -> list[Any]:
        raise RuntimeError(f"{name} is broken")

    module = _wrapper_plugin(name, fail)
    if before:

        @optiplug.hookimpl(wrapper=True)
        def optiplug_select_optimizer(
            request: optiplug.SelectionRequest,
        ) -> Generator[None, list[Any], list[Any]]:
            raise RuntimeError(f"{name} is broken")
            yield  # pragma: no cover

        module.optiplug_select_optimizer = optiplug_select_optimizer  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize("before", [True, False], ids=["before-yield", "after-yield"])
@pytest.mark.parametrize("outermost", [True, False], ids=["outermost", "innermost"])
def test_the_failing_one_of_two_wrappers_is_named_and_the_other_works(
    before: bool, outermost: bool
) -> None:
    calls: list[str] = []
    extra = [optiplug.Candidate("adam", {"lr": 1e-3}, score=2.0, rule="added")]

    def add(results: list[Any]) -> list[Any]:
        return [*results, extra]

    def rule(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
        calls.append("fine")
        return [optiplug.Candidate("sgd", {"lr": 0.1}, score=1.0, rule="fine")]

    fine = types.ModuleType("fine")
    fine.optiplug_select_optimizer = optiplug.hookimpl(rule)  # type: ignore[attr-defined]
    wrappers = [_wrapper_plugin("adder", add), _raising_wrapper("bad_wrapper", before)]
    registry = _registry(fine, *(wrappers if outermost else wrappers[::-1]))
    with pytest.warns(PluginWarning, match="bad_wrapper is broken"):
        found = {c.rule: info.name for c, info in registry.candidates(REQUEST)}
    assert (found["fine"], found["added"], calls) == ("fine", "adder", ["fine"])
    status = {info.name: info.status for info in registry.plugins()}
    assert (status["bad_wrapper"], status["adder"], status["fine"]) == (
        "failed",
        "active",
        "active",
    )


def test_a_wrapper_returning_no_list_fails_its_plugin_only() -> None:
    def lose(results: list[Any]) -> Any:
        return None

    registry = _registry(_rule_plugin("fine"), _wrapper_plugin("lost", lose))
    with pytest.warns(PluginWarning, match="'lost'.*expected a list"):
        assert _rules(registry, "fine") == ["fine"]


def test_a_plugin_wrapping_its_own_rule_answers_once_and_wraps_once() -> None:
    module = _rule_plugin("both")
    wrapped: list[int] = []

    @optiplug.hookimpl(wrapper=True, specname="optiplug_select_optimizer")
    def spy(request: optiplug.SelectionRequest) -> Generator[None, list[Any], list[Any]]:
        results = yield
        wrapped.append(len(results))
        return results

    module.spy = spy  # type: ignore[attr-defined]
    registry = _registry(_rule_plugin("other"), module)
    found = [(c.rule, info.name) for c, info in registry.candidates(REQUEST)]
    assert [pair for pair in found if pair[0] in ("both", "other")] == [
        ("both", "both"),  # registered last: called first, as pluggy orders it
        ("other", "other"),
    ]
    assert len(wrapped) == 1 and wrapped[0] >= 2  # around both rules, once


def test_an_interrupted_rule_inside_a_wrapper_names_the_rule() -> None:
    interrupting = types.ModuleType("interrupting")

    def rule(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
        raise KeyboardInterrupt

    interrupting.optiplug_select_optimizer = optiplug.hookimpl(rule)  # type: ignore[attr-defined]
    registry = _registry(interrupting, _wrapper_plugin("spy", lambda results: results))
    with pytest.raises(KeyboardInterrupt, match="'interrupting'"):
        registry.candidates(REQUEST)


def test_a_plugins_registration_hooks_keep_its_own_order_and_wrappers() -> None:
    module = types.ModuleType("ordered")
    constant = optiplug.builtin_schedules.ConstantSchedule

    @optiplug.hookimpl(trylast=True, specname="optiplug_schedules")
    def last() -> list[optiplug.ScheduleSpec]:
        return [optiplug.ScheduleSpec("last", constant)]

    @optiplug.hookimpl(tryfirst=True, specname="optiplug_schedules")
    def first() -> list[optiplug.ScheduleSpec]:
        return [optiplug.ScheduleSpec("first", constant)]

    @optiplug.hookimpl(hookwrapper=True, specname="optiplug_schedules")
    def order() -> Generator[None, Any, None]:
        outcome = yield
        names = "_".join(spec.name for specs in outcome.get_result() for spec in specs)
        outcome.force_result([[optiplug.ScheduleSpec(names, constant)]])

    module.last, module.first, module.order = last, first, order  # type: ignore[attr-defined]
    other = types.ModuleType("emptying")

    @optiplug.hookimpl(wrapper=True)
    def optiplug_schedules() -> Generator[None, list[Any], list[Any]]:
        yield
        return []  # would drop every schedule it wraps

    other.optiplug_schedules = optiplug_schedules  # type: ignore[attr-defined]
    registry = _registry(other, module, strict=True)
    assert "first_last" in registry.schedules()  # the other plugin's wrapper does not wrap it


def test_a_failing_registration_wrapper_fails_its_plugin_only() -> None:
    module = types.ModuleType("bad_loader")

    @optiplug.hookimpl(wrapper=True)
    def optiplug_schedules() -> Generator[None, list[Any], list[Any]]:
        yield
        raise RuntimeError("cannot load")

    module.optiplug_schedules = optiplug_schedules  # type: ignore[attr-defined]
    with pytest.warns(PluginWarning, match="cannot load"):
        registry = _registry(module, _rule_plugin("fine"))
    status = {info.name: info.status for info in registry.plugins()}
    assert (status["bad_loader"], status["fine"]) == ("failed", "active")
    assert _rules(registry, "fine") == ["fine"]


# ------------------------------------------------------------------ installed distributions
RULE_PLUGIN = """
import optiplug

@optiplug.hookimpl({opts})
def optiplug_select_optimizer(request):
    return [optiplug.Candidate("sgd", {{"lr": 0.1}}, score=1.0, rule={name!r})]
"""

WATCHER_PLUGIN = """
import optiplug

SEEN = []

@optiplug.hookimpl(wrapper=True)
def optiplug_select_optimizer(request):
    results = yield
    SEEN.append([candidate.rule for result in results for candidate in result])
    return [*results, [optiplug.Candidate("adam", {"lr": 1e-3}, score=0.5, rule="watcher")]]
"""

ORDER = """
import json, optiplug, optiplug_watcher.plugin as watcher
registry = optiplug.Registry(strict=True)
found = registry.candidates(optiplug.SelectionRequest(task="text-generation"))
print(json.dumps({
    "rules": [[c.rule, info.name] for c, info in found],
    "seen": watcher.SEEN,
}))
"""


@pytest.mark.slow
def test_installed_plugins_are_called_in_pluggy_order(
    make_distribution: Callable[..., Path],
) -> None:
    """``aardvark`` (trylast) registers first and ``zebra`` last; ``mongoose`` is tryfirst."""
    sites = [
        make_distribution(f"optiplug-{name}", RULE_PLUGIN.format(name=name, opts=opts))
        for name, opts in (("aardvark", "trylast=True"), ("mongoose", "tryfirst=True"))
    ]
    sites.append(make_distribution("optiplug-zebra", RULE_PLUGIN.format(name="zebra", opts="")))
    sites.append(make_distribution("optiplug-watcher", WATCHER_PLUGIN))
    done = run_python(ORDER, *sites)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    mine = ("aardvark", "mongoose", "zebra", "watcher")
    rules = [pair for pair in report["rules"] if pair[0] in mine]
    assert rules == [
        ["mongoose", "mongoose"],
        ["zebra", "zebra"],
        ["aardvark", "aardvark"],
        ["watcher", "watcher"],  # added by the wrapper, reported as its plugin's
    ]
    assert [rule for rule in report["seen"][0] if rule in mine] == ["mongoose", "zebra", "aardvark"]

"""Hooks are called through pluggy: ``tryfirst``/``trylast`` order them, wrappers wrap them.

A plugin whose implementation (or wrapper) raises is still isolated: it is
marked failed and the other plugins' answers come back.
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

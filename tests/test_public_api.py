"""The public surface is exactly what ``__all__`` says, and importing is cheap."""

from __future__ import annotations

import json
import subprocess
import sys

import optiplug
import optiplug.errors

EXPECTED_ALL = {
    "Graph",
    "AutoOptimizer",
    "Selection",
    "ENTRY_POINT_GROUP",
    "PLUGIN_API_VERSION",
    "Candidate",
    "CandidateReport",
    "CommandSpec",
    "HFName",
    "ImplementationSpec",
    "LazyCallable",
    "Measurement",
    "MemoryEstimate",
    "MemoryOption",
    "MemoryPlan",
    "MemoryReport",
    "OptimizerFactory",
    "OptimizerRecord",
    "OptimizerSpec",
    "Origin",
    "ParameterRoute",
    "PluginInfo",
    "PluginWarning",
    "Problem",
    "ProviderInfo",
    "Registry",
    "Routing",
    "Schedule",
    "ScheduleSpec",
    "SelectionRequest",
    "StateSlot",
    "TuneReport",
    "TuneTrial",
    "__version__",
    "checkpoint",
    "create",
    "default_registry",
    "estimate_memory",
    "errors",
    "factory",
    "hookimpl",
    "hookspec",
    "lazy",
    "load_state_dict",
    "memory",
    "optimizers",
    "plugins",
    "record_of",
    "reset_default_registry",
    "schedule",
    "schedules",
    "spec",
    "torch_implementations",
    "validate_state_dict",
    "validators",
}

EXPECTED_ERRORS = {
    "CheckpointError",
    "ClosureRequiredError",
    "EnvironmentVariableError",
    "GraphError",
    "ImplementationError",
    "HyperparameterError",
    "ModelConfigError",
    "NativeBuildError",
    "OptimizerUnavailableError",
    "OptiplugError",
    "PluginConflictError",
    "PluginError",
    "PluginUnavailable",
    "StateDictError",
    "TuneError",
    "UnknownOptimizerError",
    "UnknownScheduleError",
    "closest_name",
}


def test_all_is_exact() -> None:
    assert set(optiplug.__all__) == EXPECTED_ALL
    assert len(optiplug.__all__) == len(set(optiplug.__all__))
    for name in optiplug.__all__:
        assert hasattr(optiplug, name), name


def test_errors_all_is_exact() -> None:
    assert set(optiplug.errors.__all__) == EXPECTED_ERRORS


def test_errors_subclass_builtins() -> None:
    errors = optiplug.errors
    for name in EXPECTED_ERRORS - {"closest_name", "OptiplugError"}:
        assert issubclass(getattr(errors, name), errors.OptiplugError), name
    assert issubclass(errors.UnknownOptimizerError, KeyError)
    assert issubclass(errors.HyperparameterError, ValueError)
    assert issubclass(errors.StateDictError, ValueError)
    assert issubclass(errors.OptimizerUnavailableError, RuntimeError)
    assert issubclass(errors.ClosureRequiredError, TypeError)


def test_import_scans_no_entry_points_and_imports_no_plugin_or_torch() -> None:
    code = (
        "import importlib.metadata as md, json, sys\n"
        "calls = []\n"
        "real = md.entry_points\n"
        "md.entry_points = lambda *a, **k: calls.append(k) or real(*a, **k)\n"
        "import optiplug\n"
        "mods = [m for m in sys.modules if m.startswith('optiplug_') or m == 'torch']\n"
        "print(json.dumps({'calls': len(calls), 'modules': mods}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report == {"calls": 0, "modules": []}


def test_importtime_lists_no_plugin_module() -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import optiplug"],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()]
    assert "optiplug" in imported
    assert not [m for m in imported if m.startswith("optiplug_")]
    assert "torch" not in imported

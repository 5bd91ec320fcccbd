"""Registry behaviour with in-process plugins: lookup, conflicts, statuses, creation."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import types

import pytest
import torch

import optiplug
from optiplug._choice.chooser import chooser_of
from optiplug.errors import (
    HyperparameterError,
    OptimizerUnavailableError,
    PluginConflictError,
    PluginError,
    PluginUnavailable,
    UnknownOptimizerError,
)


def plugin_module(
    name: str, *specs: optiplug.OptimizerSpec, api: object = None, fail: Exception | None = None
):
    """A real module object carrying hookimpls, as an entry point would load."""
    module = types.ModuleType(name)
    if api is not None:
        module.OPTIPLUG_API = api

    @optiplug.hookimpl
    def optiplug_optimizers():
        if fail is not None:
            raise fail
        return list(specs)

    module.optiplug_optimizers = optiplug_optimizers
    return module


def sgd_spec(name: str, **kwargs) -> optiplug.OptimizerSpec:
    return optiplug.OptimizerSpec(
        name=name, factory=torch.optim.SGD, defaults={"lr": 0.1}, **kwargs
    )


def params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(3))]


def test_bare_registry_has_no_optimizers() -> None:
    assert optiplug.Registry(autoload=False).optimizers() == []


def test_registered_spec_creates_with_defaults_and_provider() -> None:
    registry = optiplug.Registry(autoload=False)
    info = registry.register(
        plugin_module("acme", sgd_spec("acme_sgd")),
        "acme",
        distribution="optiplug-acme",
        version="1.2",
    )
    assert info.status == "active" and info.provides == ("optimizer:acme_sgd",)
    optimizer = registry.create("acme_sgd", params())
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == 0.1
    spec = registry.spec("acme_sgd")
    assert (spec.provider.plugin, spec.provider.distribution, spec.provider.version) == (
        "acme",
        "optiplug-acme",
        "1.2",
    )


def test_conflict_names_both_distributions_and_provider_resolves() -> None:
    registry = optiplug.Registry(autoload=False)
    registry.register(
        plugin_module("one", sgd_spec("dup")), "one", distribution="dist-one", version="1.0"
    )
    registry.register(
        plugin_module("two", sgd_spec("dup")), "two", distribution="dist-two", version="2.0"
    )
    with pytest.raises(PluginConflictError) as caught:
        registry.create("dup", params())
    message = str(caught.value)
    assert "dist-one 1.0" in message and "dist-two 2.0" in message and "provider=" in message
    assert registry.spec("dup", provider="two").provider.distribution == "dist-two"
    assert registry.spec("dup", provider="dist-one").provider.plugin == "one"
    assert isinstance(registry.create("dup", params(), provider="one"), torch.optim.SGD)


def test_alias_resolves_and_is_not_listed() -> None:
    registry = optiplug.Registry(autoload=False)
    registry.register(plugin_module("acme", sgd_spec("acme_sgd", aliases=("asgd",))), "acme")
    assert registry.spec("asgd").name == "acme_sgd"
    assert registry.optimizers() == ["acme_sgd"]


def test_unknown_name_lists_and_suggests() -> None:
    registry = optiplug.Registry(autoload=False)
    registry.register(plugin_module("acme", sgd_spec("acme_sgd")), "acme")
    with pytest.raises(UnknownOptimizerError) as caught:
        registry.spec("acme_sdg")
    assert isinstance(caught.value, KeyError)
    assert caught.value.suggestion == "acme_sgd"
    assert "Did you mean 'acme_sgd'?" in str(caught.value) and "Available: acme_sgd" in str(
        caught.value
    )


def test_failed_plugin_warns_others_work_and_name_is_unavailable() -> None:
    registry = optiplug.Registry(autoload=False, strict=False)
    registry.register(plugin_module("good", sgd_spec("good")), "good")
    with pytest.warns(optiplug.PluginWarning, match="broken"):
        info = registry.register(
            plugin_module("broken", sgd_spec("broken"), fail=RuntimeError("boom")), "broken"
        )
    assert info.status == "failed" and "boom" in info.error
    assert registry.optimizers() == ["good"]
    with pytest.raises(OptimizerUnavailableError) as caught:
        registry.create("broken", params())
    assert isinstance(caught.value.__cause__, RuntimeError) and "boom" in str(
        caught.value.__cause__
    )
    assert "failed" in str(caught.value)


def test_wrong_record_type_fails_the_plugin_and_nothing_half_applies() -> None:
    module = plugin_module("half", sgd_spec("half_ok"))

    @optiplug.hookimpl
    def optiplug_schedules():
        return ["not a ScheduleSpec"]

    module.optiplug_schedules = optiplug_schedules
    registry = optiplug.Registry(autoload=False, strict=False)
    with pytest.warns(optiplug.PluginWarning):
        info = registry.register(module, "half")
    assert info.status == "failed" and "ScheduleSpec" in info.error
    assert "half_ok" not in registry.optimizers()
    assert [p.name for p in registry.plugins() if p.distribution != "optiplug"] == ["half"]


def test_strict_mode_raises_chained() -> None:
    registry = optiplug.Registry(autoload=False, strict=True)
    with pytest.warns(optiplug.PluginWarning), pytest.raises(PluginError) as caught:
        registry.register(plugin_module("bad", fail=ValueError("nope")), "bad")
    assert isinstance(caught.value.__cause__, ValueError)


def test_disabled_plugin_is_not_loaded_and_explained() -> None:
    registry = optiplug.Registry(autoload=False, disabled={"acme"})
    info = registry.register(plugin_module("acme", sgd_spec("acme")), "acme")
    assert info.status == "disabled"
    with pytest.raises(OptimizerUnavailableError, match="OPTIPLUG_DISABLE_PLUGINS"):
        registry.spec("acme")


@pytest.mark.parametrize("api", [2, "3.1", "x"])
def test_incompatible_api_is_refused(api: object) -> None:
    registry = optiplug.Registry(autoload=False, strict=False)
    info = registry.register(plugin_module("future", sgd_spec("future"), api=api), "future")
    assert info.status == "incompatible" and "API" in info.error
    with pytest.raises(OptimizerUnavailableError, match="incompatible"):
        registry.spec("future")
    with pytest.raises(PluginError):
        optiplug.Registry(autoload=False, strict=True).register(plugin_module("f", api=api), "f")


def test_compatible_api_versions_load() -> None:
    registry = optiplug.Registry(autoload=False)
    assert registry.register(plugin_module("a", sgd_spec("a"), api=1), "a").status == "active"
    assert registry.register(plugin_module("b", sgd_spec("b"), api="1.4"), "b").status == "active"


def test_unavailable_plugin_names_what_it_would_provide_and_strict_allows_it() -> None:
    registry = optiplug.Registry(autoload=False, strict=True)
    reason = PluginUnavailable("CUDA is not available", provides=["gpu_sgd"])
    info = registry.register(plugin_module("gpu", fail=reason), "gpu")
    assert info.status == "unavailable" and info.provides == ("gpu_sgd",)
    with pytest.raises(OptimizerUnavailableError, match="CUDA is not available"):
        registry.create("gpu_sgd", params())


@pytest.mark.parametrize(
    ("name", "hparams", "field"),
    [
        ("adam", {"lr": -1.0}, "lr"),
        ("adam", {"lr": float("nan")}, "lr"),
        ("adam", {"lr": math.inf}, "lr"),
        ("adam", {"betas": (1.0, 0.9)}, "betas"),
        ("adam", {"betas": (0.9, -0.1)}, "betas"),
        ("adam", {"betas": (0.9,)}, "betas"),
        ("adamw", {"eps": 0.0}, "eps"),
        ("adamw", {"weight_decay": -1e-3}, "weight_decay"),
        ("adamw", {"amsgrad": "yes"}, "amsgrad"),
        ("sgd", {"momentum": 1.0}, "momentum"),
        ("sgd", {"momentum": -0.5}, "momentum"),
        ("sgd", {"nesterov": True}, "nesterov"),
        ("sgd", {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "nesterov"),
        ("sgd", {"lr": True}, "lr"),
    ],
)
def test_invalid_hyperparameters_name_field_and_value(name: str, hparams: dict, field: str) -> None:
    with pytest.raises(HyperparameterError) as caught:
        optiplug.create(name, params(), **hparams)
    assert caught.value.field == field and caught.value.algorithm == name
    assert field in str(caught.value) and name in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_typo_gets_did_you_mean() -> None:
    with pytest.raises(
        HyperparameterError,
        match=r"^unknown hyperparameter 'weight_decya' for optimizer adamw; did you mean 'weight_decay'\? \(accepted: ",
    ) as caught:
        optiplug.create("adamw", params(), weight_decya=0.1)
    assert caught.value.field == "weight_decya" and caught.value.suggestion == "weight_decay"


def test_param_group_overrides_are_validated() -> None:
    groups = [{"params": params(), "lr": 0.1}, {"params": params(), "lr": -2.0}]
    with pytest.raises(HyperparameterError, match=r"lr=-2\.0"):
        optiplug.create("sgd", groups)


def test_third_party_factory_without_config_is_checked_by_signature() -> None:
    registry = optiplug.Registry(autoload=False)
    registry.register(plugin_module("acme", sgd_spec("acme_sgd")), "acme")
    with pytest.raises(HyperparameterError, match="did you mean 'momentum'"):
        registry.create("acme_sgd", params(), momentun=0.9)
    with pytest.raises(HyperparameterError, match="lr=-1"):
        registry.create("acme_sgd", params(), lr=-1)
    hyper = {h.name: h for h in registry.spec("acme_sgd").hyperparameters}
    assert hyper["lr"].default == 0.1 and hyper["momentum"].constraint == "in [0, 1)"


def test_factory_is_frozen_picklable_and_validates_eagerly() -> None:
    recipe = optiplug.factory("adamw", lr=3e-4, impl="loop")
    again = pickle.loads(pickle.dumps(recipe))
    assert again == recipe
    with pytest.raises(AttributeError):
        recipe.name = "sgd"  # type: ignore[misc]
    optimizer = again(params())
    assert type(optimizer).__name__ == "AdamW" and optimizer.impl == "loop"
    assert optimizer.param_groups[0]["lr"] == 3e-4
    with pytest.raises(HyperparameterError):
        optiplug.factory("adamw", lr=-3e-4)
    with pytest.raises(UnknownOptimizerError):
        optiplug.factory("adamx")


@pytest.mark.parametrize("impl", ["loop", "foreach", "fused"])
def test_forced_implementation(impl: str) -> None:
    assert optiplug.create("adam", params(), impl=impl).impl == impl


def test_unknown_or_unsupported_implementation() -> None:
    with pytest.raises(HyperparameterError, match="available: foreach, fused, loop"):
        optiplug.create("adam", params(), impl="turbo")
    complex_params = [torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))]
    with pytest.raises(HyperparameterError, match="does not support"):
        optiplug.create("adam", complex_params, impl="fused")
    assert optiplug.create("adam", complex_params).impl in {"loop", "foreach"}


def test_default_implementation_is_measured_and_leaves_rng_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chooser_of().clear()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    optimizer = optiplug.create("sgd", params(), momentum=0.9)
    assert torch.equal(torch.get_rng_state(), state)
    (winner, timings), *_ = chooser_of().decisions().values()
    assert set(timings) == {"loop", "foreach", "fused"} and optimizer.impl == winner
    assert timings[winner] == min(timings.values())
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", "0")
    assert (
        optiplug.create("sgd", [torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]).impl
        == "fused"
    )


def test_named_parameters_are_accepted_and_recorded() -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = optiplug.create("adamw", model.named_parameters())
    assert optimizer.state_dict()["param_groups"][0]["param_names"] == ["weight", "bias"]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )


def test_discovery_happens_once_per_process() -> None:
    code = (
        "import importlib.metadata as md\n"
        "calls = []\n"
        "real = md.entry_points\n"
        "md.entry_points = lambda *a, **k: calls.append(k) or real(*a, **k)\n"
        "import optiplug, torch\n"
        "optiplug.optimizers(); optiplug.plugins(); optiplug.spec('adam')\n"
        "optiplug.create('sgd', [torch.nn.Parameter(torch.ones(1))])\n"
        "print(calls.count({'group': 'optiplug.plugins'}))\n"
    )
    assert run_python(code).stdout.strip() == "1"


def test_disable_plugins_environment_variable() -> None:
    code = (
        "import optiplug, torch\n"
        "status = {p.name: p.status for p in optiplug.plugins()}\n"
        "names = optiplug.optimizers()\n"
        "print(status['adam'], status['sgd'], 'adamw' in names, 'adam' in names or 'sgd' in names)\n"
        "try:\n"
        "    optiplug.create('sgd', [torch.nn.Parameter(torch.ones(1))])\n"
        "except optiplug.errors.OptimizerUnavailableError as e:\n"
        "    print('unavailable', 'OPTIPLUG_DISABLE_PLUGINS' in str(e))\n"
    )
    out = run_python(
        code, OPTIPLUG_DISABLE_PLUGINS="sgd, adam, pytorch_optimizer, heavyball, bitsandbytes"
    ).stdout.split("\n")
    assert out[0] == "disabled disabled True False"
    assert out[1] == "unavailable True"

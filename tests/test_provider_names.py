"""Names from several providers: native names stay, bridged ones are qualified, clashes are reported."""

from __future__ import annotations

import json
import types

import pytest
import torch

import optiplug
from optiplug import cli
from optiplug.errors import PluginConflictError, UnknownOptimizerError


def _plugin(*specs: optiplug.OptimizerSpec) -> types.ModuleType:
    module = types.ModuleType("names_plugin")
    module.optiplug_optimizers = optiplug.hookimpl(lambda: list(specs))  # type: ignore[attr-defined]
    return module


def _spec(name: str, library: str | None = None, limitation: str = "") -> optiplug.OptimizerSpec:
    origin = None
    if library is not None:
        origin = optiplug.Origin(library, "1.0", f"{library}:Cls", limitation=limitation)
    return optiplug.OptimizerSpec(
        name, torch.optim.SGD, defaults={"lr": 0.1}, description=f"{name}", origin=origin
    )


@pytest.fixture
def registry() -> optiplug.Registry:
    """A native ``adamw``, two bridges that both offer ``soap``, one of which offers ``adamw``."""
    found = optiplug.Registry(autoload=False, strict=True)
    found.register(_plugin(_spec("adamw")), "native", distribution="optiplug-native", version="1")
    found.register(
        _plugin(_spec("adamw", "libone"), _spec("soap", "libone"), _spec("adan", "libone")),
        "one",
        distribution="optiplug-one",
        version="1",
    )
    found.register(
        _plugin(_spec("soap", "libtwo", limitation="needs a closure")),
        "two",
        distribution="optiplug-two",
        version="1",
    )
    return found


def test_a_native_name_stays_and_the_bridged_one_is_reached_by_its_qualified_name(
    registry: optiplug.Registry,
) -> None:
    assert registry.spec("adamw").provider.plugin == "native"  # type: ignore[union-attr]
    assert registry.spec("one:adamw").origin.library == "libone"  # type: ignore[union-attr]
    assert registry.spec("adamw", provider="optiplug-one").provider.plugin == "one"  # type: ignore[union-attr]


def test_a_unique_bridged_name_is_reached_plainly(registry: optiplug.Registry) -> None:
    assert registry.spec("adan").provider.plugin == "one"  # type: ignore[union-attr]
    assert registry.spec("one:adan") == registry.spec("adan")


def test_two_bridges_of_one_name_are_a_reported_clash_never_a_silent_pick(
    registry: optiplug.Registry,
) -> None:
    with pytest.raises(PluginConflictError, match="qualified name: 'one:soap', 'two:soap'") as info:
        registry.spec("soap")
    assert info.value.qualified == ("one:soap", "two:soap")
    assert registry.spec("two:soap").provider.plugin == "two"  # type: ignore[union-attr]
    assert registry.clashes() == {
        "adamw": ("native:adamw", "one:adamw"),
        "soap": ("one:soap", "two:soap"),
    }


def test_a_qualifier_naming_no_provider_of_the_name_is_unknown(
    registry: optiplug.Registry,
) -> None:
    with pytest.raises(UnknownOptimizerError, match="two"):
        registry.spec("two:adan")


def test_creating_through_a_qualified_name(registry: optiplug.Registry) -> None:
    optimizer = registry.create("one:soap", [torch.nn.Parameter(torch.ones(2))])
    assert isinstance(optimizer, torch.optim.SGD)


def test_list_shows_each_under_the_name_that_reaches_it_and_reports_clashes(
    registry: optiplug.Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["list", "--json"], registry=registry) == 0
    found = json.loads(capsys.readouterr().out)
    names = sorted(item["name"] for item in found["optimizers"])
    assert names == ["adamw", "adan", "one:adamw", "one:soap", "two:soap"]
    assert found["clashes"]["adamw"]["plain_name_resolves_to"] == "native:adamw"
    assert found["clashes"]["soap"]["plain_name_resolves_to"] is None
    assert cli.main(["list"], registry=registry) == 0
    text = capsys.readouterr().out
    assert (
        "clash: 'soap' is provided as one:soap, two:soap; the plain name resolves to none" in text
    )
    assert "limited: two:soap: needs a closure" in text


def test_list_filters_by_provider(
    registry: optiplug.Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["list", "--json", "--provider", "optiplug-two"], registry=registry) == 0
    found = json.loads(capsys.readouterr().out)
    assert [item["name"] for item in found["optimizers"]] == ["two:soap"]
    assert list(found["clashes"]) == ["soap"]
    assert [plugin["name"] for plugin in found["plugins"]] == ["two"]


def _implementations(*impls: optiplug.ImplementationSpec) -> types.ModuleType:
    module = types.ModuleType("impls_plugin")
    module.optiplug_implementations = optiplug.hookimpl(lambda: list(impls))  # type: ignore[attr-defined]
    return module


def test_implementations_bind_to_their_own_algorithm_never_to_a_namesake() -> None:
    sgd = torch.optim.SGD
    found = optiplug.Registry(autoload=False, strict=True)
    found.register(_plugin(_spec("adamw")), "native", distribution="optiplug-native", version="1")
    # a bridge implementing its own adamw: its implementations are never the native one's
    bridge = _plugin(_spec("adamw", "libone"))
    bridge.optiplug_implementations = optiplug.hookimpl(  # type: ignore[attr-defined]
        lambda: [optiplug.ImplementationSpec("adamw", "bridged", sgd)]
    )
    found.register(bridge, "one", distribution="optiplug-one", version="1")
    # a kernel plugin with no algorithm of its own: a plain name means the native
    # algorithm, a qualified one the bridge's
    found.register(
        _implementations(
            optiplug.ImplementationSpec("adamw", "kernel", sgd),
            optiplug.ImplementationSpec("one:adamw", "kernel_for_one", sgd),
        ),
        "kernels",
        distribution="optiplug-kernels",
        version="1",
    )
    assert {impl.name for impl in found.implementations("adamw")} == {"kernel"}
    assert {impl.name for impl in found.implementations("one:adamw")} == {
        "bridged",
        "kernel_for_one",
    }

"""Config classes built on first use (``optiplug.validators.lazy_config``).

A bridge registers one attrs config class per entry; building them all costs
``optiplug list`` time it never needs. A lazy config stands in for the attrs
class until something reads it; these tests check that it behaves as the
attrs class does (construction, validation, ``attrs.fields``, ``isinstance``,
pickling by name), over a class made here and over every installed bridged
entry whose config is lazy.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import types

import attrs
import pytest

import optiplug
from optiplug.errors import HyperparameterError
from optiplug.validators import (
    LazyConfig,
    hyperparameter,
    lazy_config,
    lazy_config_lookup,
    learning_rate,
)


def _module_with_lazy_config() -> tuple[types.ModuleType, list[int]]:
    """A module ``acme_lazy_config`` holding one lazy config (and how often it was built)."""
    module = types.ModuleType("acme_lazy_config")
    builds: list[int] = []

    def build() -> type:
        builds.append(1)
        fields = {"lr": hyperparameter(1e-3, learning_rate, "finite, >= 0")}
        return attrs.make_class("Unnamed", fields, frozen=True)  # the stand-in names it

    stand_in = lazy_config("AcmeConfig", build, module=module.__name__, doc="Acme's keywords.")
    module.CONFIG = stand_in  # type: ignore[attr-defined]
    module.__getattr__ = lazy_config_lookup([stand_in])  # type: ignore[method-assign]
    return module, builds


def test_lazy_config_builds_once_on_first_use_and_behaves_as_the_attrs_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, builds = _module_with_lazy_config()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    stand_in = module.CONFIG
    assert stand_in.__doc__ == "Acme's keywords." and builds == []
    config = stand_in(lr=0.5)
    assert builds == [1]
    assert isinstance(config, stand_in) and config.lr == 0.5
    built = type(config)
    assert (built.__name__, built.__qualname__) == ("AcmeConfig", "AcmeConfig")
    assert (built.__module__, built.__doc__) == ("acme_lazy_config", "Acme's keywords.")
    assert [field.name for field in attrs.fields(stand_in)] == ["lr"]
    assert attrs.has(stand_in) and builds == [1]
    with pytest.raises(HyperparameterError, match="lr"):
        stand_in(lr=-1.0)
    assert pickle.loads(pickle.dumps(config)) == config
    from acme_lazy_config import AcmeConfig  # type: ignore[import-not-found]

    assert AcmeConfig is type(config) and builds == [1]
    with pytest.raises(AttributeError):
        module.OtherConfig  # noqa: B018


def _lazy_specs() -> list[str]:
    return [
        name for name in optiplug.optimizers() if isinstance(optiplug.spec(name).config, LazyConfig)
    ]


LAZY = _lazy_specs()


def test_every_bridge_with_a_table_of_entries_builds_its_configs_lazily() -> None:
    providers = {optiplug.spec(name).provider.plugin for name in LAZY}  # type: ignore[union-attr]
    installed = {info.name for info in optiplug.plugins()}
    tables = {"pytorch_optimizer", "heavyball", "torch", "bitsandbytes", "schedulefree", "torchao"}
    expected = (tables | {"galore"}) & installed
    assert expected <= providers, sorted(expected - providers)


@pytest.mark.parametrize("name", LAZY)
def test_a_lazy_bridged_config_validates_defaults_and_pickles(name: str) -> None:
    spec = optiplug.spec(name)
    fields = {field.name: field for field in attrs.fields(spec.config)}
    if any(field.default is attrs.NOTHING for field in fields.values()):
        pytest.skip("a keyword without a default: constructed by the catalogue test")
    try:
        config = spec.config()
    except HyperparameterError:
        pytest.skip("a default that must be replaced (a required value)")
    assert isinstance(config, spec.config)
    copy = pickle.loads(pickle.dumps(config))
    assert type(copy) is type(config)
    assert attrs.asdict(copy, recurse=False).keys() == fields.keys()


@pytest.mark.slow
def test_listing_the_catalogue_builds_no_lazy_config() -> None:
    code = textwrap.dedent(
        """
        import optiplug
        from optiplug.validators import LazyConfig
        names = optiplug.optimizers()
        lazy = [optiplug.spec(n).config for n in names]
        lazy = [c for c in lazy if isinstance(c, LazyConfig)]
        built = [c.__name__ for c in lazy if "__optiplug_built" in c.__dict__]
        print(len(lazy), built)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    count, built = done.stdout.split(" ", 1)
    assert int(count) > 100 and built.strip() == "[]"

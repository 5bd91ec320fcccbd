"""Boolean environment variables: one parser, the same spellings everywhere, typed errors."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import optiplug
from optiplug import cli
from optiplug._choice.chooser import chooser_of
from optiplug._core.env import env_flag
from optiplug.errors import EnvironmentVariableError

VARIABLE = "OPTIPLUG_TEST_FLAG"

TRUE_SPELLINGS = ["1", "true", "TRUE", "True", " yes ", "Yes", "on", "ON", "\t1\n"]
FALSE_SPELLINGS = ["0", " 0 ", "false", "FALSE", "no", "No", "off", " Off "]


@pytest.fixture(autouse=True)
def _fresh_autotune(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with measuring on and nothing measured."""
    monkeypatch.delenv("OPTIPLUG_AUTOTUNE", raising=False)
    chooser_of().clear()
    yield
    chooser_of().clear()


@pytest.mark.parametrize("raw", TRUE_SPELLINGS)
def test_true_spellings_read_as_true_whatever_the_default(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, raw)
    assert env_flag(VARIABLE, default=False) is True
    assert env_flag(VARIABLE, default=True) is True


@pytest.mark.parametrize("raw", FALSE_SPELLINGS)
def test_false_spellings_read_as_false_whatever_the_default(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, raw)
    assert env_flag(VARIABLE, default=False) is False
    assert env_flag(VARIABLE, default=True) is False


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_unset_or_blank_gives_the_default(raw: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if raw is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, raw)
    assert env_flag(VARIABLE, default=False) is False
    assert env_flag(VARIABLE, default=True) is True


@pytest.mark.parametrize("raw", ["maybe", "2", "-1", "y", "enabled", "1 0"])
def test_an_unreadable_value_is_a_typed_error_naming_variable_and_value(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, raw)
    with pytest.raises(EnvironmentVariableError) as caught:
        env_flag(VARIABLE, default=True)
    error = caught.value
    assert isinstance(error, ValueError) and isinstance(error, optiplug.errors.OptiplugError)
    assert (error.variable, error.value) == (VARIABLE, raw)
    assert f"{VARIABLE}={raw!r}" in str(error)
    assert "true" in str(error) and "off" in str(error)  # says what it accepts


def two_implementations() -> optiplug.Registry:
    """``toy`` (torch's SGD) with two implementations: ``first`` by priority, and ``second``."""

    def build(name: str) -> Callable[..., torch.optim.Optimizer]:
        def factory(params: Any, **hparams: Any) -> torch.optim.Optimizer:
            optimizer = torch.optim.SGD(params, foreach=False, **hparams)
            optimizer.chosen = name  # type: ignore[attr-defined]
            return optimizer

        return factory

    impls = (
        optiplug.ImplementationSpec("toy", "first", build("first"), priority=5),
        optiplug.ImplementationSpec("toy", "second", build("second")),
    )
    spec = optiplug.OptimizerSpec(
        "toy", torch.optim.SGD, defaults={"lr": 0.1}, implementations=impls
    )
    module = types.ModuleType("toy_plugin")
    module.optiplug_optimizers = optiplug.hookimpl(lambda: [spec])  # type: ignore[attr-defined]
    registry = optiplug.Registry(autoload=False, strict=False)
    registry.register(module, "toy")
    return registry


def params() -> list[torch.nn.Parameter]:
    made = [torch.nn.Parameter(torch.ones(64)) for _ in range(2)]
    for param in made:
        param.grad = torch.full((64,), 0.5)
    return made


@pytest.mark.parametrize("raw", FALSE_SPELLINGS)
def test_autotune_off_in_any_spelling_chooses_by_priority_without_measuring(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", raw)
    registry = two_implementations()
    optimizer = registry.create("toy", params())
    assert optimizer.chosen == "first"  # type: ignore[attr-defined]
    assert chooser_of(registry).measurements() == {}


def test_autotune_on_in_another_spelling_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", " Yes ")
    registry = two_implementations()
    registry.create("toy", params())
    assert len(chooser_of(registry).measurements()) == 1


def test_an_unreadable_autotune_value_is_refused_when_creating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", "maybe")
    with pytest.raises(EnvironmentVariableError, match="OPTIPLUG_AUTOTUNE='maybe'"):
        two_implementations().create("toy", params())


def test_bench_says_priority_decides_for_any_off_spelling(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", "off")
    argv = ["bench", "sgd", "--params", "4K", "--tensors", "2", "--steps", "1"]
    assert cli.main(argv) == 0
    assert "chosen by priority" in capsys.readouterr().out


@pytest.mark.parametrize(("raw", "strict"), [(" TRUE ", True), ("on", True), ("off", False)])
def test_strict_plugins_reads_every_spelling(
    raw: str, strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPTIPLUG_STRICT_PLUGINS", raw)
    assert optiplug.Registry(autoload=False).strict is strict


def test_an_unreadable_strict_plugins_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTIPLUG_STRICT_PLUGINS", "sometimes")
    with pytest.raises(EnvironmentVariableError, match="OPTIPLUG_STRICT_PLUGINS='sometimes'"):
        optiplug.Registry(autoload=False)
    assert optiplug.Registry(autoload=False, strict=False).strict is False  # given: not read

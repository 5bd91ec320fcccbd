"""Conformance checks any plugin author can run over registered optimizers.

Each check takes an algorithm name (and optionally an implementation, a
registry and hyperparameters) and raises ``AssertionError`` with a message
when the optimizer breaks the contract. Table-drive them with pytest::

    import pytest
    from optiplug import testing

    @pytest.mark.parametrize("name, impl", testing.conformance_cases())
    @pytest.mark.parametrize("check", testing.CHECKS, ids=lambda c: c.__name__)
    def test_conformance(name, impl, check):
        check(name, impl=impl)

The checks use a 4x4 matrix parameter named ``layer.weight`` (so matrix-only
algorithms such as Muon accept it) and ``lr=0.05`` unless told otherwise.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._core.registry import Registry, bound_registry
from ._core.specs import ImplementationSpec
from .errors import HyperparameterError

__all__ = [
    "CHECKS",
    "check_deepcopy_and_pickle",
    "check_hyperparameter_errors",
    "check_no_grad_step_is_noop",
    "check_quadratic_converges",
    "check_state_dict_round_trip",
    "conformance_cases",
]

_DEFAULT_HPARAMS: dict[str, Any] = {"lr": 0.05}


def conformance_cases(registry: Registry | None = None) -> list[tuple[str, str | None]]:
    """Every ``(algorithm, implementation)`` pair to check, ``None`` meaning the default choice.

    Args:
        registry: where to look; the default registry when None.

    Returns:
        Sorted pairs for every registered algorithm and each implementation
        that can run the suite's model here: one unavailable on this machine
        (``ImplementationSpec.availability``, e.g. a GPU kernel on a CPU
        machine) or not for float64 CPU tensors is left out.
    """
    registry = bound_registry(registry)
    probe = [param for _, param in _model()]
    cases: list[tuple[str, str | None]] = []
    for name in registry.optimizers():
        cases.append((name, None))
        cases += [
            (name, impl.name) for impl in registry.implementations(name) if _runs_here(impl, probe)
        ]
    return cases


def _runs_here(impl: ImplementationSpec, probe: list[torch.nn.Parameter]) -> bool:
    """Whether ``impl`` is available and supports the suite's float64 CPU parameters."""
    try:
        return impl.unavailable_reason() is None and impl.can_run(probe)
    except Exception:  # a broken check: the case would only fail on it, not on the optimizer
        return False


def _model(seed: int = 0) -> list[tuple[str, torch.nn.Parameter]]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(4, 4, generator=generator, dtype=torch.float64))
    return [("layer.weight", weight)]


def _target() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 16, dtype=torch.float64).reshape(4, 4)


def _loss(named: list[tuple[str, torch.nn.Parameter]]) -> torch.Tensor:
    return sum(((p - _target()) ** 2).sum() for _, p in named)  # type: ignore[return-value]


def _loss_value(named: list[tuple[str, torch.nn.Parameter]]) -> float:
    with torch.no_grad():
        return float(_loss(named))


def _build(
    name: str,
    named: list[tuple[str, torch.nn.Parameter]],
    impl: str | None,
    registry: Registry | None,
    **hparams: Any,
) -> torch.optim.Optimizer:
    registry = bound_registry(registry)
    spec = registry.spec(name)
    fields = {h.name for h in spec.hyperparameters}
    defaults = {k: v for k, v in _DEFAULT_HPARAMS.items() if k in fields or not fields}
    return registry.create(
        name, list(named), impl=impl, **{**defaults, **spec.example_hparams, **hparams}
    )


def _train(
    optimizer: torch.optim.Optimizer, named: list[tuple[str, torch.nn.Parameter]], steps: int
) -> float:
    for _ in range(steps):
        optimizer.zero_grad()
        loss = _loss(named)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        optimizer.step()
    return _loss_value(named)


def check_quadratic_converges(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> None:
    """200 steps on ``||W - T||^2`` cut the loss at least tenfold."""
    named = _model()
    optimizer = _build(name, named, impl, registry, **(hparams or {}))
    initial = _loss_value(named)
    final = _train(optimizer, named, 200)
    assert math.isfinite(final), f"{name}/{impl}: loss became {final}"
    assert final < 0.1 * initial, (
        f"{name}/{impl}: loss {initial:.4g} -> {final:.4g}, expected < 10%"
    )


def _params_equal(
    a: list[tuple[str, torch.nn.Parameter]], b: list[tuple[str, torch.nn.Parameter]]
) -> bool:
    return all(torch.equal(x.detach(), y.detach()) for (_, x), (_, y) in zip(a, b, strict=True))


def check_state_dict_round_trip(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> None:
    """A state dict loaded into a fresh optimizer continues exactly like the original."""
    named, twin = _model(), _model()
    original = _build(name, named, impl, registry, **(hparams or {}))
    _train(original, named, 3)
    with torch.no_grad():
        for (_, p), (_, q) in zip(named, twin, strict=True):
            q.copy_(p)
    restored = _build(name, twin, impl, registry, **(hparams or {}))
    restored.load_state_dict(copy.deepcopy(original.state_dict()))
    _train(original, named, 3)
    _train(restored, twin, 3)
    assert _params_equal(named, twin), (
        f"{name}/{impl}: restored optimizer diverged from the original"
    )


def check_hyperparameter_errors(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> None:
    """Bad hyperparameters raise HyperparameterError naming the field; a typo gets a suggestion."""
    registry = bound_registry(registry)
    fields = {h.name for h in registry.spec(name).hyperparameters}
    bad: list[tuple[str, Any]] = [("lr", -1.0), ("lr", float("nan")), ("lr", float("inf"))]
    bad += [("betas", (1.0, 0.9)), ("eps", 0.0), ("weight_decay", -0.1), ("momentum", 1.5)]
    for field, value in bad:
        if field in fields:
            _expect_error(name, impl, registry, field, {field: value})
    if "lr" in fields:
        error = _expect_error(name, impl, registry, "lrr", {"lrr": 0.1})
        assert error.suggestion == "lr", f"{name}: no did-you-mean for 'lrr' ({error})"


def _expect_error(
    name: str, impl: str | None, registry: Registry, field: str, hparams: dict[str, Any]
) -> HyperparameterError:
    try:
        registry.create(
            name, list(_model()), impl=impl, **{**registry.spec(name).example_hparams, **hparams}
        )
    except HyperparameterError as error:
        assert error.field == field, f"{name}: error names {error.field!r}, expected {field!r}"
        assert field in str(error) and name in str(error), f"{name}: unclear message {error}"
        return error
    raise AssertionError(f"{name}/{impl}: {hparams} was accepted")


def check_no_grad_step_is_noop(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> None:
    """``step()`` when no parameter has a gradient changes no parameter and keeps no state."""
    named = _model()
    before = [p.detach().clone() for _, p in named]
    optimizer = _build(name, named, impl, registry, **(hparams or {}))
    optimizer.step()
    for (_, param), snapshot in zip(named, before, strict=True):
        assert torch.equal(param.detach(), snapshot), (
            f"{name}/{impl}: step without grads moved a parameter"
        )
    assert not any(optimizer.state.get(p) for _, p in named), f"{name}/{impl}: state without grads"


def check_deepcopy_and_pickle(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
) -> None:
    """Deep copies and pickled copies hold equal state and step like the original."""
    named = _model()
    optimizer = _build(name, named, impl, registry, **(hparams or {}))
    _train(optimizer, named, 2)
    for duplicate in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        _assert_same_state(name, optimizer.state_dict(), duplicate.state_dict())
        params = [p for group in duplicate.param_groups for p in group["params"]]
        assert all(torch.equal(p, q) for p, (_, q) in zip(params, named, strict=True))


def _assert_same_state(name: str, left: dict[str, Any], right: dict[str, Any]) -> None:
    assert left["state"].keys() == right["state"].keys(), f"{name}: copied state has other keys"
    for index, slots in left["state"].items():
        for slot, value in slots.items():
            other = right["state"][index][slot]
            same = torch.equal(value, other) if torch.is_tensor(value) else value == other
            assert same, f"{name}: copied slot {slot!r} of parameter {index} differs"


CHECKS: tuple[Callable[..., None], ...] = (
    check_quadratic_converges,
    check_state_dict_round_trip,
    check_hyperparameter_errors,
    check_no_grad_step_is_noop,
    check_deepcopy_and_pickle,
)
"""Every conformance check, in the order they are usually run."""

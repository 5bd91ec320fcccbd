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

The checks use a matrix parameter named ``layer.weight`` (so matrix-only
algorithms such as Muon accept it), 4x4 float64 unless the spec declares
another (:attr:`~optiplug.OptimizerSpec.example_shape`,
:attr:`~optiplug.OptimizerSpec.example_dtype`: a blockwise-quantized state
needs thousands of float32 elements to take its real path) or the check is
given ``shape=``/``dtype=``, and ``lr=0.05`` unless told otherwise. An
optimizer with a train/eval lifecycle (schedule-free) is switched with
``train()`` before its steps and ``eval()`` before the loss is measured and
before its state is saved or copied, as such libraries document.
State values may be tensors (tensor subclasses compare by their inner
tensors), numbers, or lists, tuples and dicts of those.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._core.lifecycle import set_training, step_needs, training_step
from ._core.registry import Registry, bound_registry
from ._core.specs import ImplementationSpec
from ._state.values import copied_tensor, inner_tensors
from .errors import HyperparameterError

__all__ = [
    "CHECKS",
    "KEEPS_NORM",
    "check_deepcopy_and_pickle",
    "check_hyperparameter_errors",
    "check_no_grad_step_is_noop",
    "check_quadratic_converges",
    "check_state_dict_round_trip",
    "conformance_cases",
    "example_of",
    "limitation",
    "same_state_value",
]

_DEFAULT_HPARAMS: dict[str, Any] = {"lr": 0.05}

KEEPS_NORM = "keeps-norm"
"""The capability tag of an algorithm whose update cannot change (or cannot shrink) a
parameter's norm: :func:`check_quadratic_converges` gives it a target of the starting norm."""


Shape = tuple[int, ...]


def conformance_cases(
    registry: Registry | None = None, *, bridged: bool = True
) -> list[tuple[str, str | None]]:
    """Every ``(algorithm, implementation)`` pair to check, ``None`` meaning the default choice.

    Args:
        registry: where to look; the default registry when None.
        bridged: include algorithms bridged from other libraries (those
            with an :attr:`~optiplug.OptimizerSpec.origin`).

    Returns:
        Sorted pairs for every registered algorithm, under the name that
        reaches it (:meth:`~optiplug.Registry.name_of`), and each implementation that can run the suite's model here
        (the spec's example shape and dtype): one unavailable on this
        machine (``ImplementationSpec.availability``, e.g. a GPU kernel on a
        CPU machine) or not for those CPU tensors is left out.
    """
    registry = bound_registry(registry)
    cases: list[tuple[str, str | None]] = []
    for spec in registry.optimizer_specs():
        if spec.origin is not None and not bridged:
            continue
        name = registry.name_of(spec)
        cases.append((name, None))
        shape, dtype = example_of(registry, name)
        probe = [param for _, param in _model(shape=shape, dtype=dtype)]
        records = registry.implementations(name)
        cases += [(name, impl.name) for impl in records if _runs_here(impl, probe)]
    return sorted(cases, key=lambda case: (case[0], case[1] or ""))


def limitation(name: str, registry: Registry | None = None) -> str:
    """Why algorithm ``name`` cannot pass the checks everywhere ("" when it can).

    A bridged algorithm declares it in its :class:`~optiplug.Origin` (needs
    a CUDA device, a closure ...); a test skips such a case with the reason.

    Args:
        name: a plain or qualified name.
        registry: where to look; the default registry when None.

    Returns:
        The reason, or "".
    """
    origin = bound_registry(registry).spec(name).origin
    return origin.limitation if origin is not None else ""


def example_of(
    registry: Registry | None, name: str, shape: Shape | None = None, dtype: Any = None
) -> tuple[Shape, torch.dtype]:
    """The parameter shape and dtype the checks use for ``name``.

    Args:
        registry: where the spec is; the default registry when None.
        name: the algorithm.
        shape: an override, else the spec's ``example_shape``, else 4x4.
        dtype: an override (``torch.float32`` or ``"float32"``), else the
            spec's ``example_dtype``, else float64.

    Returns:
        ``(shape, dtype)``.

    Raises:
        HyperparameterError: a dtype name torch does not have.
    """
    spec = bound_registry(registry).spec(name)
    chosen = dtype if dtype is not None else spec.example_dtype or "float64"
    if isinstance(chosen, str):
        resolved = getattr(torch, chosen.removeprefix("torch."), None)
        if not isinstance(resolved, torch.dtype):
            raise HyperparameterError("example_dtype", chosen, "must name a torch dtype")
        chosen = resolved
    return tuple(shape or spec.example_shape or _SHAPE), chosen


_SHAPE = (4, 4)


def _runs_here(impl: ImplementationSpec, probe: list[torch.nn.Parameter]) -> bool:
    """Whether ``impl`` is available and supports the suite's CPU parameters."""
    try:
        return impl.unavailable_reason() is None and impl.can_run(probe)
    except Exception:  # a broken check: the case would only fail on it, not on the optimizer
        return False


def _model(
    seed: int = 0, *, shape: Shape = _SHAPE, dtype: torch.dtype = torch.float64
) -> list[tuple[str, torch.nn.Parameter]]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)
    return [("layer.weight", torch.nn.Parameter(weight))]


def _target(like: torch.Tensor, norm: float | None = None) -> torch.Tensor:
    """The quadratic's target: evenly spaced values in [-1, 1], or scaled to ``norm``."""
    values = torch.linspace(-1.0, 1.0, like.numel(), dtype=torch.float64)
    if norm is not None:
        values = values * (norm / float(values.norm()))
    return values.reshape(like.shape).to(like.dtype)


def _loss(
    named: list[tuple[str, torch.nn.Parameter]], norms: Mapping[str, float] | None = None
) -> torch.Tensor:
    """``sum ||p - target||^2``; ``norms`` gives a parameter's target norm (else the default)."""
    return sum(  # type: ignore[return-value]
        ((p - _target(p, (norms or {}).get(n))) ** 2).sum() for n, p in named
    )


def _loss_value(
    optimizer: Any,
    named: list[tuple[str, torch.nn.Parameter]],
    norms: Mapping[str, float] | None = None,
) -> float:
    """The loss at the point the optimizer evaluates (eval mode, for schedule-free)."""
    set_training(optimizer, False)
    with torch.no_grad():
        return float(_loss(named, norms))


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
    optimizer: torch.optim.Optimizer,
    named: list[tuple[str, torch.nn.Parameter]],
    steps: int,
    norms: Mapping[str, float] | None = None,
) -> float:
    """``steps`` steps in train mode; the loss after them, measured in eval mode.

    Each step is :func:`~optiplug.base.training_step`'s: a closure or a kept
    graph where the spec asks for one.
    """
    set_training(optimizer, True)
    for _ in range(steps):
        training_step(optimizer, lambda: _loss(named, norms))
    return _loss_value(optimizer, named, norms)


def _named(
    name: str, registry: Registry | None, shape: Shape | None, dtype: Any, seed: int = 0
) -> list[tuple[str, torch.nn.Parameter]]:
    shape, resolved = example_of(registry, name, shape, dtype)
    return _model(seed, shape=shape, dtype=resolved)


def check_quadratic_converges(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
    shape: Shape | None = None,
    dtype: Any = None,
) -> None:
    """200 steps on ``||W - T||^2`` cut the loss at least tenfold (measured in eval mode).

    For an algorithm tagged ``"keeps-norm"`` (its update keeps each
    parameter's norm, as HyperBall does, or cannot shrink it, as OrthoGrad's
    projection cannot), ``T`` is scaled to the parameter's starting norm, so
    the target is one the algorithm can reach.
    """
    named = _named(name, registry, shape, dtype)
    optimizer = _build(name, named, impl, registry, **(hparams or {}))
    norms = None
    if KEEPS_NORM in bound_registry(registry).spec(name).capabilities:
        norms = {n: float(p.detach().double().norm()) for n, p in named}
    initial = _loss_value(optimizer, named, norms)
    final = _train(optimizer, named, 200, norms)
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
    shape: Shape | None = None,
    dtype: Any = None,
) -> None:
    """A state dict loaded into a fresh optimizer continues exactly like the original.

    The state dict is taken in eval mode (where checkpoints are taken), and
    both optimizers return to train mode before continuing.
    """
    named, twin = _named(name, registry, shape, dtype), _named(name, registry, shape, dtype)
    original = _build(name, named, impl, registry, **(hparams or {}))
    _train(original, named, 3)
    with torch.no_grad():
        for (_, p), (_, q) in zip(named, twin, strict=True):
            q.copy_(p)
    restored = _build(name, twin, impl, registry, **(hparams or {}))
    restored.load_state_dict(_copied(original.state_dict()))
    _train(original, named, 3)
    _train(restored, twin, 3)
    assert _params_equal(named, twin), (
        f"{name}/{impl}: restored optimizer diverged from the original"
    )


def _copied(value: Any) -> Any:
    """A deep copy; tensor subclasses rebuilt from copies of their inner tensors."""
    if isinstance(value, torch.Tensor):
        return copied_tensor(value)
    if isinstance(value, Mapping):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_copied(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return copy.deepcopy(value)


def check_hyperparameter_errors(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
    shape: Shape | None = None,
    dtype: Any = None,
) -> None:
    """Bad hyperparameters raise HyperparameterError naming the field; a typo gets a suggestion."""
    registry = bound_registry(registry)
    named = _named(name, registry, shape, dtype)
    defaults = {h.name: h.default for h in registry.spec(name).hyperparameters}
    bad: list[tuple[str, Any]] = [("lr", -1.0), ("lr", float("nan")), ("lr", float("inf"))]
    bad += [("betas", (1.0, 0.9)), ("eps", 0.0), ("weight_decay", -0.1), ("momentum", 1.5)]
    for field, value in bad:
        # a value the algorithm itself defaults to (an eps of 0) is not a bad one for it
        if field in defaults and not _same_value(defaults[field], value):
            _expect_error(name, impl, registry, named, field, {field: value})
    if "lr" in defaults:
        error = _expect_error(name, impl, registry, named, "lrr", {"lrr": 0.1})
        assert error.suggestion == "lr", f"{name}: no did-you-mean for 'lrr' ({error})"


def _same_value(default: Any, value: Any) -> bool:
    """Whether ``value`` is ``default`` (numbers compared by value, NaN never equal)."""
    numbers = (int, float)
    if isinstance(default, numbers) and isinstance(value, numbers):
        return not isinstance(default, bool) and float(default) == float(value)
    try:
        return bool(default == value) and type(default) is type(value)
    except Exception:  # defaults that cannot be compared (tensors) are not the value
        return False


def _expect_error(
    name: str,
    impl: str | None,
    registry: Registry,
    named: list[tuple[str, torch.nn.Parameter]],
    field: str,
    hparams: dict[str, Any],
) -> HyperparameterError:
    try:
        registry.create(
            name, list(named), impl=impl, **{**registry.spec(name).example_hparams, **hparams}
        )
    except HyperparameterError as error:
        assert error.field == field, f"{name}: error names {error.field!r}, expected {field!r}"
        plain = registry.spec(name).name  # a qualified name's message names the algorithm
        assert field in str(error) and plain in str(error), f"{name}: unclear message {error}"
        return error
    raise AssertionError(f"{name}/{impl}: {hparams} was accepted")


def check_no_grad_step_is_noop(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
    shape: Shape | None = None,
    dtype: Any = None,
) -> None:
    """``step()`` when no parameter has a gradient changes no parameter and keeps no state.

    An optimizer whose spec declares ``step_closure`` is given a closure that
    computes the loss and no gradient; it only learns that no gradient came
    once the closure has run, so it may have set up its state before: for it
    the check asks only that no parameter moved.
    """
    named = _named(name, registry, shape, dtype)
    before = [p.detach().clone() for _, p in named]
    optimizer = _build(name, named, impl, registry, **(hparams or {}))
    set_training(optimizer, True)
    closure_needed = step_needs(optimizer)[0]
    if closure_needed:  # a closure that computes the loss and no gradient
        no_gradient: Callable[[], Any] = lambda: _loss(named).detach()  # noqa: E731
        optimizer.step(no_gradient)
    else:
        optimizer.step()
    for (_, param), snapshot in zip(named, before, strict=True):
        assert torch.equal(param.detach(), snapshot), (
            f"{name}/{impl}: step without grads moved a parameter"
        )
    stateless = closure_needed or not any(optimizer.state.get(p) for _, p in named)
    assert stateless, f"{name}/{impl}: state without grads"


def check_deepcopy_and_pickle(
    name: str,
    *,
    impl: str | None = None,
    registry: Registry | None = None,
    hparams: Mapping[str, Any] | None = None,
    shape: Shape | None = None,
    dtype: Any = None,
) -> None:
    """Deep copies and pickled copies hold equal state and step like the original.

    State values may be tensors, numbers, or lists, tuples and dicts of
    those; tensor subclasses compare by their inner tensors.
    """
    named = _named(name, registry, shape, dtype)
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
            same = _same(value, right["state"][index].get(slot, _MISSING))
            assert same, f"{name}: copied slot {slot!r} of parameter {index} differs"


_MISSING = object()


def same_state_value(left: Any, right: Any) -> bool:
    """Whether two state values are equal: tensors (subclasses by their inner tensors) exactly.

    Args:
        left: a tensor, number, None, or a list, tuple, set or dict of those.
        right: the other.

    Returns:
        True when they have the same structure and equal values (NaN equals NaN).
    """
    return _same(left, right)


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        return _same_tensor(left, right)
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return (
            type(left) is type(right)
            and len(left) == len(right)
            and all(_same(a, b) for a, b in zip(left, right, strict=True))
        )
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        return math.isnan(right)
    return bool(type(left) is type(right) and left == right)


def _same_tensor(left: Any, right: Any) -> bool:
    if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
        return False
    if type(left) is not type(right) or left.shape != right.shape or left.dtype != right.dtype:
        return False
    parts = list(zip(inner_tensors(left), inner_tensors(right), strict=False))
    return len(parts) == len(inner_tensors(right)) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in parts
    )


CHECKS: tuple[Callable[..., None], ...] = (
    check_quadratic_converges,
    check_state_dict_round_trip,
    check_hyperparameter_errors,
    check_no_grad_step_is_noop,
    check_deepcopy_and_pickle,
)
"""Every conformance check, in the order they are usually run."""

"""The plugin toolkit (optiplug.base) as a third party uses it, and registries that stay explicit."""

from __future__ import annotations

import copy
import pickle
import types
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import pytest
import torch

import optiplug
from optiplug.base import (
    Kernel,
    KernelTableOptimizer,
    NamedParamGroup,
    Supports,
    caller_stacklevel,
    choose_implementation,
    named_param_groups,
    torch_backed_optimizer,
    warn_at_caller,
)
from optiplug.errors import HyperparameterError, StateDictError, UnknownOptimizerError
from optiplug.validators import hyperparameter, learning_rate, unit_interval


# --------------------------------------------------------------- a third-party optimizer
@attrs.frozen
class HeavyBallConfig:
    lr: float = hyperparameter(0.1, learning_rate, "finite, >= 0")
    momentum: float = hyperparameter(0.9, unit_interval, "in [0, 1)")


def heavy_ball_loop(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    velocities: list[torch.Tensor],
    *,
    lr: float,
    momentum: float,
) -> None:
    for param, grad, velocity in zip(params, grads, velocities, strict=True):
        velocity.mul_(momentum).add_(grad)
        param.add_(velocity, alpha=-lr)


def heavy_ball_foreach(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    velocities: list[torch.Tensor],
    *,
    lr: float,
    momentum: float,
) -> None:
    torch._foreach_mul_(velocities, momentum)
    torch._foreach_add_(velocities, grads)
    torch._foreach_add_(params, velocities, alpha=-lr)


def float64_only(params: Sequence[torch.Tensor]) -> bool:
    return all(p.dtype == torch.float64 for p in params)


class HeavyBall(KernelTableOptimizer):
    """v = momentum * v + g; p -= lr * v (two kernels, one state slot)."""

    algorithm = "heavy_ball"
    config_class = HeavyBallConfig
    implementations: ClassVar[Mapping[str, Kernel]] = {
        "loop": heavy_ball_loop,
        "foreach": heavy_ball_foreach,
    }
    supports: ClassVar[Mapping[str, Supports]] = {"foreach": float64_only}
    priorities: ClassVar[Mapping[str, int]] = {"foreach": 1}
    zero_state = ("velocity",)


def heavy_ball_formula(
    start: torch.Tensor, grads: list[torch.Tensor], lr: float, momentum: float
) -> torch.Tensor:
    """The textbook rule, written out independently of the kernels."""
    param, velocity = start.clone(), torch.zeros_like(start)
    for grad in grads:
        velocity = momentum * velocity + grad
        param = param - lr * velocity
    return param


def grads_for(shape: tuple[int, ...], steps: int, dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=generator, dtype=dtype) for _ in range(steps)]


def run(optimizer: torch.optim.Optimizer, param: torch.Tensor, grads: list[torch.Tensor]) -> None:
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()


@pytest.mark.parametrize("impl", ["loop", "foreach"])
def test_kernel_table_subclass_steps_by_the_formula(impl: str) -> None:
    start = torch.randn(5, 3, dtype=torch.float64)
    param = torch.nn.Parameter(start.clone())
    optimizer = HeavyBall([param], lr=0.05, momentum=0.8, impl=impl)
    grads = grads_for((5, 3), 6, torch.float64)
    run(optimizer, param, grads)
    assert optimizer.impl == impl
    assert set(optimizer.state[param]) == {"velocity"}
    expected = heavy_ball_formula(start, grads, 0.05, 0.8)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-12, atol=1e-12)


def test_kernel_table_validates_top_level_and_group_hyperparameters() -> None:
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(HyperparameterError) as caught:
        HeavyBall([param], lr=-1.0)
    assert (caught.value.field, caught.value.value, caught.value.algorithm) == (
        "lr",
        -1.0,
        "heavy_ball",
    )
    with pytest.raises(HyperparameterError) as caught:
        HeavyBall([{"params": [param], "momentum": 1.5}])
    assert caught.value.field == "momentum"
    with pytest.raises(HyperparameterError, match="momentum"):
        HeavyBall([param], momentun=0.5)
    defaults = HeavyBall([param], impl="loop").param_groups[0]
    assert (defaults["lr"], defaults["momentum"]) == (0.1, 0.9)


def test_kernel_table_impl_errors_name_impl() -> None:
    float32 = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(HyperparameterError, match="foreach, loop") as caught:
        HeavyBall(float32, impl="fused")
    assert (caught.value.field, caught.value.value) == ("impl", "fused")
    with pytest.raises(HyperparameterError, match="does not support") as caught:
        HeavyBall(float32, impl="foreach")  # its supports table says float64 only
    assert caught.value.field == "impl"


def test_kernel_table_chooses_only_runnable_implementations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", "0")  # priority order: foreach first where it runs
    assert HeavyBall([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]).impl == "foreach"
    assert HeavyBall([torch.nn.Parameter(torch.zeros(3))]).impl == "loop"


def test_kernel_table_state_moves_between_implementations_and_pickles() -> None:
    start = torch.randn(4, dtype=torch.float64)
    param = torch.nn.Parameter(start.clone())
    grads = grads_for((4,), 6, torch.float64)
    first = HeavyBall([param], lr=0.05, impl="foreach")
    run(first, param, grads[:3])
    moved = HeavyBall([param], lr=0.5, impl="loop")
    moved.load_state_dict(first.state_dict())
    assert moved.impl == "loop" and moved.param_groups[0]["lr"] == 0.05
    assert moved.state[param]["velocity"].data_ptr() != first.state[param]["velocity"].data_ptr()
    run(moved, param, grads[3:])
    expected = heavy_ball_formula(start, grads, 0.05, 0.9)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-12, atol=1e-12)
    for clone in (copy.deepcopy(moved), pickle.loads(pickle.dumps(moved))):
        assert clone.impl == "loop"
        torch.testing.assert_close(clone.state_dict()["state"], moved.state_dict()["state"])
    with pytest.raises(StateDictError):
        moved.load_state_dict({"state": {}, "param_groups": []})
    assert moved.impl == "loop" and moved.param_groups[0]["lr"] == 0.05


def test_kernel_table_closure_and_no_grad_step() -> None:
    param = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    optimizer = HeavyBall([param], impl="loop")
    optimizer.step()  # no gradients: nothing happens, no state
    assert not optimizer.state and torch.equal(param.detach(), torch.ones(3, dtype=torch.float64))

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (param**2).sum()
        loss.backward()
        return loss

    assert optimizer.step(closure).item() == 3.0
    torch.testing.assert_close(param.detach(), torch.full((3,), 0.8, dtype=torch.float64))


def test_kernel_table_rejects_tables_naming_unknown_implementations() -> None:
    with pytest.raises(TypeError, match="fused"):

        class Broken(KernelTableOptimizer):
            algorithm = "broken"
            config_class = HeavyBallConfig
            implementations: ClassVar[Mapping[str, Kernel]] = {"loop": heavy_ball_loop}
            supports: ClassVar[Mapping[str, Supports]] = {"fused": float64_only}


# --------------------------------------------------------------- choose_implementation
def recorder(name: str, made: list[str]) -> Any:
    def factory(params: Any, **hparams: Any) -> torch.optim.Optimizer:
        made.append(name)
        return torch.optim.SGD(params, lr=0.1)

    return factory


def test_choose_implementation_respects_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    never = optiplug.ImplementationSpec(
        "toy", "never", recorder("never", made), supports=lambda params: False, priority=9
    )
    always = optiplug.ImplementationSpec("toy", "always", recorder("always", made))
    slow = optiplug.ImplementationSpec("toy", "other", recorder("other", made), priority=1)
    params = [torch.nn.Parameter(torch.zeros(4))]
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", "0")
    assert choose_implementation("toy", [never, always, slow], params, {}).name == "other"
    assert choose_implementation("toy", [never, always], params, {}).name == "always"
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE", "1")
    chosen = choose_implementation("toy-measured", [never, always, slow], params, {})
    assert chosen.name in {"always", "other"}
    assert "never" not in made and {"always", "other"} <= set(made)  # both runnable were timed
    with pytest.raises(HyperparameterError, match="never") as caught:
        choose_implementation("toy", [never], params, {})
    assert caught.value.field == "impl"


# --------------------------------------------------------------- params and warnings
def test_named_param_groups_parses_every_params_form() -> None:
    a, b = torch.zeros(2), torch.zeros(3)
    assert named_param_groups([]) == []
    (flat,) = named_param_groups([a, b])
    assert [n for n, _ in flat.params] == [None, None] and not flat.named
    (pairs,) = named_param_groups([("w", a), ("b", b)])
    assert [n for n, _ in pairs.params] == ["w", "b"] and pairs.named
    first, second = named_param_groups(
        [{"params": [a], "param_names": ["w"], "lr": 0.5}, {"params": b}]
    )
    assert first == NamedParamGroup((("w", a),), {"lr": 0.5})
    assert second.tensors == [b] and second.options == {}
    with pytest.raises(HyperparameterError, match="param_names"):
        named_param_groups([{"params": [a, b], "param_names": ["w"]}])


def test_warn_at_caller_points_at_the_user_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_at_caller("careful", RuntimeWarning)  # this line
        level = caller_stacklevel()
    assert caught[0].filename == __file__ and caught[0].category is RuntimeWarning
    assert level == 1  # this test module is outside optiplug and torch


def test_torch_backed_optimizer_builds_a_picklable_class() -> None:
    assert Momentum.__module__ == __name__ and Momentum.__name__ == "Momentum"
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = Momentum([param], impl="foreach")
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.impl == "foreach"
    assert optimizer.param_groups[0]["momentum"] == 0.9
    assert pickle.loads(pickle.dumps(optimizer)).impl == "foreach"


Momentum = torch_backed_optimizer("momentum", torch.optim.SGD, HeavyBallConfig, name="Momentum")


# --------------------------------------------------------------- explicit registries
ONLY_R_SOURCE = """
import torch
import optiplug

@optiplug.hookimpl
def optiplug_optimizers():
    return [optiplug.OptimizerSpec(name="only_r", factory=torch.optim.SGD, defaults={"lr": 0.5})]
"""


def only_r_module() -> types.ModuleType:
    module = types.ModuleType("only_r_plugin")
    exec(compile(ONLY_R_SOURCE, "only_r_plugin", "exec"), module.__dict__)
    return module


def test_multi_builds_its_routes_from_the_registry_that_creates_it() -> None:
    import optiplug_multi.plugin

    registry = optiplug.Registry(autoload=False)
    assert registry.register(only_r_module(), "only_r").status == "active"
    assert registry.register(optiplug_multi.plugin, "multi").status == "active"
    assert "uses-registry" in registry.spec("multi").capabilities
    assert "only_r" not in optiplug.optimizers()  # the default registry does not have it
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = registry.create(
        "multi", [("w", param)], routes=[{"algorithm": "only_r", "match": "*"}]
    )
    (sub,) = optimizer.optimizers.values()
    assert type(sub) is torch.optim.SGD and sub.param_groups[0]["lr"] == 0.5
    param.grad = torch.ones(3)
    optimizer.step()
    torch.testing.assert_close(param.detach(), torch.full((3,), 0.5))
    # A factory from that registry carries it too; the default registry still lacks only_r.
    assert registry.factory("multi", routes=[{"algorithm": "only_r"}])([param]) is not None
    with pytest.raises(UnknownOptimizerError):
        optiplug.create("multi", [param], routes=[{"algorithm": "only_r", "match": "*"}])

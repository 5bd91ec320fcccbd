"""Optimizers whose step needs more than ``backward(); step()``: a closure, a kept graph.

A spec declares ``step_closure`` (torch's L-BFGS) or ``create_graph`` (a
Hessian estimate from the gradient's graph); ``optiplug.base.training_step``,
the conformance suite, ``tune`` and ``Graph`` honour the declaration. The
tag ``keeps-norm`` gives a norm-keeping method a target it can reach. Each
optimizer here is checked against torch run by hand or an exact formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import optiplug
from optiplug import testing
from optiplug._choice.timing import timed_step
from optiplug.base import training_step
from optiplug.errors import GraphError


class NewtonDiagonal(torch.optim.Optimizer):
    """``p -= lr * g / (H 1)``: the Hessian-vector product with ones, from the gradient's graph.

    On a separable quadratic ``H 1`` is the Hessian's diagonal, so ``lr=1``
    lands on the minimum in one step. Without ``create_graph`` the gradient
    has no graph and ``torch.autograd.grad`` raises.
    """

    def __init__(self, params: Any, lr: float = 1.0) -> None:
        super().__init__(params, {"lr": lr})

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return None
        curvatures = torch.autograd.grad(
            [p.grad for p in params], params, [torch.ones_like(p) for p in params]
        )
        with torch.no_grad():
            for group in self.param_groups:
                for p, curvature in zip(params, curvatures, strict=True):
                    p.sub_(group["lr"] * p.grad / curvature)
                    p.grad = None  # drop the graph the gradient holds
        return None


class SphereSGD(torch.optim.Optimizer):
    """SGD projected back onto each parameter's starting norm (it can never change the norm)."""

    def __init__(self, params: Any, lr: float = 0.05) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                radius = self.state[p].setdefault("radius", p.norm().clone())
                p.sub_(group["lr"] * p.grad)
                p.mul_(radius / p.norm())
        return None


SPECS = (
    optiplug.OptimizerSpec(name="lbfgs", factory=torch.optim.LBFGS, step_closure=True),
    optiplug.OptimizerSpec(name="newton_diagonal", factory=NewtonDiagonal, create_graph=True),
    optiplug.OptimizerSpec(
        name="sphere_sgd", factory=SphereSGD, capabilities=(testing.KEEPS_NORM,)
    ),
    optiplug.OptimizerSpec(name="sphere_sgd_untagged", factory=SphereSGD),
    # what the built-in selection rules propose, which tune consults for its request
    optiplug.OptimizerSpec(name="adam", factory=torch.optim.Adam),
)


class _Plugin:
    @optiplug.hookimpl
    def optiplug_optimizers(self) -> list[optiplug.OptimizerSpec]:
        return list(SPECS)


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    found = optiplug.Registry(autoload=False)
    info = found.register(_Plugin(), "step-needs", distribution="tests", version="0")
    assert info.status == "active", info.error
    return found


def _quadratic(param: torch.Tensor) -> torch.Tensor:
    weights = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=param.dtype)  # exact in binary
    return (weights * (param - 0.5) ** 2).sum()


def _param() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0, 0.25], dtype=torch.float64))


# ------------------------------------------------ training_step
def test_training_step_gives_lbfgs_the_closure_torch_documents(registry: optiplug.Registry) -> None:
    ours, theirs = _param(), _param()
    optimizer = registry.create("lbfgs", [ours], lr=0.5)
    reference = torch.optim.LBFGS([theirs], lr=0.5)

    def closure() -> torch.Tensor:  # torch's documented L-BFGS closure
        reference.zero_grad()
        loss = _quadratic(theirs)
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    for _ in range(3):
        loss = training_step(optimizer, lambda: _quadratic(ours))
        expected = reference.step(closure)
        assert torch.equal(loss.detach(), expected.detach())
    assert torch.equal(ours.detach(), theirs.detach())
    assert not torch.equal(ours.detach(), _param().detach())


def test_training_step_keeps_the_graph_where_the_spec_asks(registry: optiplug.Registry) -> None:
    param = _param()
    optimizer = registry.create("newton_diagonal", [param], lr=1.0)
    training_step(optimizer, lambda: _quadratic(param))
    # one Newton step on a separable quadratic lands on its minimum, 0.5 everywhere
    assert torch.equal(param.detach(), torch.full((4,), 0.5, dtype=torch.float64))


def test_without_the_kept_graph_that_optimizer_cannot_step(registry: optiplug.Registry) -> None:
    """The declaration matters: a plain backward leaves the gradient without a graph."""
    param = _param()
    optimizer = registry.create("newton_diagonal", [param], lr=1.0)
    _quadratic(param).backward()  # type: ignore[no-untyped-call]
    with pytest.raises(RuntimeError, match="does not require grad"):
        optimizer.step()


def test_an_optimizer_optiplug_did_not_build_is_stepped_plainly() -> None:
    ours, theirs = _param(), _param()
    optimizer, reference = torch.optim.SGD([ours], lr=0.1), torch.optim.SGD([theirs], lr=0.1)
    loss = training_step(optimizer, lambda: _quadratic(ours))
    reference.zero_grad()
    _quadratic(theirs).backward()  # type: ignore[no-untyped-call]
    reference.step()
    assert torch.equal(ours.detach(), theirs.detach()) and loss.requires_grad


# ------------------------------------------------ the conformance suite
@pytest.mark.parametrize("name", ["lbfgs", "newton_diagonal", "sphere_sgd"])
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_the_suite_steps_them_as_their_specs_ask(
    registry: optiplug.Registry, name: str, check: Callable[..., None]
) -> None:
    check(name, registry=registry)


def test_the_norm_keeping_tag_is_what_gives_a_reachable_target(registry: optiplug.Registry) -> None:
    with pytest.raises(AssertionError, match="expected < 10%"):
        testing.check_quadratic_converges("sphere_sgd_untagged", registry=registry)


# ------------------------------------------------ Graph, tune and the implementation timing
def test_graph_refuses_a_closure_optimizer_and_keeps_its_own(registry: optiplug.Registry) -> None:
    graph = optiplug.Graph(torch.nn.Linear(4, 1))
    kept = graph.set_optimizer(registry.factory("newton_diagonal"))
    with pytest.raises(GraphError, match="training_step"):
        graph.set_optimizer(registry.factory("lbfgs"))
    assert graph.optimizer is kept


def test_graph_backward_keeps_the_graph_for_a_second_order_optimizer(
    registry: optiplug.Registry,
) -> None:
    model = torch.nn.Linear(4, 1, bias=False).double()
    graph = optiplug.Graph(model)
    graph.set_optimizer(registry.factory("newton_diagonal", lr=1.0))
    target = torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    graph.backward(((model.weight - target) ** 2).sum())
    assert graph.step()
    assert torch.equal(model.weight.detach(), target)


def test_tune_trains_closure_and_second_order_candidates(registry: optiplug.Registry) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    inputs = torch.randn(64, 4, dtype=torch.float64)
    batches = [(inputs[i : i + 8], inputs[i : i + 8].sum(1, keepdim=True)) for i in range(0, 64, 8)]

    def loss_fn(module: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return ((module(x) - y) ** 2).mean()

    selection = optiplug.AutoOptimizer.tune(
        model,
        loss_fn,
        batches,
        candidates=["lbfgs", "newton_diagonal"],
        budget_steps=60,
        held_out=2,
        registry=registry,
    )
    report = selection.tuning
    assert report is not None
    assert {trial.algorithm for trial in report.trials} == {"lbfgs", "newton_diagonal"}
    for trial in report.trials:  # each trained to a finite held-out loss
        assert math.isfinite(trial.held_out_loss) and trial.steps > 0, trial


def test_the_implementation_timing_gives_a_required_closure(registry: optiplug.Registry) -> None:
    param = _param()
    param.grad = torch.ones_like(param)
    optimizer = torch.optim.LBFGS([param], lr=0.1, max_iter=1)
    timed_step(optimizer)()  # L-BFGS requires one; the gradients stay those the sample holds
    assert not torch.equal(param.detach(), _param().detach())
    sgd = torch.optim.SGD([param], lr=0.1)
    assert timed_step(sgd) == sgd.step

"""The conformance suite, table-driven over every installed algorithm and implementation."""

from __future__ import annotations

import pytest

from optiplug import testing


@pytest.mark.parametrize("name, impl", testing.conformance_cases())
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_conformance(name: str, impl: str | None, check) -> None:
    check(name, impl=impl)


def test_cases_cover_every_installed_algorithm_and_implementation() -> None:
    import optiplug

    cases = testing.conformance_cases()
    assert optiplug.optimizers(), "no optimizer plugin installed"
    import torch

    probe = [torch.zeros(4, 4, dtype=torch.float64)]
    for name in optiplug.optimizers():
        records = optiplug.default_registry().implementations(name)
        runnable = {r.name for r in records if r.unavailable_reason() is None and r.can_run(probe)}
        unavailable = {r.name for r in records if r.unavailable_reason() is not None}
        found = {impl for n, impl in cases if n == name}
        assert found == {None} | runnable
        assert not found & unavailable  # e.g. a CUDA kernel on a CPU machine is left out
    for name in {"sgd", "adam", "adamw"} & set(optiplug.optimizers()):
        assert {impl for n, impl in cases if n == name} >= {None, "loop", "foreach", "fused"}


def test_a_broken_optimizer_fails_the_suite() -> None:
    import torch

    import optiplug

    class Stuck(torch.optim.SGD):
        """An SGD whose step does nothing: it must fail the convergence check."""

        def step(self, closure=None):
            return None

    class Plugin:
        @optiplug.hookimpl
        def optiplug_optimizers(self):
            return [optiplug.OptimizerSpec(name="stuck", factory=Stuck)]

    registry = optiplug.Registry(autoload=False)
    registry.register(Plugin(), "stuck")
    with pytest.raises(AssertionError, match="stuck"):
        testing.check_quadratic_converges("stuck", registry=registry)
    testing.check_no_grad_step_is_noop("stuck", registry=registry)

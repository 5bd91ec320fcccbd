"""The conformance suite, table-driven over every installed algorithm and implementation."""

from __future__ import annotations

import pytest

from optiplug import testing


# The bridged algorithms run this suite in their bridges' own test files, which
# know each library's needs; here, every native algorithm and implementation.
@pytest.mark.parametrize("name, impl", testing.conformance_cases(bridged=False))
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_conformance(name: str, impl: str | None, check) -> None:
    reason = testing.limitation(name)
    if reason:
        pytest.skip(reason)
    check(name, impl=impl)


def test_cases_cover_every_installed_algorithm_and_implementation() -> None:
    import torch

    import optiplug

    registry = optiplug.default_registry()
    cases = testing.conformance_cases()
    assert optiplug.optimizers(), "no optimizer plugin installed"
    for spec in registry.optimizer_specs():
        name = registry.name_of(spec)
        shape, dtype = testing.example_of(None, name)  # 4x4 float64 unless it declares another
        records = registry.implementations(name)
        probe = [torch.zeros(*shape, dtype=dtype)]
        runnable = {r.name for r in records if r.unavailable_reason() is None and r.can_run(probe)}
        unavailable = {r.name for r in records if r.unavailable_reason() is not None}
        found = {impl for n, impl in cases if n == name}
        assert found == {None} | runnable, name
        assert not found & unavailable  # e.g. a CUDA kernel on a CPU machine is left out
    native = {name for name, _ in testing.conformance_cases(bridged=False)}
    assert native >= {"sgd", "adam", "adamw", "lion", "muon", "normuon"}
    assert all(registry.spec(name).origin is None for name in native)
    for name in {"sgd", "adam", "adamw"} & set(optiplug.optimizers()):
        assert {impl for n, impl in cases if n == name} >= {None, "loop", "foreach", "fused"}

"""torch's GradScaler over torch-backed optimizers whose implementation changed after construction.

torch marks an optimizer built fused as unscaling on its own; GradScaler then
leaves unscaling and the inf check to its step. An optimizer measured fastest
in loop or foreach (or whose groups a user switched) must still step exactly
as the scaler steps a plain torch optimizer of that implementation.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import optiplug

CASES = {
    "adam": (torch.optim.Adam, {}),
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.01}),
    "sgd": (torch.optim.SGD, {"momentum": 0.9}),
}
LR = 0.01


def parameters() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((5, 3), (3,))]


def scaled_steps(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> list[float]:
    """Three finite steps, then one with infinite gradients; the scale after each."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scales = []
    for step in range(4):
        loss = sum((p * (step + 1)).square().sum() for p in params)
        if step == 3:
            loss = loss + (params[0].sum() - params[0].detach().sum()).sqrt()  # d/dx sqrt(0): inf
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def by_switch(optimizer: torch.optim.Optimizer, impl: str) -> None:
    optimizer.switch_implementation(impl)  # type: ignore[attr-defined]


def by_group_flags(optimizer: torch.optim.Optimizer, impl: str) -> None:
    # what the scaler meets when the measured winner takes over inside the step:
    # the optimizer still says it unscales, its groups no longer run fused
    for group in optimizer.param_groups:
        group.update(foreach=impl == "foreach", fused=False)


@pytest.mark.parametrize("change", [by_switch, by_group_flags], ids=["switch", "group-flags"])
@pytest.mark.parametrize("impl", ["loop", "foreach"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_built_fused_then_unfused_steps_as_torch_under_the_scaler(
    name: str, impl: str, change: Callable[[torch.optim.Optimizer, str], None]
) -> None:
    torch_class, hparams = CASES[name]
    params = parameters()
    optimizer = optiplug.create(name, params, lr=LR, impl="fused", **hparams)
    change(optimizer, impl)
    reference_params = parameters()
    reference = torch_class(reference_params, lr=LR, foreach=impl == "foreach", **hparams)
    scales = scaled_steps(optimizer, params)
    assert scales == scaled_steps(reference, reference_params)
    assert scales[-1] == scales[-2] / 2  # the infinite step was skipped, the scale halved
    for mine, theirs in zip(params, reference_params, strict=True):
        assert torch.equal(mine, theirs)  # same unscale factor, same kernel: same bits
    for mine, theirs in zip(optimizer.state.values(), reference.state.values(), strict=True):
        for key, value in theirs.items():
            assert torch.equal(torch.as_tensor(mine[key]).float(), torch.as_tensor(value).float())


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_steps_as_torch_fused_under_the_scaler(name: str) -> None:
    torch_class, hparams = CASES[name]
    params, reference_params = parameters(), parameters()
    optimizer = optiplug.create(name, params, lr=LR, impl="fused", **hparams)
    reference = torch_class(reference_params, lr=LR, fused=True, **hparams)
    assert scaled_steps(optimizer, params) == scaled_steps(reference, reference_params)
    for mine, theirs in zip(params, reference_params, strict=True):
        assert torch.equal(mine, theirs)

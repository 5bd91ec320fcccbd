"""The deprecated step helpers plugins called before the step pipeline still do what they did.

``cautious_weight_decay(optimizer, step)`` and ``step_in_state_precision(
optimizer, step, ...)`` take a closure that reads the optimizer's own
``param_groups``; around torch's own ``AdamW`` they give the update of
optiplug's ``adamw`` with the same settings, bit for bit (the same torch
kernel on the same values), and leave the groups as they were.
"""

from __future__ import annotations

import torch

import optiplug
from optiplug.base import cautious_weight_decay, step_in_state_precision


def _pair(
    **group: object,
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer, list[torch.Tensor]]:
    start = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    mine, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ours = optiplug.create("adamw", [mine], lr=1e-2, weight_decay=0.5, impl="loop", **group)
    torchs = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.5, foreach=False)
    torchs.param_groups[0].update(group)
    return ours, torchs, [mine, theirs]


def _steps(ours: torch.optim.Optimizer, step: object, params: list[torch.Tensor]) -> None:
    for index in range(3):
        grad = torch.randn(64, 96, generator=torch.Generator().manual_seed(10 + index))
        params[0].grad, params[1].grad = grad.clone(), grad.clone()
        ours.step()
        step()  # type: ignore[operator]


def test_cautious_weight_decay_around_torchs_step_is_adamws_cautious_mode() -> None:
    ours, torchs, params = _pair(weight_decay_mode="cautious")
    groups = torchs.param_groups
    _steps(ours, lambda: cautious_weight_decay(torchs, torchs.step), params)
    assert torch.equal(params[0], params[1])
    assert torchs.param_groups is groups and groups[0]["weight_decay"] == 0.5


def test_step_in_state_precision_around_torchs_step_is_adamws_int8_state() -> None:
    ours, torchs, params = _pair(state_precision="int8")
    groups = torchs.param_groups
    _steps(ours, lambda: step_in_state_precision(torchs, torchs.step), params)
    assert torch.equal(params[0], params[1])
    mine, theirs = ours.state[params[0]]["exp_avg"], torchs.state[params[1]]["exp_avg"]
    assert mine.precision == theirs.precision == "int8"
    assert torch.equal(mine.codes, theirs.codes) and torch.equal(mine.scales, theirs.scales)
    assert torchs.param_groups is groups and len(groups[0]["params"]) == 1

"""Steps and comparisons the single-library bridge tests share (apollo, galore, grokadamw).

Each test trains a small ``8 -> ... -> 3`` network on seeded random batches:
step ``n`` draws its batch from a generator seeded with ``n``, so two runs
that take the same steps see the same data, and an interrupted run resumed
at step ``first`` continues exactly where an uninterrupted one would be.
"""

from __future__ import annotations

from typing import Any

import torch


def run(optimizer: Any, model: torch.nn.Module, first: int, count: int) -> None:
    """Take steps ``first .. first + count - 1`` of mean-squared error on seeded batches."""
    device = next(model.parameters()).device
    for step in range(first, first + count):
        generator = torch.Generator().manual_seed(step)
        inputs = torch.randn(5, 8, generator=generator).to(device)
        targets = torch.randn(5, 3, generator=generator).to(device)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()


def same(left: torch.nn.Module, right: torch.nn.Module) -> bool:
    """Whether the two models' parameters are bit-equal, pair by pair."""
    pairs = zip(left.parameters(), right.parameters(), strict=True)
    return all(torch.equal(a, b) for a, b in pairs)

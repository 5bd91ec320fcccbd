"""Shared by the autotune cache's tests: one choice, as a fresh process makes it, and the file.

A test module puts every test in a fresh cache with
``pytestmark = pytest.mark.usefixtures("_cache_in_tmp")`` (the fixture is in
``conftest.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import optiplug
from optiplug._choice.chooser import chooser_of


def params(size: int = 64, count: int = 2, dtype: torch.dtype = torch.float32) -> list[Any]:
    return [torch.nn.Parameter(torch.ones(size, dtype=dtype)) for _ in range(count)]


def choose(size: int = 64, count: int = 2, dtype: torch.dtype = torch.float32) -> Any:
    """As a new process would: forget this process's choices, then create sgd; its record.

    A first choice is measured in the background: waited for here, and taken
    by the optimizer at its next step.
    """
    chooser_of().clear()
    optimizer = optiplug.create("sgd", params(size, count, dtype), momentum=0.9)
    chooser_of().wait_for_measurements()
    optimizer.step()
    [record] = chooser_of().measurements().values()
    assert record.winner == optimizer.impl  # type: ignore[attr-defined]
    return record


def entries(file: Path) -> dict[str, Any]:
    data = json.loads(file.read_text())
    assert data["format"] == 1
    found: dict[str, Any] = data["entries"]
    return found

"""The bridges' summary page states the catalogue as installed: counts and the pass rate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import optiplug

LIBRARIES = ("pytorch-optimizer", "heavyball", "torchao", "schedulefree", "bitsandbytes")


def test_at_least_95_percent_of_bridged_optimizers_pass_and_the_page_says_so() -> None:
    for module in ("pytorch_optimizer", "heavyball", "torchao", "schedulefree", "bitsandbytes"):
        pytest.importorskip(module)
    specs = [s for s in optiplug.default_registry().optimizer_specs() if s.origin is not None]
    bridged = [s for s in specs if s.origin is not None and s.origin.library in LIBRARIES]
    passing = [s for s in bridged if s.origin is not None and not s.origin.limitation]
    assert len(passing) >= 0.95 * len(bridged)
    page = (Path(__file__).parents[1] / "docs" / "bridges" / "index.md").read_text("utf-8")
    stated = re.search(r"register (\d+) optimizers.*?\*\*(\d+) pass\*\*", page, re.S)
    assert stated is not None
    assert (int(stated[1]), int(stated[2])) == (len(bridged), len(passing))

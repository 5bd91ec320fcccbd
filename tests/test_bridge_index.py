"""The bridges' summary page states the catalogue as installed: counts and the pass rate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import optiplug

LIBRARIES = (
    "pytorch-optimizer",
    "heavyball",
    "torchao",
    "schedulefree",
    "torch",
    "bitsandbytes",
    "galore-torch",
    "apollo-torch",
    "grokadamw",
)
MODULES = (
    "pytorch_optimizer",
    "heavyball",
    "torchao",
    "schedulefree",
    "bitsandbytes",
    "galore_torch",
    "apollo_torch",
    "grokadamw",
)


def test_at_least_95_percent_of_the_bridged_entries_pass_and_the_page_says_so() -> None:
    """At least 95% of the bridged entries pass every check, and so of the whole catalogue.

    optiplug's own algorithms all pass, so the whole catalogue's share is at
    least the bridged entries'; the page states both counts.
    """
    for module in MODULES:
        pytest.importorskip(module)
    every = optiplug.default_registry().optimizer_specs()
    specs = [s for s in every if s.origin is not None]
    bridged = [s for s in specs if s.origin is not None and s.origin.library in LIBRARIES]
    passing = [s for s in bridged if s.origin is not None and not s.origin.limitation]
    limited = [s for s in every if s.origin is not None and s.origin.limitation]
    assert len(passing) >= 0.95 * len(bridged), (len(passing), len(bridged))
    assert len(every) - len(limited) >= 0.95 * len(every)
    page = (Path(__file__).parents[1] / "docs" / "bridges" / "index.md").read_text("utf-8")
    stated = re.search(r"register (\d+) optimizers.*?\*\*(\d+) pass\*\*", page, re.S)
    assert stated is not None
    assert (int(stated[1]), int(stated[2])) == (len(bridged), len(passing))

"""``optiplug list`` imports no torch and no bridged library, with every bridge installed.

``python -m optiplug list`` and the ``optiplug`` console script run in a
fresh interpreter under ``-X importtime``, which names every module the
process imports; the catalogue comes from the plugins' lazily registered
data, so neither torch nor any library a bridge wraps may be among them.
How long it takes is measured in ``benchmarks/bench_list.py``, not here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = (
    "torch",
    "pytorch_optimizer",
    "heavyball",
    "torchao",
    "schedulefree",
    "bitsandbytes",
    "galore_torch",
    "apollo_torch",
    "grokadamw",
)
BRIDGES = ("optiplug_pytorch_optimizer", "optiplug_heavyball", "optiplug_torchao")


def _console_script() -> Path:
    script = Path(sys.executable).parent / "optiplug"
    if not script.exists():
        pytest.skip("the optiplug console script is not installed beside this interpreter")
    return script


def _imported(command: list[str]) -> set[str]:
    """The top-level names of every module ``command`` imports (``-X importtime``'s lines)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *command], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "optiplug-adamw" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["python -m optiplug", "console script"])
@pytest.mark.parametrize("arguments", [["list"], ["list", "--json"]], ids=["table", "json"])
def test_list_imports_no_torch_and_no_bridged_library(how: str, arguments: list[str]) -> None:
    for bridge in BRIDGES:  # every bridge installed, so its catalogue is listed
        pytest.importorskip(bridge)
    entry = ["-m", "optiplug"] if how == "python -m optiplug" else [str(_console_script())]
    imported = _imported([*entry, *arguments])
    assert "optiplug" in imported
    assert not set(HEAVY) & imported, sorted(set(HEAVY) & imported)

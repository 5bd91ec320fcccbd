"""Loading a script of ``benchmarks/`` as a module, for the tests of its pieces."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(filename: str) -> ModuleType:
    """``benchmarks/<filename>`` imported under a name of its own (``<stem>_under_test``).

    The module is registered in ``sys.modules`` first: dataclasses look
    their module up while the file runs.
    """
    path = BENCHMARKS / filename
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

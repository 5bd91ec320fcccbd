"""Count the Python calls one ``optiplug.create`` makes, and the hops between files.

Each trace runs in a fresh process (first use: no autotune decision in memory,
the autotune cache file switched off) after ``import optiplug`` and plugin
discovery, with :func:`sys.setprofile` (and :func:`threading.setprofile`, for
the measurement's worker threads) recording every Python call made in
optiplug's own files (the core and the first-party plugins):

* calls: function calls in those files, on the calling thread;
* elsewhere: those made meanwhile on other threads (measuring), until
  ``create`` returns;
* files: distinct files among the calling thread's;
* hops: its calls whose caller is in another first-party file;
* validations: runs of ``validate_hyperparameters`` (every thread);
* selections: runs of the implementation choice (``ImplementationChooser.select``);
* constructions: optimizers constructed (``torch.optim.Optimizer.__init__``).

Run: ``python benchmarks/trace_create.py`` (prints one line per trace).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

TRACES = {
    "impl=foreach": "foreach",
    "impl=None": None,
}
_ROOT = Path(__file__).resolve().parent.parent


def _first_party(filename: str) -> bool:
    parts = Path(filename).parts
    return any(p == "optiplug" or p.startswith("optiplug_") for p in parts) and (
        "site-packages" not in parts or any(p.startswith("optiplug") for p in parts)
    )


def trace(impl: str | None) -> dict[str, Any]:
    """Trace one ``create("adamw", Linear(8, 8).parameters(), lr=1e-3, impl=impl)``."""
    import torch

    import optiplug

    optiplug.optimizers()  # plugin discovery is not part of the trace
    params = list(torch.nn.Linear(8, 8).parameters())
    optimizer_init = torch.optim.Optimizer.__init__.__code__
    counts: Counter[str] = Counter()
    files: set[str] = set()
    lock = threading.Lock()
    caller_thread = threading.current_thread()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        with lock:
            if code is optimizer_init:
                counts["constructions"] += 1
            filename = code.co_filename
            if not _first_party(filename):
                return
            if code.co_name == "validate_hyperparameters":
                counts["validations"] += 1
            if code.co_name == "select" and filename.endswith("chooser.py"):
                counts["selections"] += 1
            if threading.current_thread() is not caller_thread:
                counts["elsewhere"] += 1
                return
            counts["calls"] += 1
            files.add(filename)
            caller = frame.f_back.f_code.co_filename if frame.f_back is not None else filename
            if caller != filename and _first_party(caller):
                counts["hops"] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        optimizer = optiplug.create("adamw", params, lr=1e-3, impl=impl)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return {
        "impl": getattr(optimizer, "impl", None),
        "calls": counts["calls"],
        "elsewhere": counts["elsewhere"],
        "files": len(files),
        "hops": counts["hops"],
        "validations": counts["validations"],
        "selections": counts["selections"],
        "constructions": counts["constructions"],
    }


def main() -> None:
    """Run each trace in a fresh process and print its counts."""
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        impl = None if sys.argv[2] == "None" else sys.argv[2]
        print(json.dumps(trace(impl)))
        return
    env = {**os.environ, "OPTIPLUG_AUTOTUNE_CACHE": "0"}
    for label, impl in TRACES.items():
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(impl)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=_ROOT,
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        fields = " ".join(f"{key}={value}" for key, value in result.items())
        print(f"{label:14} {fields}")


if __name__ == "__main__":
    main()

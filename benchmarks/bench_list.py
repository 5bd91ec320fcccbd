"""Wall time of ``optiplug list`` in a fresh process, against ``import torch`` in the same run.

``optiplug list`` reads the catalogue the plugins register lazily, so it
imports no torch and no bridged library (``tests/test_list_imports.py``
checks that); this measures what it costs. Each command runs ``--runs``
times (default 5), each in a fresh interpreter, interleaved so that a busy
machine slows them alike; the median of each is printed, with the bare
interpreter's start-up and ``import torch`` as yardsticks, and the ratio of
``list`` to ``import torch``.

    python benchmarks/bench_list.py
    python benchmarks/bench_list.py --runs 9
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -m optiplug list": [sys.executable, "-m", "optiplug", "list"],
    "python -m optiplug list --json": [sys.executable, "-m", "optiplug", "list", "--json"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}


def _wall(command: list[str]) -> float:
    """Seconds one fresh process running ``command`` takes, start to exit."""
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    """Run each command ``--runs`` times, interleaved, and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    for command in COMMANDS.values():  # warm the file cache: the first run reads from disk
        _wall(command)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, command in COMMANDS.items():
            times[name].append(_wall(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(
            f"{name:34} median {median:6.3f} s  (of {runs}: {min(times[name]):.3f}-{max(times[name]):.3f})"
        )
    ratio = medians["python -m optiplug list"] / medians["python -c 'import torch'"]
    print(f"optiplug list / import torch: {ratio:.2f}")


if __name__ == "__main__":
    main()

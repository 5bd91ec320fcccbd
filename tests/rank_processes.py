"""Start one worker process per rank and wait for all of them under one deadline.

The multi-process tests (DDP, FSDP, sharded checkpoints, sharded Muon, the
tune's rank agreement) share this: a rank that overruns the deadline is
killed, so a hung collective fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_ranks(
    script: Path,
    world: int,
    args: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> list[tuple[int | None, str]]:
    """Run ``python script RANK WORLD *args`` for every rank; wait ``timeout`` seconds in all.

    Args:
        script: the worker.
        world: how many ranks.
        args: the worker's arguments after the rank and world size.
        timeout: seconds for all of them together.
        env: variables added to this process's environment.

    Returns:
        ``(returncode, stderr)`` per rank; the returncode is None for a rank
        killed at the deadline.
    """
    environment = {**os.environ, **(env or {})}
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(world), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for rank in range(world)
    ]
    deadline = time.monotonic() + timeout
    results: list[tuple[int | None, str]] = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((process.returncode, err))
        except subprocess.TimeoutExpired:
            process.kill()
            results.append((None, process.communicate()[1]))
    return results

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


# ------------------------------------------------------------------ inside a worker
def worker_arguments() -> tuple[int, int, Path]:
    """A worker's ``RANK WORLD OUT_DIR`` command line, as :func:`run_ranks` passes it."""
    rank, world, out = sys.argv[1:4]
    return int(rank), int(world), Path(out)


def join_gloo(out: Path, rank: int, world: int, timeout_seconds: float = 60) -> None:
    """Join the gloo process group of ``world`` ranks that meet through a file store in ``out``."""
    import datetime

    import torch.distributed

    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{out / 'rendezvous'}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_seconds),
    )


def leave(code: int) -> None:
    """End a worker whose results are written and whose process group is destroyed.

    Gloo's threads can still hold tensors at interpreter finalization, which
    then aborts a finished rank ("terminate called without an active
    exception"); the worker leaves without finalizing.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""``--nproc N``: one run in N processes (``torch.distributed``, gloo on 127.0.0.1).

Every process builds the same seeded Graph, which wraps the model in DDP (or,
with ``--parallel fsdp``, shards it with FSDP2; that runs here even for one
process, since FSDP needs a process group) and gives each process its shard
of every global batch. A registry is a
process-local object and is not sent to the workers: each resolves names in
its own process's registry (the launching process checked them already).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import pickle
import socket
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.multiprocessing.spawn import ProcessException, spawn

import optiplug
from optiplug.errors import OptiplugError

from .config import TrainConfig
from .cpus import choose_threads
from .data import load_corpus
from .loop import check_run, train
from .report import echo
from .results import TrainResult

__all__ = ["launch", "torch_threads"]


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Use ``count`` torch intra-op threads inside the block (None: leave them alone).

    On a machine shared with other work, fewer threads than cores is often much
    faster: spinning OpenMP threads wait for each other on every small op
    (:func:`~optiplug_train.cpus.choose_threads` picks the default).

    Args:
        count: the thread count, or None.

    Yields:
        Nothing; the previous count is restored on exit.
    """
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, config: TrainConfig, port: int, out: str, quiet: bool, threads: int) -> None:
    """One process of a ``--nproc`` run (the target of ``torch.multiprocessing.spawn``)."""
    torch.set_num_threads(threads)
    # the loop never changes the model's output in place, so FSDP's warning about views is moot
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=config.nproc,
        timeout=datetime.timedelta(minutes=5),
    )
    try:
        registry = optiplug.default_registry()  # this process's own: registries are not sent
        result = train(config, registry, log=echo if rank == 0 else None, quiet=quiet)
        if result is not None:
            Path(out).write_bytes(pickle.dumps(result))
        torch.distributed.barrier()  # every rank done before anyone tears down
    finally:
        gc.collect()  # drop DDP's reducer before its gloo group goes (else: abort at exit)
        torch.distributed.destroy_process_group()


def launch(config: TrainConfig, *, quiet: bool = False, threads: int | None = None) -> TrainResult:
    """Run ``config`` in ``config.nproc`` processes (gloo on 127.0.0.1, a free port).

    Every process builds the same seeded Graph, which wraps the model in DDP
    (or shards it with FSDP2 under ``config.parallel == "fsdp"``)
    and gives each process its shard of every global batch
    (``batch_size / nproc`` windows); gradients are averaged, so the global
    batch and the learning rate are those of a one-process run. Rank 0 prints.

    Args:
        config: the run (``config.nproc`` processes).
        quiet: log lines instead of a progress bar.
        threads: torch threads per process (default: ``config.threads``, else
            the CPUs available to this process divided among the processes).

    Returns:
        Rank 0's :class:`TrainResult`.

    Raises:
        OptiplugError: a process failed (its last error line is quoted).
    """
    check_run(config, load_corpus(config.data, config.max_chars))
    with tempfile.TemporaryDirectory(prefix="optiplug-train-") as scratch:
        out = Path(scratch) / "result.pickle"
        per_process = threads or choose_threads(config.threads, config.nproc).threads
        args = (config, _free_port(), str(out), quiet, per_process)
        try:
            spawn(_worker, args=args, nprocs=config.nproc)  # type: ignore[no-untyped-call]
        except ProcessException as error:
            lines = [line for line in str(error).splitlines() if line.strip()]
            raise OptiplugError(
                f"--nproc {config.nproc}: a process failed: {lines[-1] if lines else error}"
            ) from error
        result = pickle.loads(out.read_bytes())
    if not isinstance(result, TrainResult):
        raise OptiplugError(f"--nproc {config.nproc}: rank 0 returned no result")
    return result

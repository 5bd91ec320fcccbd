"""Gradient accumulation under DDP: ``optiplug.Graph`` against torch's own idiom.

Two gloo processes on this machine train the same MLP with SGD (momentum,
fused kernel forced in every loop) on the same micro-batches, accumulating
``--accumulate`` micro-batches per optimizer step, in three loops:

- ``torch no_sync``: a hand-written DDP loop running every micro-batch but
  the last under ``DistributedDataParallel.no_sync()`` (torch's documented
  way: one all-reduce per optimizer step);
- ``torch sync every``: the same loop without ``no_sync`` (one all-reduce per
  micro-batch: what Graph did before it used ``no_sync``);
- ``optiplug.Graph``: ``forward_batch``/``backward``/``step`` with
  ``accumulate``.

The loops run in interleaved rounds on both ranks (the order alternating each
round); rank 0 reports each one's median time per optimizer step and the
ratios against ``torch no_sync``, then whether Graph's parameters equal the
``torch no_sync`` loop's bit for bit.

Usage: ``python benchmarks/bench_ddp_accumulation.py [--rounds 10] [--steps-per-round 4]``
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from bench_graph_overhead import measure  # interleaved rounds, same as the Graph overhead bench
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import optiplug

WORLD = 2
HPARAMS = {"lr": 0.01, "momentum": 0.9}


class Pairs(Dataset):
    """Fixed random regression pairs (``x``, ``y``), the same on every rank."""

    def __init__(self, size: int, width: int) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, width, generator=generator)
        self.y = torch.randn(size, width, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


def make_model(width: int, hidden: int) -> torch.nn.Module:
    """The MLP, with weights fixed by seed 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, width),
    )


def hand_loop(
    model: torch.nn.Module, loader: DataLoader, accumulate: int, no_sync: bool
) -> Callable[[], None]:
    """One optimizer step of a hand-written DDP loop over ``accumulate`` micro-batches."""
    ddp = DistributedDataParallel(model)
    optimizer = optiplug.create("sgd", model.named_parameters(), impl="fused", **HPARAMS)
    batches = iter(loader)

    def step() -> None:
        for index in range(accumulate):
            batch = next(batches)
            last = index == accumulate - 1
            quiet = ddp.no_sync() if no_sync and not last else contextlib.nullcontext()
            with quiet:
                loss = torch.nn.functional.mse_loss(ddp(batch["x"]), batch["y"])
            (loss / accumulate).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def graph_loop(
    model: torch.nn.Module, loader: DataLoader, accumulate: int
) -> tuple[Callable[[], None], optiplug.Graph]:
    """One optimizer step through ``optiplug.Graph`` with ``accumulate``."""
    graph = optiplug.Graph(model, accumulate=accumulate)
    graph.set_optimizer(optiplug.factory("sgd", impl="fused", **HPARAMS))
    graph.set_data_loader(loader, forward_input="x")
    batches = iter(graph.epoch(0))

    def step() -> None:
        for _ in range(accumulate):
            batch = next(batches)
            loss = torch.nn.functional.mse_loss(graph.forward_batch(batch), batch["y"])
            graph.backward(loss)
            graph.step()

    return step, graph


def together(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` started by every rank at once (a barrier first), so ranks time the same work."""

    def run() -> None:
        dist.barrier()
        step()

    return run


def run_rank(rank: int, args: argparse.Namespace, rendezvous: str) -> None:
    """Build the three loops on this rank, time them interleaved, report on rank 0."""
    torch.set_num_threads(args.threads)
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group(
        "gloo", init_method=rendezvous, rank=rank, world_size=WORLD, timeout=timeout
    )
    total = args.accumulate * (args.rounds * args.steps_per_round + args.warmup)
    data = Pairs(total * args.batch_size * WORLD, args.width)
    sharded = torch.utils.data.DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sharded)
    models = {name: make_model(args.width, args.hidden) for name in ("no_sync", "every", "graph")}
    graph_step, graph = graph_loop(
        models["graph"], DataLoader(data, batch_size=args.batch_size), args.accumulate
    )
    loops = {
        "torch no_sync": hand_loop(models["no_sync"], loader, args.accumulate, no_sync=True),
        "torch sync every": hand_loop(models["every"], loader, args.accumulate, no_sync=False),
        "optiplug.Graph": graph_step,
    }
    timed = {name: together(step) for name, step in loops.items()}
    found = measure(timed, args.rounds, args.steps_per_round, args.warmup)
    same = all(
        torch.equal(p, q)
        for p, q in zip(graph.module.parameters(), models["no_sync"].parameters(), strict=True)
    )
    if rank == 0:
        report(found, args, same, sum(p.numel() for p in graph.parameters()))
    dist.barrier()
    dist.destroy_process_group()


def report(found: dict[str, list[float]], args: argparse.Namespace, same: bool, size: int) -> None:
    """Print the median ms per optimizer step and the ratios against ``torch no_sync``."""
    medians = {name: statistics.median(times) for name, times in found.items()}
    base = medians["torch no_sync"]
    print(f"torch {torch.__version__}, {WORLD} gloo ranks x {args.threads} thread(s)")
    print(
        f"MLP {size / 1e6:.1f}M parameters, accumulate {args.accumulate} x {args.batch_size} samples"
    )
    for name, median in medians.items():
        print(f"{name:18s} median {median * 1e3:8.1f} ms/step   ratio {median / base:.3f}")
    print(f"Graph parameters identical to torch no_sync: {'yes' if same else 'NO'}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-round", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = f"file://{Path(folder) / 'rendezvous'}"
        torch.multiprocessing.spawn(run_rank, args=(args, rendezvous), nprocs=WORLD)


if __name__ == "__main__":
    main()

"""DDP against FSDP2 in ``optiplug.Graph``: step time and per-rank optimizer-state bytes.

Two gloo processes on this machine train the ``optiplug train`` character
transformer (default: 3 layers x 96, 360k parameters) and a wider one
(3 layers x 384), each twice: ``Graph(parallel="ddp")`` (every rank holds the
whole model and optimizer state; gradients all-reduced) and
``Graph(parallel="fsdp")`` (FSDP2 ``fully_shard`` per transformer block and
the root; parameters all-gathered per unit, gradients reduce-scattered, each
rank holding half the state). Both use adamw with the ``foreach``
implementation (torch's fused kernel does not take DTensors), the same
seeded weights and the same global batches (``--batch-size`` windows, half
per rank).

The two loops of a model run in interleaved rounds on both ranks, each timed
step starting at a barrier; rank 0 reports each loop's median time per
optimizer step, the FSDP/DDP ratio, and the optimizer-state bytes each rank
holds (``Graph.optimizer_state_bytes``: a DTensor counts its local shard).

Usage: ``python benchmarks/bench_fsdp.py [--rounds 6] [--steps-per-round 5] [--threads 1]``
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from bench_graph_overhead import measure  # interleaved rounds, as the other benchmarks time
from torch.utils.data import DataLoader

import optiplug
from optiplug_train.data import Windows, load_corpus
from optiplug_train.model import CharTransformer, next_token_loss

WORLD = 2
MODELS = {"train default (3 x 96)": 96, "wider (3 x 384)": 384}


def build(
    width: int, parallel: str, dataset: Windows, args: argparse.Namespace
) -> tuple[Callable[[], None], optiplug.Graph]:
    """One optimizer step of a Graph with ``parallel`` over the seeded model of ``width``."""
    torch.manual_seed(0)
    model = CharTransformer(
        len(args.vocab), block_size=args.block_size, n_layer=3, d_model=width, n_head=4
    )
    graph = optiplug.Graph(model, parallel=parallel)
    graph.set_optimizer("adamw", lr=1e-3, impl="foreach")
    loader = DataLoader(dataset, batch_size=args.batch_size // WORLD, drop_last=True)
    graph.set_data_loader(loader, forward_input="tokens")
    batches = iter(graph.epoch(0))

    def step() -> None:
        dist.barrier()  # every rank starts the step together: ranks time the same work
        batch = next(batches)
        loss = next_token_loss(graph.forward_batch(batch), graph.targets(batch)["targets"])
        graph.backward(loss)
        graph.step()

    return step, graph


def run_rank(rank: int, args: argparse.Namespace, rendezvous: str) -> None:
    """Time both loops of each model on this rank; report on rank 0."""
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group(
        "gloo", init_method=rendezvous, rank=rank, world_size=WORLD, timeout=timeout
    )
    corpus = load_corpus(None, 300_000)
    args.vocab = corpus.vocab
    dataset = Windows(corpus.train, args.block_size)
    lines = [
        f"torch {torch.__version__}, {WORLD} gloo ranks x {args.threads} thread(s), adamw foreach, "
        f"batch {args.batch_size} x {args.block_size} per step ({args.batch_size // WORLD} per rank)"
    ]
    for label, width in MODELS.items():
        loops, graphs = {}, {}
        for parallel in ("ddp", "fsdp"):
            loops[parallel], graphs[parallel] = build(width, parallel, dataset, args)
        found = measure(loops, args.rounds, args.steps_per_round, args.warmup)
        medians = {name: statistics.median(times) for name, times in found.items()}
        size = sum(p.numel() for p in graphs["ddp"].parameters())
        state = {name: graph.optimizer_state_bytes() for name, graph in graphs.items()}
        shares = torch.tensor([state["fsdp"], state["ddp"]], dtype=torch.int64)
        gathered = [torch.zeros_like(shares) for _ in range(WORLD)]
        dist.all_gather(gathered, shares)
        per_rank = ", ".join(f"{int(g[0]):,}" for g in gathered)
        lines += [
            f"{label}: {size:,} parameters",
            f"  ddp   median {medians['ddp'] * 1e3:8.1f} ms/step   state {state['ddp']:,} B/rank",
            f"  fsdp  median {medians['fsdp'] * 1e3:8.1f} ms/step   state {per_rank} B (ranks 0, 1)",
            f"  fsdp/ddp step time {medians['fsdp'] / medians['ddp']:.3f}, "
            f"state {state['fsdp'] / state['ddp']:.3f} (rank 0)",
        ]
        del loops, graphs
    if rank == 0:
        print("\n".join(lines))
    dist.barrier()
    dist.destroy_process_group()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="windows per step, all ranks")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = f"file://{Path(folder) / 'rendezvous'}"
        torch.multiprocessing.spawn(run_rank, args=(args, rendezvous), nprocs=WORLD)


if __name__ == "__main__":
    main()

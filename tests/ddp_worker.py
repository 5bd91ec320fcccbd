"""One rank of a 2-process gloo training run, driven by tests/test_graph_distributed.py.

Usage: ``python ddp_worker.py RANK WORLD OUT_DIR STEPS [--die-after K] [--save-every K]
[--accumulate K] [--clip MAX_NORM]``.
The ranks meet through a file store in OUT_DIR (no TCP port to race for).
Each rank trains the same seeded model with Graph (which wraps DDP and shards
the loader), then writes its final parameters to ``OUT_DIR/rank{RANK}.pt``
and how it chose the optimizer's implementation to ``OUT_DIR/choice{RANK}.json``.
``--die-after K`` makes rank 1 kill itself (SIGKILL) after K steps;
``--save-every K`` saves a Graph checkpoint to ``OUT_DIR/ckpt`` every K steps;
``--clip`` clips the gradient norm (``Graph.set_grad_clip``) and writes the
last norm to ``OUT_DIR/norm{RANK}.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import optiplug
from optiplug._choice.chooser import chooser_of

TIMEOUT = datetime.timedelta(seconds=20)


class Lines(Dataset):
    """A fixed regression dataset: 64 samples of 6 features."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(64, 6, generator=generator)
        self.y = self.x @ torch.arange(6.0).reshape(6, 1) + 0.5

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train(
    graph: optiplug.Graph, steps: int, die_after: int | None, save_every: int | None, out: Path
) -> None:
    epoch = 0
    while graph.training_step < steps:
        for batch in graph.epoch(epoch):
            loss = torch.nn.functional.mse_loss(
                graph.forward_batch(batch), graph.targets(batch)["y"]
            )
            graph.backward(loss)
            graph.step()
            if save_every and graph.training_step % save_every == 0:
                graph.save(out / "ckpt")
            if die_after is not None and graph.training_step == die_after and graph.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if graph.training_step >= steps:
                return
        epoch += 1


def count_gradient_syncs(graph: optiplug.Graph) -> list[int]:
    """Record every gradient all-reduce DDP performs (one per bucket per synced backward)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls: list[int] = []

    def counting(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    graph.model.register_comm_hook(None, counting)
    return calls


def implementation_choices(graph: optiplug.Graph) -> dict[str, object]:
    """The Graph's implementation, its agreed timings, and what a bare create picks here."""
    own_before = len(chooser_of().decisions())
    bare = optiplug.create("sgd", model().parameters(), lr=0.05, momentum=0.9)
    return {
        "graph_impl": graph.optimizer.impl,
        "agreed": {str(key): value for key, value in chooser_of().decisions(agreed=True).items()},
        "bare_impl": bare.impl,
        "bare_measured": len(chooser_of().decisions()) - own_before,
    }


def shutdown(graph: optiplug.Graph) -> None:
    """Leave the process group cleanly: wait for every rank, drop DDP, then destroy."""
    torch.distributed.barrier()
    del graph.model
    gc.collect()
    torch.distributed.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("rank", "world"):
        parser.add_argument(name, type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("--die-after", type=int)
    parser.add_argument("--save-every", type=int)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--clip", type=float)
    args = parser.parse_args()
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{args.out / 'rendezvous'}",
        rank=args.rank,
        world_size=args.world,
        timeout=TIMEOUT,
    )
    graph = optiplug.Graph(model(), accumulate=args.accumulate)
    syncs = count_gradient_syncs(graph)
    graph.set_optimizer("sgd", lr=0.05, momentum=0.9)
    graph.set_grad_clip(args.clip)
    graph.set_data_loader(DataLoader(Lines(), batch_size=4), forward_input="x")
    train(graph, args.steps, args.die_after, args.save_every, args.out)
    torch.save([p.detach() for p in graph.parameters()], args.out / f"rank{args.rank}.pt")
    (args.out / f"syncs{args.rank}.txt").write_text(str(len(syncs)))
    (args.out / f"norm{args.rank}.txt").write_text(repr(graph.last_grad_norm))
    choice = json.dumps(implementation_choices(graph))
    (args.out / f"choice{args.rank}.json").write_text(choice)
    shutdown(graph)
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written and the process group destroyed. Gloo's threads can
    # still hold tensors at interpreter finalization, which then aborts a finished
    # rank ("terminate called without an active exception"); leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""One rank of a 2-process gloo run of ``Graph.tune_optimizer``, driven by tests/test_tune.py.

Usage: ``python tune_worker.py RANK WORLD OUT_DIR``. The ranks meet through a
file store in OUT_DIR. Each rank binds its shard of the data (different
batches on each rank), tunes, and writes what it chose to ``OUT_DIR/rank{RANK}.json``.
"""

from __future__ import annotations

import datetime
import gc
import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import optiplug


def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


def main() -> int:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{out / 'rendezvous'}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    data = [{"x": x[i], "y": y[i]} for i in range(len(x))]
    graph = optiplug.Graph(torch.nn.Linear(4, 1))
    graph.set_data_loader(DataLoader(data, batch_size=8), forward_input="x")
    selection = graph.tune_optimizer(
        loss_fn, candidates=["sgd", "adam"], budget_steps=60, held_out=2
    )
    assert graph.optimizer is not None
    report = {
        "name": selection.name,
        "lr": selection.hparams["lr"],
        "group_lr": graph.optimizer.param_groups[0]["lr"],
        "trials": [[t.algorithm, t.lr, t.held_out_loss] for t in selection.tuning.trials],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.barrier()
    del graph.model
    gc.collect()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

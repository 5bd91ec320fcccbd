"""One rank of a gloo FSDP2 run of normuon, driven by tests/test_muon_sota.py.

Usage: ``python normuon_fsdp_worker.py RANK WORLD OUT_DIR``. The ranks meet
through a file store in OUT_DIR. Each rank trains the GPT-style model of
``muon_fsdp_worker`` (uneven shards and empty shards on 2 ranks), wrapped
with FSDP2 per block and at the root on a 1-D CPU mesh, with ``normuon``
(Polar Express coefficients, cautious weight decay) on its share of each
global batch; rank 0 saves the final full parameters and the second moments
to ``OUT_DIR/normuon.pt``, and every rank's step reports, all-gathered, to
``OUT_DIR/results.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).parent))
import muon_fsdp_worker as base

import optiplug

TIMEOUT = datetime.timedelta(seconds=60)
STEPS = base.STEPS
NORMUON: dict[str, Any] = {
    "lr": 0.02,
    "weight_decay": 0.5,
    "weight_decay_mode": "cautious",
    "ns_coefficients": "polar_express",
    "ns_dtype": "float32",
    "aux_lr": 3e-3,
}


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """``normuon`` over ``model`` (its AdamW half takes embeddings, head and norms)."""
    return optiplug.create("normuon", model.named_parameters(), model=model, **NORMUON)


def main() -> int:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{out / 'rendezvous'}",
        rank=rank,
        world_size=world,
        timeout=TIMEOUT,
    )
    mesh = init_device_mesh("cpu", (world,))
    model = base.fsdp(base.gpt(), mesh)
    optimizer = make_optimizer(model)
    reports: list[dict[str, Any]] = []
    for step in range(STEPS):
        base.loss_of(model, base.batch(step).chunk(world)[rank]).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()
        reports.append(attrs.asdict(optimizer.last_step_report()))  # type: ignore[attr-defined]
    params = {name: p.full_tensor() for name, p in model.named_parameters()}  # type: ignore[attr-defined]
    seconds = {
        name: optimizer.state[p]["second_momentum_buffer"].full_tensor()
        for name, p in model.named_parameters()
        if "second_momentum_buffer" in optimizer.state[p]
    }
    if rank == 0:
        torch.save({"params": params, "seconds": seconds}, out / "normuon.pt")
    results = {"reports": base.gather(reports), "routing": base.routing_rows(optimizer)}
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # gloo's threads may abort a finished rank at finalization

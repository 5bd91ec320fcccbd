"""One rank of an FSDP2 (``fully_shard``) run on gloo, driven by tests/test_checkpoint_sharded.py.

Usage: ``python sharded_worker.py RANK WORLD OUT_DIR SCENARIO``. The ranks meet
through a file store in OUT_DIR (no TCP port to race for); each writes what it
found to ``OUT_DIR/SCENARIO-rank{RANK}.json`` and the test reads them.

Scenarios:

- ``main`` (2 ranks): train a sharded model with adamw in a plain loop, save
  a sharded checkpoint at step 3 (its full values in ``saved.pt``), train on
  to step 6; resume a differently initialised model from the checkpoint and
  compare every parameter and state shard bit for bit; then load damaged
  copies (a flipped byte, a truncated file, a missing file), a checkpoint of
  another architecture, and try to save a state with NaN on one rank only:
  each must be refused on both ranks with model and optimizer unchanged.
  Then the same resume through ``optiplug.Graph`` (schedule, shuffled
  sharded loader, dropout drawing from each rank's own RNG), saving mid-epoch.
- ``reshard`` (any world size): load ``OUT_DIR/ckpt`` into a model sharded over
  this world and write its full values to ``resharded.pt``.
- ``kill`` (2 ranks): save a good checkpoint at step 2, then at step 4 rank 1
  kills itself (SIGKILL) after writing its shards, before the ranks agree;
  rank 0 reports how its save failed and how long that took.
- ``kill0`` (2 ranks): save a good checkpoint at step 2, then at step 4 rank 0
  kills itself (SIGKILL) right after moving the new checkpoint into place,
  before it tells rank 1; rank 1 reports how its save failed.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Dataset

import optiplug
from optiplug import checkpoint
from optiplug._checkpoint import sharded
from optiplug.errors import CheckpointError, StateDictError

TIMEOUT = datetime.timedelta(seconds=20)
STEPS, SAVE_AT = 6, 3


def build(seed: int = 0, dropout: float = 0.0, width: int = 16) -> torch.nn.Sequential:
    """Three linear layers; the last has a single row, so 4 ranks hold empty shards of it."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, width),
        torch.nn.Tanh(),
        torch.nn.Dropout(dropout),
        torch.nn.Linear(width, 8),
        torch.nn.Tanh(),
        torch.nn.Linear(8, 1),
    )


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: every linear layer its own unit, then the root."""
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return optiplug.create("adamw", model.named_parameters(), lr=1e-2, weight_decay=0.1)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(4, 6, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(model: torch.nn.Module, optimizer: Any, start: int, stop: int, rank: int) -> None:
    for step in range(start, stop):
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def shards(model: torch.nn.Module, optimizer: Any) -> dict[str, torch.Tensor]:
    """This rank's shards of every parameter and state tensor, copied."""
    out = {f"param {n}": local(p.detach()).clone() for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    for param, entry in optimizer.state.items():
        for slot, value in entry.items():
            if isinstance(value, torch.Tensor):
                out[f"state {names[id(param)]} {slot}"] = local(value).clone()
    return out


def full_values(model: torch.nn.Module, optimizer: Any) -> dict[str, torch.Tensor]:
    """Every parameter and state tensor, whole (``full_tensor`` gathers; call on every rank)."""
    out = {}
    for key, value in sorted(shards_refs(model, optimizer).items()):
        out[key] = value.full_tensor() if isinstance(value, DTensor) else value.detach().clone()
    return out


def shards_refs(model: torch.nn.Module, optimizer: Any) -> dict[str, torch.Tensor]:
    out = {f"param {n}": p for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    for param, entry in optimizer.state.items():
        for slot, value in entry.items():
            if isinstance(value, torch.Tensor):
                out[f"state {names[id(param)]} {slot}"] = value
    return out


def same(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    """Bit for bit: the same keys, dtypes, shapes and bytes (NaN-safe)."""
    if first.keys() != second.keys():
        return False
    return all(
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
        for a, b in ((first[k].contiguous(), second[k].contiguous()) for k in first)
    )


def attempt(call: Any) -> dict[str, str]:
    try:
        call()
    except (CheckpointError, StateDictError) as error:
        return {"type": type(error).__name__, "message": str(error)}
    return {"type": "none", "message": ""}


class Samples(Dataset[dict[str, torch.Tensor]]):
    """32 regression samples (each rank's DistributedSampler takes its half)."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(32, 6, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True).cos()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


def graph_run(graph: optiplug.Graph, stop: int, save: Path | None = None) -> None:
    while graph.training_step < stop:
        for item in graph.epoch(graph.data_position[0]):
            loss = torch.nn.functional.mse_loss(graph.forward_batch(item), graph.targets(item)["y"])
            graph.backward(loss)
            graph.step()
            if save is not None and graph.training_step == SAVE_AT:
                graph.save(save)
            if graph.training_step >= stop:
                return


def new_graph(seed: int) -> optiplug.Graph:
    """A Graph of a module that is sharded once the process group is up (see :func:`setup_graph`).

    It is built before ``init_process_group``, so Graph does not wrap the
    module in DDP; ``fully_shard`` then shards the same module in place.
    """
    return optiplug.Graph(build(seed, dropout=0.2))


def setup_graph(graph: optiplug.Graph) -> None:
    shard(graph.module)
    graph.set_optimizer("adamw", lr=1e-2, weight_decay=0.1)
    graph.set_scheduler(optiplug.schedule("cosine", total_steps=12, warmup_steps=2))
    graph.set_data_loader(DataLoader(Samples(), batch_size=4, shuffle=True), forward_input="x")


def scenario_main(rank: int, world: int, out: Path) -> dict[str, Any]:
    graphs = (new_graph(0), new_graph(5))  # before the process group: no DDP wrapper
    init(rank, world, out, "main")
    torch.manual_seed(100 + rank)  # each rank's own dropout draws
    result: dict[str, Any] = {}
    model, optimizer = (m := shard(build(0))), adamw(m)
    train(model, optimizer, 0, SAVE_AT, rank)
    info = checkpoint.save_sharded(out / "ckpt", model, optimizer, step=SAVE_AT)
    result["info"] = {"world_size": info.world_size, "algorithm": info.algorithm}
    saved = full_values(model, optimizer)
    if rank == 0:
        torch.save(saved, out / "saved.pt")
    train(model, optimizer, SAVE_AT, STEPS, rank)
    uninterrupted = shards(model, optimizer)

    resumed, resumed_optimizer = (r := shard(build(1))), adamw(r)
    train(resumed, resumed_optimizer, 0, 1, rank)  # other values, and state to overwrite
    loaded = checkpoint.load_sharded(out / "ckpt", resumed, resumed_optimizer)
    result["extra"] = loaded.extra
    result["loaded_equal"] = full_values(
        resumed, resumed_optimizer
    ).keys() == saved.keys() and same(full_values(resumed, resumed_optimizer), saved)
    train(resumed, resumed_optimizer, SAVE_AT, STEPS, rank)
    result["resume_equal"] = same(shards(resumed, resumed_optimizer), uninterrupted)

    result["damaged"] = damaged_loads(rank, out, resumed, resumed_optimizer)
    other, other_optimizer = (o := shard(build(2, width=12))), adamw(o)
    train(other, other_optimizer, 0, 1, rank)
    result["damaged"]["architecture"] = refused(
        lambda: checkpoint.load_sharded(out / "ckpt", other, other_optimizer),
        other,
        other_optimizer,
    )
    result["nan_save"] = nan_save(rank, out, resumed, resumed_optimizer)
    result["graph"] = graph_resume(rank, out, *graphs)
    return result


def refused(call: Any, model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    before = shards(model, optimizer)
    outcome = attempt(call)
    return {**outcome, "unchanged": same(before, shards(model, optimizer))}


def damaged_loads(rank: int, out: Path, model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """Load three damaged copies of the checkpoint; rank 0 damages them, both ranks load."""
    damage = {
        "flipped": ("__1_0.distcp", lambda p: flip(p)),
        "truncated": ("__0_0.distcp", lambda p: os.truncate(p, p.stat().st_size // 2)),
        "missing": ("__1_0.distcp", lambda p: p.unlink()),
    }
    if rank == 0:
        for kind, (name, spoil) in damage.items():
            shutil.copytree(out / "ckpt", out / kind)
            spoil(out / kind / name)
    torch.distributed.barrier()
    results = {}
    for kind, (name, _) in damage.items():
        load = functools.partial(checkpoint.load_sharded, out / kind, model, optimizer)
        outcome = refused(load, model, optimizer)
        results[kind] = {**outcome, "file": str(out / kind / name)}
    return results


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def nan_save(rank: int, out: Path, model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """NaN in one moment shard of rank 1 only: both ranks refuse; the checkpoint stays."""
    before = checkpoint.verify(out / "ckpt").checkpoint_id
    entry = optimizer.state[next(iter(model.parameters()))]
    kept = local(entry["exp_avg"]).clone()
    if rank == 1:
        local(entry["exp_avg"]).view(-1)[0] = float("nan")
    outcome = attempt(lambda: checkpoint.save_sharded(out / "ckpt", model, optimizer))
    local(entry["exp_avg"]).copy_(kept)
    outcome["checkpoint_kept"] = checkpoint.verify(out / "ckpt").checkpoint_id == before
    return outcome


def graph_resume(
    rank: int, out: Path, first: optiplug.Graph, second: optiplug.Graph
) -> dict[str, Any]:
    setup_graph(first)
    graph_run(first, STEPS, save=out / "graph")
    uninterrupted = shards(first.module, first.optimizer)
    setup_graph(second)
    graph_run(second, 1)
    second.load(out / "graph")
    position = list(second.data_position)
    graph_run(second, STEPS)
    return {
        "position": position,
        "step": second.training_step,
        "equal": same(shards(second.module, second.optimizer), uninterrupted),
        "lrs_equal": second.current_lrs() == first.current_lrs(),
    }


def scenario_reshard(rank: int, world: int, out: Path) -> dict[str, Any]:
    init(rank, world, out, f"reshard{world}")
    model, optimizer = (m := shard(build(3))), adamw(m)
    train(model, optimizer, 0, 1, rank)
    loaded = checkpoint.load_sharded(out / "ckpt", model, optimizer)
    values = full_values(model, optimizer)
    if rank == 0:
        torch.save(values, out / f"resharded{world}.pt")
    return {"extra": loaded.extra, "local_rows": local(model[5].weight).shape[0]}


def scenario_kill(rank: int, world: int, out: Path) -> dict[str, Any]:
    init(rank, world, out, "kill")
    model, optimizer = (m := shard(build(0))), adamw(m)
    train(model, optimizer, 0, 2, rank)
    checkpoint.save_sharded(out / "good", model, optimizer, step=2)
    saved = full_values(model, optimizer)
    if rank == 0:
        torch.save(saved, out / "good.pt")
    train(model, optimizer, 2, 4, rank)
    if rank == 1:  # die once this rank's shards are on disk, before the ranks agree
        record = sharded._record

        def die(*args: Any, **kwargs: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)
            return record(*args, **kwargs)

        sharded._record = die
    started = time.monotonic()
    outcome = attempt(lambda: checkpoint.save_sharded(out / "good", model, optimizer, step=4))
    outcome["seconds"] = time.monotonic() - started
    outcome["leftovers"] = sorted(p.name for p in out.iterdir() if p.name.startswith(".good"))
    return outcome


def scenario_kill0(rank: int, world: int, out: Path) -> dict[str, Any]:
    init(rank, world, out, "kill0")
    model, optimizer = (m := shard(build(0))), adamw(m)
    train(model, optimizer, 0, 2, rank)
    first = checkpoint.save_sharded(out / "good", model, optimizer, step=2)
    train(model, optimizer, 2, 4, rank)
    if rank == 0:  # die once the new checkpoint is installed, before rank 1 hears of it
        install = sharded._install

        def die(*args: Any, **kwargs: Any) -> None:
            install(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        sharded._install = die
    outcome = attempt(lambda: checkpoint.save_sharded(out / "good", model, optimizer, step=4))
    return {**outcome, "previous": first.checkpoint_id}


def init(rank: int, world: int, out: Path, name: str) -> None:
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{out / ('store-' + name)}",
        rank=rank,
        world_size=world,
        timeout=TIMEOUT,
    )


def main() -> int:
    rank, world, out, scenario = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    run = {
        "main": scenario_main,
        "reshard": scenario_reshard,
        "kill": scenario_kill,
        "kill0": scenario_kill0,
    }[scenario]
    result = run(rank, world, out)
    (out / f"{scenario}{world}-rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    if scenario in ("kill", "kill0"):  # the group lost a rank: leave without tearing it down
        os._exit(0)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

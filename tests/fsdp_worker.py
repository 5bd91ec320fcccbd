"""One rank of a 2-process gloo run of Graph(parallel="fsdp"), driven by tests/test_fsdp.py.

Usage: ``python fsdp_worker.py RANK WORLD OUT_DIR``. The ranks meet through a
file store in OUT_DIR. One process group runs every scenario in turn (a spawn
costs more than the training), each on a fresh seeded model, and rank 0 writes
what the test compares with a single process to ``OUT_DIR/results.pt``:

* ``train/<algorithm>/<impl>``: the full parameters after a few steps of
  FSDP training (float64 character transformer, two transformer blocks as
  their own units), and ``impl/...``: the implementation ``impl=None`` chose
  and what forcing a fused one raised;
* ``accumulate``: 2 micro-batches per step, deferred reduce-scatter;
* ``clip``: gradient clipping of sharded gradients (norms and parameters);
* ``nonfinite``: a non-finite gradient on one rank's shard stops (or skips
  on) both ranks; a non-finite loss after an unsynchronised micro-batch is
  dropped with its accumulation;
* ``memory``: optimizer-state bytes per rank, FSDP and DDP;
* ``bf16``: FSDP's mixed-precision policy (parameter and output dtypes);
* ``fp16``: the same with FSDP's sharded loss scaler, and clipping.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import optiplug
from optiplug._graph.fsdp import unit_names
from optiplug.errors import GraphError, HyperparameterError
from optiplug_train.model import CharTransformer, next_token_loss

TIMEOUT = datetime.timedelta(seconds=60)
VOCAB, BLOCK, LAYERS, WIDTH, HEADS = 11, 8, 2, 16, 2
MIN_PARAMS = 1000  # each block (3,360 parameters) is a unit; embeddings and head stay in the root
PER_RANK = 4  # windows per rank and step: the global batch is 8
LR = {"adamw": 1e-2, "adam": 1e-2, "lion": 1e-3, "sgd": 0.1}
HPARAMS: dict[str, dict[str, Any]] = {"sgd": {"momentum": 0.9}}
STEPS = 3
IMPLS = [("adamw", "loop"), ("adamw", "foreach"), ("adam", "loop"), ("adam", "foreach")]
IMPLS += [("sgd", "loop"), ("sgd", "foreach"), ("lion", "loop"), ("lion", "foreach")]


class Windows(Dataset[dict[str, torch.Tensor]]):
    """64 fixed random windows of BLOCK + 1 token ids."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(3)
        self.rows = torch.randint(0, VOCAB, (64, BLOCK + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"tokens": self.rows[index, :-1], "targets": self.rows[index, 1:]}


def model() -> CharTransformer:
    """The seeded float64 model every scenario (and the single-process reference) starts from."""
    torch.manual_seed(0)
    built = CharTransformer(VOCAB, block_size=BLOCK, n_layer=LAYERS, d_model=WIDTH, n_head=HEADS)
    return built.double()


def graph(
    algorithm: str = "adamw", impl: str | None = "loop", parallel: str = "fsdp", **options: Any
) -> optiplug.Graph:
    built = optiplug.Graph(model(), parallel=parallel, fsdp_min_params=MIN_PARAMS, **options)
    hparams = {**HPARAMS.get(algorithm, {}), "lr": LR[algorithm]}
    built.set_optimizer(algorithm, impl=impl, **hparams)
    micro = PER_RANK // built.accumulate
    built.set_data_loader(DataLoader(Windows(), batch_size=micro), forward_input="tokens")
    return built


def loss_of(built: optiplug.Graph, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return next_token_loss(built.forward_batch(batch), built.targets(batch)["targets"])


def train(built: optiplug.Graph, steps: int) -> list[float | None]:
    """``steps`` optimizer steps; the gradient norm of each (None without clipping)."""
    norms = []
    for batch in built.epoch(0):
        built.backward(loss_of(built, batch))
        if built.step():
            norms.append(built.last_grad_norm)
        if built.training_step >= steps:
            break
    return norms


def full(built: optiplug.Graph) -> list[torch.Tensor]:
    """The whole parameters (every rank takes part in gathering them)."""
    return [p.full_tensor().detach().clone() for p in built.parameters()]


def impl_choices() -> dict[str, Any]:
    """What ``impl=None`` picks on DTensor parameters, and what forcing ``fused`` says."""
    found: dict[str, Any] = {}
    for algorithm in ("adamw", "sgd", "lion"):
        found[f"{algorithm}/auto"] = graph(algorithm, impl=None).optimizer.impl
        try:
            graph(algorithm, impl="fused")
            found[f"{algorithm}/fused"] = "accepted"
        except HyperparameterError as error:
            found[f"{algorithm}/fused"] = str(error)
    found["excluded"] = {
        f"{algorithm}|{kinds}": reasons
        for (algorithm, kinds), reasons in optiplug.base.excluded_implementations().items()
    }
    return found


def nonfinite() -> dict[str, Any]:
    found: dict[str, Any] = {}
    rank = torch.distributed.get_rank()
    # a gradient that is infinite in rank 1's shard only: both ranks stop, nothing applied
    built = graph()
    before = full(built)
    batch = next(iter(built.epoch(0)))
    built.backward(loss_of(built, batch))
    if rank == 1:
        next(iter(built.parameters())).grad.to_local().view(-1)[0] = float("inf")
    try:
        built.step()
        found["stop"] = "no error"
    except GraphError as error:
        found["stop"] = str(error)
    found["stop_unchanged"] = all(
        torch.equal(p, q) for p, q in zip(before, full(built), strict=True)
    )
    found["stop_step"] = built.training_step
    # the same under "skip": both ranks skip it, then train on
    built = graph()
    built.set_nonfinite_policy("skip")
    batches = iter(built.epoch(0))
    batch = next(batches)
    built.backward(loss_of(built, batch))
    if rank == 1:
        next(iter(built.parameters())).grad.to_local().view(-1)[0] = float("nan")
    found["skip_stepped"] = built.step()
    found["skip_unchanged"] = all(
        torch.equal(p, q) for p, q in zip(before, full(built), strict=True)
    )
    built.backward(loss_of(built, next(batches)))
    found["skip_then_stepped"] = built.step()
    found["skip_counts"] = (built.skipped_steps, built.training_step)
    # accumulate 2: the first micro-batch's gradients are kept unsharded (no reduce-scatter),
    # the second's loss is NaN, so the whole accumulation is dropped, unsynced gradients too;
    # the next accumulation then equals one step on the second global batch alone
    built = graph(accumulate=2)
    built.set_nonfinite_policy("skip")
    batches = iter(built.epoch(0))
    built.backward(loss_of(built, next(batches)))
    found["unsynced_grad_is_none"] = all(p.grad is None for p in built.parameters())
    found["dropped_stepped"] = built.step()
    built.backward(loss_of(built, next(batches)) * float("nan"))
    found["dropped_skipped"] = not built.step()
    for _ in range(2):
        built.backward(loss_of(built, next(batches)))
        stepped = built.step()
    found["dropped_then_stepped"] = stepped
    found["dropped_params"] = full(built)
    return found


def memory() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for parallel in ("ddp", "fsdp"):
        built = graph(parallel=parallel)
        train(built, 1)
        report = optiplug.memory(built.optimizer)
        found[parallel] = {
            "total": built.optimizer_state_bytes(),
            "by_slot": dict(report.by_slot),
            "report_total": report.total,
        }
        found[f"{parallel}_wrapped"] = type(built.model).__name__
    return found


def bf16() -> dict[str, Any]:
    built = graph(precision="bf16")
    batch = next(iter(built.epoch(0)))
    logits = built.forward_batch(batch)
    built.backward(next_token_loss(logits, built.targets(batch)["targets"]))
    param = next(iter(built.parameters()))
    stepped = built.step()
    return {
        "output": str(logits.dtype),
        "param": str(param.dtype),
        "state": str(built.optimizer.state[param]["exp_avg"].dtype),
        "stepped": stepped,
    }


def fp16() -> dict[str, Any]:
    """fp16 under FSDP: the sharded loss scaler; its inf check is agreed across the ranks."""
    built = graph(precision="fp16")
    built.set_grad_clip(1.0)
    train(built, 2)
    return {
        "scaler": type(built.scaler).__name__,
        "scale": built.scaler.get_scale(),
        "steps": built.training_step,
        "params": full(built),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("rank", "world"):
        parser.add_argument(name, type=int)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{args.out / 'rendezvous'}",
        rank=args.rank,
        world_size=args.world,
        timeout=TIMEOUT,
    )
    results: dict[str, Any] = {}
    for algorithm, impl in IMPLS:
        built = graph(algorithm, impl)
        train(built, STEPS)
        results[f"train/{algorithm}/{impl}"] = full(built)
        results[f"units/{algorithm}/{impl}"] = unit_names(built.module)
    results["impl"] = impl_choices()
    built = graph(accumulate=2)
    train(built, STEPS)
    results["accumulate"] = full(built)
    built = graph()
    built.set_grad_clip(0.05)
    results["clip_norms"] = train(built, STEPS)
    results["clip"] = full(built)
    results["nonfinite"] = nonfinite()
    results[f"memory{args.rank}"] = memory()
    results["bf16"] = bf16()
    results["fp16"] = fp16()
    torch.save(results, args.out / f"results{args.rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written and the process group destroyed. Gloo's threads can
    # still hold tensors at interpreter finalization, which then aborts a finished
    # rank ("terminate called without an active exception"); leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""One rank of a 2-process gloo run of Graph(parallel="fsdp") with low-precision optimizer state.

Usage: ``python fsdp_state_precision_worker.py RANK WORLD OUT_DIR``, driven by
tests/test_fsdp_state_precision.py. The ranks meet through a file store in
OUT_DIR; rank 0 writes what the test checks to ``OUT_DIR/results0.pt`` (rank 1
to ``results1.pt``):

* ``train/<precision>``: the whole parameters after a few steps of AdamW on a
  float64 character transformer wide enough that its matrices (at least
  4,096 elements) keep int8, int4 or bf16 state, and what this rank's shard of
  one matrix's moments is stored as;
* ``memory/<precision>``: this rank's state bytes, by slot;
* ``resume``: the parameters after 2 + 2 steps straight through and after 2
  steps, a sharded save, a load into a fresh Graph and 2 more steps;
* ``cross``: the int8 checkpoint loaded into an fp32 Graph and an fp32 one
  into an int8 Graph (the slots' types and values);
* ``sizes``: the bytes of the sharded int8 and fp32 checkpoints;
* ``muon``: int8 Muon's parameters after 2 + 2 steps straight through and
  after a sharded save and load between them, and how this rank's shard of
  the matrix's momentum is stored (its codes' precision and factors' rank).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import optiplug
from optiplug_train.model import CharTransformer, next_token_loss

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_worker import Windows
from rank_processes import join_gloo, leave, worker_arguments

VOCAB, BLOCK, LAYERS, WIDTH, HEADS = 11, 8, 1, 64, 2
MIN_PARAMS = 1000
PER_RANK = 4  # windows per rank and step: the global batch is 8
LR = 1e-2
STEPS = 3
MATRIX = "blocks.0.fc.weight"  # 256 x 64: each rank's shard is 32 whole int8 blocks


def model() -> CharTransformer:
    """The seeded float64 model every scenario (and the single-process reference) starts from."""
    torch.manual_seed(0)
    built = CharTransformer(VOCAB, block_size=BLOCK, n_layer=LAYERS, d_model=WIDTH, n_head=HEADS)
    return built.double()


def graph(precision: str, parallel: str = "fsdp", optimizer: str = "adamw") -> optiplug.Graph:
    built = optiplug.Graph(model(), parallel=parallel, fsdp_min_params=MIN_PARAMS)
    if optimizer == "adamw":
        built.set_optimizer("adamw", impl="loop", lr=LR, state_precision=precision)
    else:
        built.set_optimizer(optimizer, state_precision=precision)
    built.set_data_loader(DataLoader(Windows(), batch_size=PER_RANK), forward_input="tokens")
    return built


def train(built: optiplug.Graph, steps: int) -> None:
    """Train until ``training_step == steps``, resuming the epoch where the Graph left it."""
    for batch in built.epoch(0):
        logits = built.forward_batch(batch)
        built.backward(next_token_loss(logits, built.targets(batch)["targets"]))
        built.step()
        if built.training_step >= steps:
            break


def full(built: optiplug.Graph) -> list[torch.Tensor]:
    """The whole parameters (every rank takes part in gathering them)."""
    return [p.full_tensor().detach().clone() for p in built.parameters()]


def slots(built: optiplug.Graph) -> dict[str, Any]:
    """How this rank stores the matrix's moments, and their decoded shard values."""
    param = dict(built.module.named_parameters())[MATRIX]
    found: dict[str, Any] = {"param": type(param).__name__}
    for key in ("exp_avg", "exp_avg_sq"):
        value = built.optimizer.state[param][key]
        local = value._local_tensor
        found[key] = {
            "outer": type(value).__name__,
            "local": type(local).__name__,
            "precision": getattr(local, "precision", "fp32"),
            "shape": tuple(value.shape),
            "local_shape": tuple(local.shape),
            "values": (local.dequantize() if hasattr(local, "dequantize") else local).clone(),
        }
    return found


def size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def resume(out: Path) -> dict[str, Any]:
    """2 + 2 steps straight through, and 2 steps, save, load into a fresh Graph, 2 steps."""
    straight = graph("int8")
    train(straight, 2)
    straight.save(out / "int8")
    before = slots(straight)
    train(straight, 4)
    resumed = graph("int8")
    resumed.load(out / "int8")
    loaded = slots(resumed)
    train(resumed, 4)
    return {
        "straight": full(straight),
        "resumed": full(resumed),
        "saved_slots": before,
        "loaded_slots": loaded,
        "steps": (straight.training_step, resumed.training_step),
    }


def muon(out: Path) -> dict[str, Any]:
    """int8 Muon: 2 + 2 steps straight through, and through a sharded save and load."""
    straight = graph("int8", optimizer="muon")
    train(straight, 2)
    straight.save(out / "muon-int8")
    param = dict(straight.module.named_parameters())[MATRIX]
    saved = straight.optimizer.state[param]["momentum_buffer"]._local_tensor.dequantize()
    train(straight, 4)
    resumed = graph("int8", optimizer="muon")
    resumed.load(out / "muon-int8")
    param = dict(resumed.module.named_parameters())[MATRIX]
    local = resumed.optimizer.state[param]["momentum_buffer"]._local_tensor
    stored = {
        "local": type(local).__name__,
        "precision": getattr(local, "precision", "fp32"),
        "rank": getattr(local, "rank", 0),
        "local_shape": tuple(local.shape),
    }
    train(resumed, 4)
    found = {"straight": full(straight), "resumed": full(resumed), "momentum": stored}
    return {**found, "saved": saved.clone()}


def cross(out: Path) -> dict[str, Any]:
    """The int8 checkpoint into an fp32 Graph, and an fp32 checkpoint into an int8 Graph."""
    wide = graph("fp32")
    wide.load(out / "int8")
    full_precision = graph("fp32")
    train(full_precision, 2)
    full_precision.save(out / "fp32")
    narrow = graph("int8")
    narrow.load(out / "fp32")
    return {
        "int8_into_fp32": slots(wide),
        "fp32_saved": slots(full_precision),
        "fp32_into_int8": slots(narrow),
    }


def main() -> int:
    rank, world, out = worker_arguments()
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    torch.set_num_threads(1)
    join_gloo(out, rank, world)
    results: dict[str, Any] = {}
    for precision in ("int8", "int4", "bf16"):
        built = graph(precision)
        train(built, STEPS)
        results[f"train/{precision}"] = full(built)
        results[f"slots/{precision}"] = slots(built)
        report = optiplug.memory(built.optimizer)
        results[f"memory/{precision}"] = {"total": report.total, "by_slot": dict(report.by_slot)}
    results["resume"] = resume(out)
    results["cross"] = cross(out)
    results["muon"] = muon(out)
    results["sizes"] = {name: size(out / name) for name in ("int8", "fp32")}
    torch.save(results, out / f"results{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    leave(main())

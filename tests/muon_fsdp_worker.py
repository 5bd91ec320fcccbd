"""One rank of a gloo FSDP2 run of muon and multi, driven by tests/test_muon_fsdp.py.

Usage: ``python muon_fsdp_worker.py RANK WORLD OUT_DIR [--muon-only]``. The
ranks meet through a file store in OUT_DIR (no TCP port to race for). Each
rank (with ``--muon-only``, steps 1, for muon only, and 2):

1. trains the same seeded GPT-style model, wrapped with FSDP2 (``fully_shard``
   per block, then the root) on a 1-D CPU mesh, with ``muon`` and then with
   ``multi`` (a muon route and an adamw route), on its share of each global
   batch; rank 0 saves the final full parameters, and every rank's step
   reports and routing tables, all-gathered, to ``OUT_DIR/results.json``;
2. steps a model whose hidden matrices are all one size, for the owners' balance;
3. steps a replicated (``Replicate()``) matrix and compares it with a plain one;
4. records the errors of placements Muon cannot step.

The test compares the parameters with single-process training on the whole
batches (same model, data and optimizer), built from this module's functions.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import optiplug
from optiplug_muon import Muon

TIMEOUT = datetime.timedelta(seconds=60)
STEPS = 5
VOCAB = 61  # rows of the embeddings and the head: uneven over 2 ranks (31 + 30)
CONTEXT = 16
BATCH = 4  # sequences in a global batch
MUON = {"lr": 0.02, "weight_decay": 0.01, "ns_dtype": "bfloat16", "aux_lr": 3e-3}
MULTI_MUON = {"lr": 0.02, "weight_decay": 0.01, "ns_dtype": "bfloat16", "aux_lr": 3e-3}
MULTI_ADAMW = {"lr": 3e-3, "weight_decay": 0.0}


class Block(nn.Module):
    """Pre-norm attention and MLP; optionally gated (a 3-row and a 1-row matrix)."""

    def __init__(self, d: int, heads: int, mlp: int, equal: bool) -> None:
        super().__init__()
        self.heads = heads
        self.equal = equal
        self.ln_1 = nn.LayerNorm(d)
        if equal:  # q, k, v, proj, fc, fc_out: six d x d matrices
            self.q = nn.Linear(d, d, bias=False)
            self.k = nn.Linear(d, d, bias=False)
            self.v = nn.Linear(d, d, bias=False)
        else:
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.head_gate = nn.Linear(d, heads, bias=False)  # 3 rows: 2 + 1 over 2 ranks
            self.mlp_gate = nn.Linear(d, 1, bias=False)  # 1 row: rank 1 holds none of it
        self.proj = nn.Linear(d, d, bias=False)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, mlp)
        self.fc_out = nn.Linear(mlp, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, d = x.shape
        h = self.ln_1(x)
        if self.equal:
            q, k, v = self.q(h), self.k(h), self.v(h)
        else:
            q, k, v = self.qkv(h).split(d, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if not self.equal:  # per-head sigmoid gate
            y = y * torch.sigmoid(self.head_gate(h)).transpose(1, 2).unsqueeze(-1)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, length, d))
        h = self.ln_2(x)
        mlp = self.fc_out(F.gelu(self.fc(h)))
        if not self.equal:
            mlp = mlp * torch.sigmoid(self.mlp_gate(h))
        return x + mlp


class GPT(nn.Module):
    """A small GPT: token and position embeddings, blocks, final norm, untied head."""

    def __init__(self, d: int, heads: int, mlp: int, blocks: int, equal: bool) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(CONTEXT, d)
        self.blocks = nn.ModuleList(Block(d, heads, mlp, equal) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt() -> GPT:
    """The trained model: d=33, 3 heads, MLP width 35, 3 blocks (every hidden matrix uneven)."""
    torch.manual_seed(0)
    return GPT(d=33, heads=3, mlp=35, blocks=3, equal=False)


def equal_gpt() -> GPT:
    """d=32, 2 blocks, every hidden matrix 32x32 (12 of them)."""
    torch.manual_seed(1)
    return GPT(d=32, heads=2, mlp=32, blocks=2, equal=True)


def batch(step: int) -> torch.Tensor:
    """The global batch of ``step``: ``BATCH`` sequences of ``CONTEXT + 1`` tokens."""
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randint(VOCAB, (BATCH, CONTEXT + 1), generator=generator)


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def hidden(name: str, param: torch.Tensor) -> bool:
    """multi's muon route: block matrices with 3 rows or more (by the global shape).

    Judged on a local shard, the 3-row head gate would have 2 rows on rank 0
    and 1 on rank 1, and the ranks would route it differently.
    """
    return name.startswith("blocks.") and param.ndim == 2 and param.shape[0] >= 3


def make_optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    """``muon`` (with its AdamW half) or ``multi`` (muon route + adamw route) over ``model``."""
    if kind == "muon":
        return optiplug.create("muon", model.named_parameters(), model=model, **MUON)
    # adamw's foreach kernel on both sides: left to choose, plain tensors get the fused
    # kernel and DTensors may not, and the two kernels round differently
    routes = [
        {"algorithm": "muon", "match": hidden, "name": "hidden", "use_muon": True, **MULTI_MUON},
        {"algorithm": "adamw", "match": "*", "impl": "foreach", **MULTI_ADAMW},
    ]
    return optiplug.create("multi", model.named_parameters(), model=model, routes=routes)


def muon_part(optimizer: torch.optim.Optimizer) -> Any:
    """The Muon optimizer inside ``optimizer`` (itself, or multi's ``hidden`` route)."""
    optimizers = getattr(optimizer, "optimizers", None)
    return optimizers["hidden"] if optimizers is not None else optimizer


def routing_rows(optimizer: torch.optim.Optimizer) -> list[list[Any]]:
    """(name, shape, algorithm, route) of every parameter, from ``optimizer.routing()``."""
    routing = optimizer.routing()  # type: ignore[attr-defined]
    return [[r.name, list(r.shape), r.algorithm, r.route] for r in routing]


def train(
    kind: str, model: nn.Module, steps: int, shard: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.optim.Optimizer, list[Any]]:
    """Train ``steps`` steps on each global batch's ``shard``; the optimizer and its reports."""
    optimizer = make_optimizer(kind, model)
    reports = []
    for step in range(steps):
        loss_of(model, shard(batch(step))).backward()
        optimizer.step()
        optimizer.zero_grad()
        reports.append(muon_part(optimizer).last_step_report())
    return optimizer, reports


def fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def gather(value: Any) -> list[Any]:
    """``value`` from every rank (``all_gather_object``), in rank order."""
    found: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(found, value)
    return found


def report_dict(report: Any) -> dict[str, Any]:
    return attrs.asdict(report)


def training_runs(
    mesh: Any, rank: int, world: int, out: Path, kinds: tuple[str, ...]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for kind in kinds:
        model = fsdp(gpt(), mesh)
        optimizer, reports = train(kind, model, STEPS, lambda b: b.chunk(world)[rank])
        full = {name: p.full_tensor() for name, p in model.named_parameters()}
        if rank == 0:
            torch.save(full, out / f"{kind}.pt")
        results[kind] = {
            "reports": gather([report_dict(r) for r in reports]),
            "routing": gather(routing_rows(optimizer)),
            "local_rows": gather({n: p.to_local().shape[0] for n, p in model.named_parameters()}),
        }
    return results


def balance_run(mesh: Any) -> list[Any]:
    model = fsdp(equal_gpt(), mesh)
    optimizer = make_optimizer("muon", model)
    loss_of(model, batch(0)).backward()
    optimizer.step()
    return gather(report_dict(optimizer.last_step_report()))  # type: ignore[attr-defined]


def replicated_run(mesh: Any) -> dict[str, Any]:
    """A ``Replicate()`` matrix steps locally, equal to the plain tensor's step, no collective."""
    generator = torch.Generator().manual_seed(7)
    weight, grad = torch.randn(12, 8, generator=generator), torch.randn(12, 8, generator=generator)
    replicated = nn.Parameter(distribute_tensor(weight.clone(), mesh, [Replicate()]))
    replicated.grad = distribute_tensor(grad.clone(), mesh, [Replicate()])
    plain = nn.Parameter(weight.clone())
    plain.grad = grad.clone()
    muon = optiplug.create("muon", [("mix.weight", replicated)], **MUON)
    reference = optiplug.create("muon", [("mix.weight", plain)], **MUON)
    muon.step()
    reference.step()
    return {
        "report": report_dict(muon.last_step_report()),  # type: ignore[attr-defined]
        "equal": torch.equal(replicated.to_local(), plain.detach()),  # type: ignore[attr-defined]
        "moved": not torch.equal(plain.detach(), weight),
    }


def error_of(build: Callable[[], Any]) -> dict[str, str] | None:
    """The type and message of what ``build`` raises, or None."""
    try:
        build()
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error), "mro": _bases(error)}
    return None


def _bases(error: Exception) -> str:
    return " ".join(cls.__name__ for cls in type(error).__mro__)


def error_runs(mesh: Any) -> dict[str, Any]:
    """What muon and multi raise for placements they cannot step."""

    def param(placements: list[Any], on: Any = mesh, shape: tuple[int, ...] = (8, 6)) -> Any:
        return nn.Parameter(distribute_tensor(torch.ones(shape), on, placements))

    mesh_2d = init_device_mesh("cpu", (1, torch.distributed.get_world_size()))
    partial = nn.Parameter(DTensor.from_local(torch.ones(4), mesh, [Partial()]))
    errors: dict[str, Any] = {
        "shard1_named": error_of(
            lambda: optiplug.create("muon", [("blocks.0.fc.weight", param([Shard(1)]))])
        ),
        "mesh_2d": error_of(
            lambda: optiplug.create(
                "muon", [("blocks.0.proj.weight", param([Replicate(), Shard(0)], mesh_2d))]
            )
        ),
        "partial_aux": error_of(lambda: optiplug.create("muon", [("ln.weight", partial)])),
        "multi_shard1": error_of(
            lambda: optiplug.create(
                "multi",
                [
                    ("blocks.1.qkv.weight", param([Shard(1)])),
                    ("ln.bias", param([Shard(0)], shape=(4,))),
                ],
                routes=[{"algorithm": "muon", "match": "blocks.*"}, {"algorithm": "adamw"}],
            )
        ),
    }
    with warnings.catch_warnings():  # unnamed parameters: the routing warning is expected
        warnings.simplefilter("ignore")
        errors["shard1_unnamed"] = error_of(
            lambda: Muon([param([Shard(0)], shape=(4, 6)), param([Shard(1)], shape=(10, 6))])
        )
    mismatched = param([Shard(0)])
    mismatched.grad = distribute_tensor(torch.ones(8, 6), mesh, [Replicate()])
    optimizer = optiplug.create("muon", [("blocks.0.proj.weight", mismatched)], **MUON)
    errors["grad_placement_at_step"] = error_of(optimizer.step)
    untouched = torch.equal(mismatched.to_local(), torch.ones_like(mismatched.to_local()))
    errors["untouched_after_step_error"] = untouched and not optimizer.state
    return errors


def main() -> int:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    muon_only = sys.argv[4:] == ["--muon-only"]
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{out / 'rendezvous'}",
        rank=rank,
        world_size=world,
        timeout=TIMEOUT,
    )
    mesh = init_device_mesh("cpu", (world,))
    results = training_runs(mesh, rank, world, out, ("muon",) if muon_only else ("muon", "multi"))
    results["balance"] = balance_run(mesh)
    if not muon_only:
        results["replicated"] = gather(replicated_run(mesh))
        results["errors"] = gather(error_runs(mesh))
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1))
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

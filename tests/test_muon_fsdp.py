"""Muon and multi on FSDP2 (DTensor) parameters: gloo processes (tests/muon_fsdp_worker.py).

Two spawns do all the distributed work: 2 ranks (muon and multi training,
balance, a replicated matrix, the errors) and 4 ranks (muon training and
balance only); the tests below check what they recorded. The single-process
tests at the end need no process group.
"""

from __future__ import annotations

import collections
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

import optiplug
from optiplug.errors import HyperparameterError
from optiplug_muon import Muon, StepReport, UnsupportedPlacementError
from optiplug_muon.newton_schulz import orthogonalize
from optiplug_muon.report import assign_owners, newton_schulz_cost, row_ranges

WORKER = Path(__file__).with_name("muon_fsdp_worker.py")
sys.path.insert(0, str(WORKER.parent))
import muon_fsdp_worker as worker  # noqa: E402
from rank_processes import run_ranks  # noqa: E402

WORLD = 2  # the full run; the 4-rank run trains muon only
needs_distributed = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed unavailable"
)


def spawn(world: int, out: Path, *extra: str) -> dict[str, Any]:
    """Run the worker on ``world`` ranks; its results.json, plus where its files are."""
    outcome = run_ranks(WORKER, world, [str(out), *extra], timeout=150)
    failures = [err[-4000:] for code, err in outcome if code != 0]
    assert not failures, "\n".join(failures)
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    results["out"] = out
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``runs(world)``: the worker's results on 2 ranks (everything) or 4 (muon only), run once."""
    done: dict[int, dict[str, Any]] = {}

    def get(world: int) -> dict[str, Any]:
        if world not in done:
            out = tmp_path_factory.mktemp(f"muon_fsdp_{world}")
            done[world] = spawn(world, out, *(() if world == WORLD else ("--muon-only",)))
        return done[world]

    return get


@pytest.fixture(scope="module")
def run(runs: Any) -> dict[str, Any]:
    """The 2-rank run."""
    result: dict[str, Any] = runs(WORLD)
    return result


@pytest.fixture(autouse=True)
def one_thread():
    """Single-threaded, as the worker runs: the same kernels, the same roundings."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference(
    kind: str, as_fsdp_reduces: bool, world: int = WORLD
) -> tuple[torch.optim.Optimizer, dict, list]:
    """Single-process training of the worker's model on each whole global batch.

    With ``as_fsdp_reduces`` the batch's mean gradient is computed as FSDP2
    computes it: the mean over each rank's share, then the average. On 2
    ranks, halving is exact in floating point and a sum of two numbers does
    not depend on their order, so these gradients equal the FSDP run's bit
    for bit. Otherwise one backward over the whole batch, whose sums are
    associated differently (equal to fp32 rounding).

    Returns:
        The optimizer, the final parameters by name, and per step and Muon
        matrix the entrywise error of bf16 Newton-Schulz against float64 on
        that step's direction.
    """
    model = worker.gpt()
    optimizer = worker.make_optimizer(kind, model)
    muon = worker.muon_part(optimizer)
    errors = []
    for step in range(worker.STEPS):
        tokens = worker.batch(step)
        if as_fsdp_reduces:
            for share in tokens.chunk(world):
                worker.loss_of(model, share).backward()
            for param in model.parameters():
                param.grad.mul_(1 / world)
        else:
            worker.loss_of(model, tokens).backward()
        errors.append(bf16_errors(muon))
        optimizer.step()
        optimizer.zero_grad()
    return optimizer, {n: p.detach() for n, p in model.named_parameters()}, errors


def bf16_errors(muon: Muon) -> dict[str, float]:
    """Per Muon matrix: max |NS_bf16(u) - NS_float64(u)| for the direction ``u`` it will step."""
    found = {}
    for group in muon.param_groups:
        if not group["use_muon"]:
            continue
        for name, param in zip(group["param_names"], group["params"], strict=True):
            buffer = muon.state[param].get("momentum_buffer", torch.zeros_like(param))
            buffer = buffer.lerp(param.grad, 1 - group["momentum"])
            direction = param.grad.lerp(buffer, group["momentum"])
            bf16 = orthogonalize(direction, dtype=torch.bfloat16).double()
            exact = orthogonalize(direction.double(), dtype=torch.float64)
            found[name] = float((bf16 - exact).abs().max())
    return found


def muon_matrices(optimizer: torch.optim.Optimizer) -> list[str]:
    return [row.name for row in optimizer.routing() if row.algorithm == "muon"]  # type: ignore[attr-defined]


def adjust(shape: list[int] | torch.Size) -> float:
    rows, cols = shape[0], math.prod(shape[1:])
    return math.sqrt(max(1.0, rows / cols))  # adjust_lr="original"


# --- the FSDP2 runs ------------------------------------------------------------------------


RUNS = [(2, "muon"), (2, "multi"), (4, "muon")]


@pytest.mark.parametrize(("world", "kind"), RUNS)
@pytest.mark.slow
@needs_distributed
def test_fsdp_training_equals_single_process_training(runs: Any, world: int, kind: str) -> None:
    run = runs(world)
    got = torch.load(run["out"] / f"{kind}.pt", weights_only=True)
    hparams = worker.MUON if kind == "muon" else worker.MULTI_MUON
    aux_lr = hparams["aux_lr"] if kind == "muon" else worker.MULTI_ADAMW["lr"]
    optimizer, want, _ = reference(kind, as_fsdp_reduces=True, world=world)
    _, full_batch, errors = reference(kind, as_fsdp_reduces=False)
    matrices = muon_matrices(optimizer)
    assert got.keys() == want.keys()
    for name, value in want.items():
        step_size = hparams["lr"] * adjust(value.shape) if name in matrices else aux_lr
        # Same gradients bit for bit (see reference()), so the same momentum, the same bf16
        # Newton-Schulz input and result (the owner runs the single-process kernel on the
        # whole matrix); only elementwise kernels run on shards instead of whole tensors,
        # where a vectorised body and a scalar tail may round one element differently.
        # Allowed: one bf16 rounding (2^-8) of every step's update, the bound the muon
        # tests use against torch.optim.Muon. Measured: equal, or a few fp32 ulps.
        # (On 4 ranks the reduction adds 4 terms in its own order: only the next check.)
        if world == 2:
            bound = worker.STEPS * step_size * 2**-8
            torch.testing.assert_close(got[name], value, rtol=0, atol=bound, msg=name)
        # Against one backward over the whole batch, the gradients differ by fp32
        # association, which bf16 Newton-Schulz may turn into a different rounding: each
        # run's orthogonalised update is within bf16 Newton-Schulz's own error e of the
        # exact one (e measured here, per step, against float64 on the reference's
        # direction), so the two differ by at most 2e per step, times the step size.
        # AdamW parameters see gradients perturbed by those matrices; Adam's update is a
        # ratio of moments, so its relative perturbation is bounded by the same 2e.
        worst = [max(step.values()) for step in errors]
        per_step = [step.get(name, worst[number]) for number, step in enumerate(errors)]
        bound = sum(2 * e * step_size for e in per_step)
        torch.testing.assert_close(got[name], full_batch[name], rtol=0, atol=bound, msg=name)


# rows each rank holds: uneven everywhere, and empty shards (1 row over 2 or 4 ranks,
# 3 rows over 4) that still get their share of the update
LOCAL_ROWS = {
    2: {
        "blocks.0.qkv.weight": [50, 49],
        "blocks.0.head_gate.weight": [2, 1],
        "blocks.0.mlp_gate.weight": [1, 0],
    },
    4: {
        "blocks.0.qkv.weight": [25, 25, 25, 24],
        "blocks.0.head_gate.weight": [1, 1, 1, 0],
        "blocks.0.mlp_gate.weight": [1, 0, 0, 0],
    },
}


@pytest.mark.parametrize(("world", "kind"), RUNS)
@pytest.mark.slow
@needs_distributed
def test_every_sharded_matrix_is_orthogonalised_exactly_once_per_step(
    runs: Any, world: int, kind: str
) -> None:
    run = runs(world)
    optimizer, _, _ = reference(kind, as_fsdp_reduces=True)
    matrices = muon_matrices(optimizer)
    aux = [row.name for row in optimizer.routing() if row.algorithm != "muon"]  # type: ignore[attr-defined]
    steps = run[kind]["reports"]
    assert len(steps) == world and all(len(r) == worker.STEPS for r in steps)
    for number in range(worker.STEPS):
        reports = [StepReport(**ranks[number]) for ranks in steps]
        assert [r.rank for r in reports] == list(range(world))
        # every rank sent its rows of every matrix; exactly one rank orthogonalised each
        counts = collections.Counter(n for r in reports for n in r.orthogonalized)
        assert counts == collections.Counter(matrices)
        for report in reports:
            assert sorted(report.sharded) == sorted(matrices)
            assert report.gathered == report.orthogonalized  # nothing orthogonalised locally
            assert report.replicated == ()
            assert report.collectives == 2  # one all-to-all there, one back
            # muon's AdamW half steps the rest (on local shards); under multi the muon
            # route holds matrices only and multi's adamw route steps the rest
            assert sorted(report.elementwise) == (sorted(aux) if kind == "muon" else [])
    local_rows = run[kind]["local_rows"]
    for name, rows in LOCAL_ROWS[world].items():
        assert [ranks[name] for ranks in local_rows] == rows, name


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.slow
@needs_distributed
def test_owners_balance_newton_schulz_work(runs: Any, world: int) -> None:
    run = runs(world)
    # 12 equal 32x32 matrices: the greedy rule gives each rank floor(12/world) or
    # ceil(12/world) of them; both are 12/world for 2 and 4 ranks, so max/min of the
    # per-rank cost is exactly 1.
    balance = [StepReport(**r) for r in run["balance"]]
    assert [r.newton_schulz_count for r in balance] == [12 // world] * world
    costs = [r.ns_cost for r in balance]
    assert costs == [12 // world * newton_schulz_cost(32, 32)] * world
    assert max(costs) / min(costs) == 1.0
    # The trained model's matrices differ in size; for the largest-first greedy rule
    # Graham's bound holds: max load <= total / world + (1 - 1/world) * largest cost.
    first = [StepReport(**ranks[0]) for ranks in run["muon"]["reports"]]
    shapes = {name: shape for name, shape, *_ in run["muon"]["routing"][0]}
    each = [newton_schulz_cost(shapes[n][0], shapes[n][1]) for n in first[0].sharded]
    total = sum(r.ns_cost for r in first)
    assert total == sum(each)
    assert max(r.ns_cost for r in first) <= total / world + (1 - 1 / world) * max(each)


@pytest.mark.slow
@needs_distributed
def test_routing_reports_global_shapes_on_fsdp_modules(run: dict) -> None:
    for kind in ("muon", "multi"):
        optimizer, _, _ = reference(kind, as_fsdp_reduces=True)
        want = [[r.name, list(r.shape), r.algorithm, r.route] for r in optimizer.routing()]  # type: ignore[attr-defined]
        # fully_shard keeps the names; shapes are DTensor.shape (global), so every rank
        # routes as the unsharded model does, though its shard of the 3-row head gate
        # has 2 rows on rank 0 and 1 on rank 1 (multi's rule takes >= 3 rows)
        assert run[kind]["routing"] == [want] * WORLD, kind
    rows = {name: route for name, _, _, route in run["multi"]["routing"][0]}
    assert rows["blocks.0.head_gate.weight"] == "hidden"
    assert rows["blocks.0.mlp_gate.weight"] == "adamw"


@pytest.mark.slow
@needs_distributed
def test_replicated_matrices_orthogonalise_locally_without_communication(run: dict) -> None:
    for rank, found in enumerate(run["replicated"]):
        report = StepReport(**found["report"])
        assert report.rank == rank
        assert report.orthogonalized == report.replicated == ("mix.weight",)
        assert report.gathered == report.sharded == ()
        assert report.collectives == 0
        # the same kernel on the same whole matrix as a plain tensor: bit for bit
        assert found["equal"] and found["moved"]


@pytest.mark.slow
@needs_distributed
@pytest.mark.parametrize(
    ("case", "parameter", "says"),
    [
        ("shard1_named", "'blocks.0.fc.weight'", "Shard(dim=1)"),
        ("shard1_unnamed", "'#1 (shape 10x6)'", "Shard(dim=1)"),
        ("mesh_2d", "'blocks.0.proj.weight'", "1-D mesh only"),
        ("partial_aux", "'ln.weight'", "Partial"),
        ("multi_shard1", "'blocks.1.qkv.weight'", "Shard(dim=1)"),
        ("grad_placement_at_step", "'blocks.0.proj.weight'", "its gradient"),
    ],
)
def test_unsupported_placements_raise_naming_the_parameter(
    run: dict, case: str, parameter: str, says: str
) -> None:
    for errors in run["errors"]:
        error = errors[case]
        assert error is not None, f"{case}: nothing raised"
        assert error["type"] == "UnsupportedPlacementError"
        assert "HyperparameterError" in error["mro"].split()
        assert f"invalid params={parameter}" in error["message"]
        assert says in error["message"]
        # refused at step: checked before anything is updated
        assert errors["untouched_after_step_error"] is True


# --- single process ------------------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.hidden = torch.nn.Linear(8, 6)
        self.other = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 10)


def test_report_on_ordinary_tensors() -> None:
    torch.manual_seed(0)
    net = Net()
    optimizer = optiplug.create("muon", net.named_parameters(), model=net)
    assert optimizer.last_step_report() is None
    for name, param in net.named_parameters():
        if name != "other.weight":  # no gradient: not stepped, not reported
            param.grad = torch.randn_like(param)
    before = net.hidden.weight.detach().clone()
    optimizer.step()
    report = optimizer.last_step_report()
    assert isinstance(report, StepReport)
    assert (report.rank, report.world) == (0, 1)
    assert report.orthogonalized == ("hidden.weight",)
    assert report.newton_schulz_count == 1
    assert report.gathered == report.replicated == report.sharded == ()
    assert set(report.elementwise) == {
        "embed.weight",
        "hidden.bias",
        "other.bias",
        "head.weight",
        "head.bias",
    }
    assert report.elementwise_count == 5
    assert report.ns_cost == 6 * 8 * 6
    assert report.collectives == 0
    assert not torch.equal(net.hidden.weight, before)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        report.ns_cost = 0  # type: ignore[misc]


def test_report_names_unnamed_parameters_by_index() -> None:
    matrices = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(3)]
    optimizer = Muon(matrices, use_muon=True)
    for param in matrices[1:]:
        param.grad = torch.randn_like(param)
    optimizer.step()
    report = optimizer.last_step_report()
    assert report is not None and report.orthogonalized == ("#1", "#2")


def test_owners_are_balanced_and_agree_everywhere() -> None:
    # equal costs: every rank gets floor(N/world) or ceil(N/world)
    for count, world in [(12, 2), (18, 4), (5, 3), (2, 4)]:
        owners = assign_owners([100] * count, world)
        per_rank = collections.Counter(owners)
        assert {per_rank.get(r, 0) for r in range(world)} <= {count // world, -(-count // world)}
    # unequal costs: Graham's bound for largest-first list scheduling
    generator = random.Random(0)
    for _ in range(50):
        world = generator.randint(1, 5)
        costs = [
            newton_schulz_cost(generator.randint(1, 64), generator.randint(1, 64))
            for _ in range(20)
        ]
        owners = assign_owners(costs, world)
        loads = [sum(c for c, o in zip(costs, owners, strict=True) if o == r) for r in range(world)]
        assert max(loads) <= sum(costs) / world + (1 - 1 / world) * max(costs)
        assert owners == assign_owners(list(costs), world)  # deterministic: ranks agree
    with pytest.raises(ValueError, match="world"):
        assign_owners([1], 0)


def test_row_ranges_follow_dtensor_chunking() -> None:
    for rows in range(0, 12):
        for world in range(1, 6):
            sizes = [len(c) for c in torch.arange(rows).chunk(world)] if rows else []
            sizes += [0] * (world - len(sizes))  # torch.chunk returns fewer chunks; DTensor pads
            spans = row_ranges(rows, world)
            assert [end - start for start, end in spans] == sizes
            assert spans[0][0] == 0 and spans[-1][1] == rows


def test_unsupported_placement_error_is_a_hyperparameter_error() -> None:
    error = UnsupportedPlacementError("blocks.0.fc.weight", "placed Shard(dim=1)")
    assert isinstance(error, HyperparameterError)
    assert error.parameter == "blocks.0.fc.weight"
    assert str(error) == "muon: invalid params='blocks.0.fc.weight': placed Shard(dim=1)."

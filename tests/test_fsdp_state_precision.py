"""Low-precision optimizer state on FSDP's sharded parameters (tests/fsdp_state_precision_worker.py).

Two gloo ranks train a float64 character transformer with AdamW in int8,
int4 and bf16 state under ``Graph(parallel="fsdp")``; each rank quantizes its
own shard (blocks within the shard). The matrices here have 64 columns and an
even number of rows, so each rank's shard is a whole number of blocks and its
blocks are exactly the blocks of the whole tensor: the sharded run must then
equal one process's int8 (or int4) run up to the gradients' summation order
(see ``ATOL`` in tests/test_fsdp.py), the codes being the same.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
from optiplug._state.codec import MIN_QUANTIZED_NUMEL, dynamic_table
from optiplug.base import LOW_RANK
from optiplug_train.model import next_token_loss

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.distributed.is_available(), reason="torch.distributed unavailable"
    ),
]

WORKER = Path(__file__).with_name("fsdp_state_precision_worker.py")
sys.path.insert(0, str(WORKER.parent))
import fsdp_state_precision_worker as worker  # noqa: E402
from rank_processes import run_ranks  # noqa: E402

ATOL = 1e-12  # tests/test_fsdp.py derives it: float64, 3 steps, summation order only


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("fsdp-state-precision")
    outcome = run_ranks(WORKER, 2, [str(out)], timeout=240)
    assert [code for code, _ in outcome] == [0, 0], outcome
    found = [torch.load(out / f"results{rank}.pt", weights_only=False) for rank in (0, 1)]
    return {"rank0": found[0], "rank1": found[1]}, out


def reference(precision: str, steps: int = worker.STEPS) -> optiplug.Graph:
    """The worker's training in one process on the global batches (8 windows each)."""
    graph = optiplug.Graph(worker.model())
    graph.set_optimizer("adamw", impl="loop", lr=worker.LR, state_precision=precision)
    rows = worker.Windows().rows  # the same windows as tests/fsdp_worker.py's
    for step in range(steps):
        batch = rows[8 * step : 8 * step + 8]
        graph.backward(next_token_loss(graph.module(batch[:, :-1]), batch[:, 1:]))
        assert graph.step()
    return graph


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_sharded_low_precision_training_equals_one_process(
    run: tuple[dict[str, Any], Path], precision: str
) -> None:
    results, _ = run
    expected = list(reference(precision).parameters())
    for rank in ("rank0", "rank1"):
        got = results[rank][f"train/{precision}"]
        for mine, theirs in zip(got, expected, strict=True):
            torch.testing.assert_close(mine, theirs.detach(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("precision", ["int8", "int4", "bf16"])
def test_each_rank_quantizes_its_own_shard(
    run: tuple[dict[str, Any], Path], precision: str
) -> None:
    results, _ = run
    for rank in ("rank0", "rank1"):
        slots = results[rank][f"slots/{precision}"]
        for key in ("exp_avg", "exp_avg_sq"):
            slot = slots[key]
            assert (slot["outer"], slot["local"], slot["precision"]) == (
                "DTensor",
                "QuantizedState",
                precision,
            )
            assert slot["shape"] == (256, 64) and slot["local_shape"] == (128, 64)


def _local_rows(rows: int, rank: int) -> int:
    """The rows of dimension 0 that FSDP's Shard(0) gives ``rank`` of 2 (torch.chunk's split)."""
    chunk = math.ceil(rows / 2)
    return max(0, min(chunk, rows - rank * chunk))


@pytest.mark.parametrize(("precision", "per_element"), [("int8", 1 + 4 / 256), ("int4", 0.5 + 4 / 128), ("bf16", 2)])  # fmt: skip
def test_memory_counts_each_ranks_codes_and_scales(
    run: tuple[dict[str, Any], Path], precision: str, per_element: float
) -> None:
    """A moment's bytes: its shard's codes and scales for matrices, float64 for the rest."""
    results, _ = run
    for index, rank in enumerate(("rank0", "rank1")):
        expected = 0
        for param in worker.model().parameters():
            local = _local_rows(param.shape[0], index) * math.prod(param.shape[1:])
            quantized = param.numel() >= MIN_QUANTIZED_NUMEL
            expected += math.ceil(local * per_element) if quantized else 8 * local
        by_slot = results[rank][f"memory/{precision}"]["by_slot"]
        assert by_slot["exp_avg"] == by_slot["exp_avg_sq"] == expected


def test_sharded_checkpoint_resumes_bit_equal(run: tuple[dict[str, Any], Path]) -> None:
    results, _ = run
    for rank in ("rank0", "rank1"):
        resume = results[rank]["resume"]
        assert resume["steps"] == (4, 4)
        for mine, theirs in zip(resume["resumed"], resume["straight"], strict=True):
            assert torch.equal(mine, theirs)
        for key in ("exp_avg", "exp_avg_sq"):
            loaded, saved = resume["loaded_slots"][key], resume["saved_slots"][key]
            assert loaded["local"] == "QuantizedState"
            assert torch.equal(loaded["values"], saved["values"])


def test_sharded_checkpoints_load_across_precisions(run: tuple[dict[str, Any], Path]) -> None:
    """int8 into fp32 decodes exactly; fp32 into int8 rounds within a table step."""
    results, _ = run
    table = dynamic_table(8, True)
    widest = max(b - a for a, b in itertools.pairwise(table))
    for rank in ("rank0", "rank1"):
        cross = results[rank]["cross"]
        for key in ("exp_avg", "exp_avg_sq"):
            wide = cross["int8_into_fp32"][key]
            assert wide["local"] == "Tensor"
            assert torch.equal(
                wide["values"], results[rank]["resume"]["saved_slots"][key]["values"]
            )
            narrow, source = cross["fp32_into_int8"][key], cross["fp32_saved"][key]["values"]
            assert narrow["local"] == "QuantizedState" and narrow["precision"] == "int8"
            blocks = source.reshape(-1, 256)
            bound = (blocks.abs().amax(dim=1, keepdim=True) * widest).expand_as(blocks)
            assert torch.all((narrow["values"].reshape(-1, 256) - blocks).abs() <= bound)


def test_a_sharded_int8_checkpoint_is_smaller(run: tuple[dict[str, Any], Path]) -> None:
    results, _ = run
    sizes = results["rank0"]["sizes"]
    assert sizes["int8"] < 0.65 * sizes["fp32"]


def test_a_sharded_int8_checkpoint_loads_into_one_process(
    run: tuple[dict[str, Any], Path],
) -> None:
    """Two ranks' shards, resharded into whole tensors, keep the same blocks and codes."""
    results, out = run
    graph = optiplug.Graph(worker.model())
    graph.set_optimizer("adamw", impl="loop", lr=worker.LR, state_precision="int8")
    graph.load(out / "int8")
    assert graph.training_step == 2
    param = dict(graph.module.named_parameters())[worker.MATRIX]
    for key in ("exp_avg", "exp_avg_sq"):
        slot = graph.optimizer.state[param][key]
        assert isinstance(slot, optiplug.base.QuantizedState) and slot.precision == "int8"
        shards = [
            results[rank]["resume"]["saved_slots"][key]["values"] for rank in ("rank0", "rank1")
        ]
        assert torch.equal(slot.dequantize(), torch.cat(shards))


def test_int8_muon_keeps_factors_per_shard_and_resumes_bit_equal(run: Any) -> None:
    """Each rank's shard of a Muon matrix (128 x 64 of 256 x 64) keeps its own rank-4
    factors beside its codes; the sharded checkpoint carries them, so the resumed run
    equals the uninterrupted one bit for bit."""
    results, _ = run
    for rank in ("rank0", "rank1"):
        found = results[rank]["muon"]
        stored = found["momentum"]
        assert stored["local"] == "QuantizedState" and stored["precision"] == "int8"
        assert stored["rank"] == LOW_RANK and stored["local_shape"] == (128, 64)
        for straight, resumed in zip(found["straight"], found["resumed"], strict=True):
            assert torch.equal(straight, resumed)


def test_a_sharded_muon_checkpoint_loads_into_one_process(
    run: tuple[dict[str, Any], Path],
) -> None:
    """Into one process no saved chunk is the whole matrix: the momentum is read decoded and
    encoded again with its own factors, so it is the saved one within half a step of the
    new residual's block maximum, never a stale or zero target."""
    results, out = run
    graph = optiplug.Graph(worker.model())
    graph.set_optimizer("muon", state_precision="int8")
    graph.load(out / "muon-int8")
    param = dict(graph.module.named_parameters())[worker.MATRIX]
    slot = graph.optimizer.state[param]["momentum_buffer"]
    assert isinstance(slot, optiplug.base.QuantizedState) and slot.rank == LOW_RANK
    saved = torch.cat([results[rank]["muon"]["saved"] for rank in ("rank0", "rank1")])
    assert saved.abs().max() > 0 and slot.shape == saved.shape
    # half a step of the residual's block maximum; the residual is the momentum less its
    # leading part, so a whole step of the momentum's maximum leaves it room
    step = float(saved.abs().max()) / 127
    assert float((slot.dequantize() - saved).abs().max()) <= step

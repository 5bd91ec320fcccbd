"""Sharded checkpoints (``checkpoint.save_sharded``/``load_sharded``) on FSDP2 and plain models.

The multi-process tests run tests/sharded_worker.py as gloo process groups on
the CPU: one 2-rank run does the resume, damaged-file, mismatch, NaN and
Graph checks; 4-rank and 1-rank runs reshard its checkpoint; a 2-rank run
loses a rank to SIGKILL mid-save, another loses rank 0 right after its
commit. The rest runs in this process, without
``torch.distributed``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
from optiplug import checkpoint
from optiplug.errors import CheckpointError, StateDictError

WORKER = Path(__file__).with_name("sharded_worker.py")
sys.path.insert(0, str(WORKER.parent))
import sharded_worker  # noqa: E402
from rank_processes import run_ranks  # noqa: E402

distributed = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed unavailable"
)


def run_scenario(
    scenario: str, world: int, out: Path, timeout: float = 120
) -> list[tuple[int | None, str]]:
    """Run ``scenario`` on ``world`` worker processes: ``(returncode, stderr)`` per rank."""
    # several ranks share few cores
    return run_ranks(WORKER, world, [str(out), scenario], timeout, env={"OMP_NUM_THREADS": "1"})


def results(out: Path, scenario: str, world: int) -> list[dict[str, Any]]:
    return [
        json.loads((out / f"{scenario}{world}-rank{rank}.json").read_text())
        for rank in range(world)
    ]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-rank ``main`` run: its checkpoint, damaged copies and each rank's findings."""
    out = tmp_path_factory.mktemp("sharded")
    outcome = run_scenario("main", 2, out)
    assert [code for code, _ in outcome] == [0, 0], outcome
    return out


def plain(seed: int = 4) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The worker's architecture, unsharded, with one step taken (state to overwrite)."""
    model = sharded_worker.build(seed)
    optimizer = sharded_worker.adamw(model)
    sharded_worker.train(model, optimizer, 0, 1, 0)
    return model, optimizer


def assert_same(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(found[key], value), key


# ------------------------------------------------------------------ several processes
@pytest.mark.slow
@distributed
def test_resume_from_sharded_checkpoint_equals_uninterrupted_run(two_ranks: Path) -> None:
    for rank in results(two_ranks, "main", 2):
        assert rank["info"] == {"world_size": 2, "algorithm": "adamw"}
        assert rank["extra"] == {"step": sharded_worker.SAVE_AT}
        # the loaded model and state equal the saved ones, whole; after 3 more
        # steps every parameter and moment shard equals the uninterrupted run's, bit for bit
        assert rank["loaded_equal"] is True
        assert rank["resume_equal"] is True


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("kind", ["flipped", "truncated", "missing"])
def test_damaged_shard_is_named_and_nothing_is_loaded_on_any_rank(
    two_ranks: Path, kind: str
) -> None:
    for rank in results(two_ranks, "main", 2):
        found = rank["damaged"][kind]
        assert found["type"] == "CheckpointError"
        assert found["file"] in found["message"]  # every rank names the damaged file
        assert "nothing was loaded" in found["message"]
        assert found["unchanged"] is True  # parameters and optimizer state, bit for bit
    words = {"flipped": "SHA-256", "truncated": "is truncated", "missing": "is missing"}
    assert words[kind] in found["message"]
    with pytest.raises(CheckpointError, match=words[kind]) as raised:  # verify agrees
        checkpoint.verify(two_ranks / kind)
    assert found["file"] in str(raised.value)


@pytest.mark.slow
@distributed
def test_checkpoint_of_another_shape_is_refused_whole_on_every_rank(two_ranks: Path) -> None:
    for rank in results(two_ranks, "main", 2):
        found = rank["damaged"]["architecture"]
        assert found["type"] == "StateDictError" and found["unchanged"] is True
        # every mismatch at once: model and optimizer state, by FQN
        assert "model.0.weight: shape: expected [12, 6], found [16, 6]" in found["message"]
        assert "optimizer.state.3.weight.exp_avg_sq: shape" in found["message"]


@pytest.mark.slow
@distributed
def test_nan_on_one_rank_refuses_the_save_on_every_rank(two_ranks: Path) -> None:
    for rank in results(two_ranks, "main", 2):
        found = rank["nan_save"]
        # rank 1 held the NaN; rank 0 reports it too, and nothing replaced the checkpoint
        assert found["type"] == "StateDictError"
        assert "parameter 0.weight, slot 'exp_avg': non-finite" in found["message"]
        assert found["checkpoint_kept"] is True


@pytest.mark.slow
@distributed
def test_graph_resumes_fsdp_training_bit_for_bit(two_ranks: Path) -> None:
    for rank in results(two_ranks, "main", 2):
        graph = rank["graph"]
        assert graph["position"] == [0, sharded_worker.SAVE_AT]  # saved mid-epoch
        assert graph["step"] == sharded_worker.STEPS
        assert graph["equal"] is True  # parameters and state shards, with dropout drawn per rank
        assert graph["lrs_equal"] is True
    assert checkpoint.verify(two_ranks / "graph").world_size == 2


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("world", [4, 1])
def test_reshard_two_ranks_to_other_world_sizes(two_ranks: Path, world: int) -> None:
    out = two_ranks
    outcome = run_scenario("reshard", world, out)
    assert [code for code, _ in outcome] == [0] * world, outcome
    found = results(out, "reshard", world)
    assert all(rank["extra"] == {"step": sharded_worker.SAVE_AT} for rank in found)
    if world == 4:  # the one-row last layer: ranks 1-3 hold empty shards of it
        assert [rank["local_rows"] for rank in found] == [1, 0, 0, 0]
    saved = torch.load(out / "saved.pt", weights_only=True)
    assert_same(torch.load(out / f"resharded{world}.pt", weights_only=True), saved)


@pytest.mark.slow
@distributed
def test_plain_single_process_model_loads_a_two_rank_checkpoint(two_ranks: Path) -> None:
    model, optimizer = plain()
    result = checkpoint.load_sharded(two_ranks / "ckpt", model, optimizer)
    assert result.extra == {"step": sharded_worker.SAVE_AT}
    assert result.info.world_size == 2
    saved = torch.load(two_ranks / "saved.pt", weights_only=True)
    assert_same(sharded_worker.full_values(model, optimizer), saved)


@pytest.mark.slow
@distributed
def test_plain_graph_resumes_from_a_sharded_graph_checkpoint(two_ranks: Path) -> None:
    graph = optiplug.Graph(sharded_worker.build(9, dropout=0.2))
    graph.set_optimizer("adamw", lr=1e-2, weight_decay=0.1)
    graph.load(two_ranks / "graph")
    assert graph.training_step == sharded_worker.SAVE_AT
    assert graph.data_position == (0, sharded_worker.SAVE_AT)
    assert graph.schedule is not None and graph.schedule.to_dict()["name"] == "cosine"


@pytest.mark.slow
@distributed
def test_killed_rank_fails_the_save_and_the_previous_checkpoint_survives(tmp_path: Path) -> None:
    started = time.monotonic()
    (code0, err0), (code1, _) = run_scenario("kill", 2, tmp_path, timeout=90)
    assert time.monotonic() - started < 80
    assert code1 == -9  # rank 1 was killed with its shards written
    assert code0 == 0, err0
    found = json.loads((tmp_path / "kill2-rank0.json").read_text())
    assert found["type"] == "CheckpointError"
    assert "nothing was committed" in found["message"]
    assert found["seconds"] < 60  # failed within the gloo timeout, did not hang
    assert found["leftovers"] == []  # rank 0 removed the staging directory
    info = checkpoint.verify(tmp_path / "good")
    assert info.extra == {"step": 2} and info.world_size == 2 and info.problems == ()
    assert info.steps == (2.0,)
    model, optimizer = plain()
    checkpoint.load_sharded(tmp_path / "good", model, optimizer)
    expected = torch.load(tmp_path / "good.pt", weights_only=True)
    assert_same(sharded_worker.full_values(model, optimizer), expected)


@pytest.mark.slow
@distributed
def test_a_survivor_of_rank_0_dying_after_the_commit_says_the_save_was_committed(
    tmp_path: Path,
) -> None:
    """Rank 0 is killed right after installing the new checkpoint: rank 1 says it is there."""
    (code0, _), (code1, err1) = run_scenario("kill0", 2, tmp_path, timeout=90)
    assert code0 == -9  # rank 0 was killed with the new checkpoint in place
    assert code1 == 0, err1
    found = json.loads((tmp_path / "kill02-rank1.json").read_text())
    info = checkpoint.verify(tmp_path / "good")
    assert info.extra == {"step": 4} and info.problems == ()
    assert info.checkpoint_id != found["previous"]
    message = found["message"]
    assert found["type"] == "CheckpointError"
    assert "nothing was committed" not in message, message
    assert "was committed" in message and info.checkpoint_id in message, message
    assert str(tmp_path / "good") in message


# ------------------------------------------------------------------ one process
def test_single_process_round_trip_and_verify(tmp_path: Path) -> None:
    model, optimizer = plain(0)
    info = checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer, epoch=1)
    assert info.world_size == 1 and info.algorithm == "adamw"
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        ".metadata",
        "COMMITTED",
        "__0_0.distcp",
        "manifest.json",
    ]
    verified = checkpoint.verify(tmp_path / "ckpt")
    assert verified.checkpoint_id == info.checkpoint_id and verified.problems == ()
    # 6 parameters and, for each, adamw's exp_avg, exp_avg_sq and step
    assert info.tensor_count == verified.tensor_count == 6 * 4
    assert verified.steps == (1.0,)  # read from the shards
    assert verified.tensor_bytes == sum(
        p.stat().st_size
        for p in (tmp_path / "ckpt").iterdir()
        if p.name not in ("COMMITTED", "manifest.json")
    )
    names = [p.name for p in verified.parameters]
    assert names == ["0.weight", "0.bias", "3.weight", "3.bias", "5.weight", "5.bias"]
    assert verified.parameters[0].shape == (16, 6)
    assert verified.parameters[0].slots == ("exp_avg", "exp_avg_sq", "step")
    expected = sharded_worker.full_values(model, optimizer)
    other, other_optimizer = plain(1)
    result = checkpoint.load_sharded(tmp_path / "ckpt", other, other_optimizer)
    assert result.extra == {"epoch": 1}
    assert_same(sharded_worker.full_values(other, other_optimizer), expected)


def test_unstepped_optimizer_round_trips_without_state(tmp_path: Path) -> None:
    model = sharded_worker.build(0)
    optimizer = sharded_worker.adamw(model)
    checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer)
    assert len(optimizer.state) == 0  # torch's lazy initialisation for the save was undone
    other, other_optimizer = plain(1)
    checkpoint.load_sharded(tmp_path / "ckpt", other, other_optimizer)
    assert len(other_optimizer.state) == 0
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters(), strict=True)
    )


def test_failed_load_leaves_an_unstepped_optimizer_without_state(tmp_path: Path) -> None:
    model, optimizer = plain(0)
    checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer)
    wide = sharded_worker.build(1, width=12)
    fresh = sharded_worker.adamw(wide)
    before = [p.detach().clone() for p in wide.parameters()]
    with pytest.raises(StateDictError, match=r"model\.0\.weight: shape"):
        checkpoint.load_sharded(tmp_path / "ckpt", wide, fresh)
    assert len(fresh.state) == 0
    assert all(torch.equal(p, q) for p, q in zip(before, wide.parameters(), strict=True))


def test_edited_manifest_and_unfinished_save_are_refused(tmp_path: Path) -> None:
    model, optimizer = plain(0)
    checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer)
    edited = tmp_path / "edited"
    shutil.copytree(tmp_path / "ckpt", edited)
    text = (edited / "manifest.json").read_text().replace('"world_size": 1', '"world_size": 2')
    (edited / "manifest.json").write_text(text)
    with pytest.raises(CheckpointError, match=r"manifest\.json does not match the commit marker"):
        checkpoint.verify(edited)
    (edited / "COMMITTED").unlink()
    with pytest.raises(CheckpointError, match="has no commit marker"):
        checkpoint.load_sharded(edited, model, optimizer)


def test_save_refuses_a_foreign_directory_and_bad_extra(tmp_path: Path) -> None:
    model, optimizer = plain(0)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="refusing to replace it"):
        checkpoint.save_sharded(tmp_path / "notes", model, optimizer)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("a file")
    with pytest.raises(CheckpointError, match="is not a checkpoint directory"):
        checkpoint.save_sharded(tmp_path / "file", model, optimizer)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer, when=object())
    assert not (tmp_path / "ckpt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "notes"]  # no staging left


def test_sharded_save_replaces_an_earlier_checkpoint_atomically(tmp_path: Path) -> None:
    model, optimizer = plain(0)
    first = checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer, n=1)
    sharded_worker.train(model, optimizer, 1, 2, 0)
    second = checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer, n=2)
    assert first.checkpoint_id != second.checkpoint_id
    assert checkpoint.verify(tmp_path / "ckpt").extra == {"n": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # the replaced one is gone


def test_checkpoint_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    model, optimizer = plain(0)
    checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer)
    other = sharded_worker.build(1)
    sgd = optiplug.create("sgd", other.named_parameters(), lr=0.1, momentum=0.9)
    sharded_worker.train(other, sgd, 0, 1, 0)
    before = sharded_worker.full_values(other, sgd)
    with pytest.raises(StateDictError, match="expected a checkpoint of sgd, found a checkpoint of"):
        checkpoint.load_sharded(tmp_path / "ckpt", other, sgd)
    assert_same(sharded_worker.full_values(other, sgd), before)


def test_graph_load_checks_its_record_before_touching_anything(tmp_path: Path) -> None:
    model, optimizer = plain(0)
    checkpoint.save_sharded(tmp_path / "ckpt", model, optimizer)  # no graph record
    graph = optiplug.Graph(sharded_worker.build(1))
    graph.set_optimizer("adamw", lr=1e-2, weight_decay=0.1)
    before = sharded_worker.full_values(graph.module, graph.optimizer)
    with pytest.raises(CheckpointError, match="not a Graph checkpoint"):
        graph.load(tmp_path / "ckpt")
    assert_same(sharded_worker.full_values(graph.module, graph.optimizer), before)
    assert len(graph.optimizer.state) == 0 and graph.training_step == 0

"""Checkpoints on disk: atomic saves, verified loads, torch-format exchange, ``optiplug check``."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as to_safetensors
from state_helpers import (
    ALGORITHMS,
    IMPLEMENTATIONS,
    Named,
    clone_named,
    forge_tensors,
    named_params,
    stored_tensors,
    train,
)

import optiplug
from optiplug import checkpoint, cli
from optiplug.errors import CheckpointError, StateDictError

TENSORS, METADATA, MARKER = "tensors.safetensors", "metadata.json", "COMMITTED"
FORMAT = "optiplug-checkpoint"


def state_tensors(optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return [
        (f"{i}.{k}", v.clone())
        for i, p in enumerate(params)
        for k, v in optimizer.state.get(p, {}).items()
    ]


def assert_same_state(optimizer: torch.optim.Optimizer, expected: list[tuple[str, Any]]) -> None:
    found = state_tensors(optimizer)
    assert [k for k, _ in found] == [k for k, _ in expected]
    for (key, a), (_, b) in zip(found, expected, strict=True):
        assert torch.equal(a, b) and a.dtype == b.dtype, key


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, torch.optim.Optimizer, Named]:
    named = named_params()
    optimizer = optiplug.create("adam", named, impl="loop", lr=0.01, amsgrad=True)
    train(optimizer, named, 0, 2)
    path = tmp_path / "ckpt"
    checkpoint.save(path, optimizer, epoch=2, note="two steps")
    return path, optimizer, named


def fresh_adam() -> torch.optim.Optimizer:
    optimizer = optiplug.create("adam", named_params(seed=5), impl="loop", lr=0.01, amsgrad=True)
    train(optimizer, [(n, p) for g in optimizer.param_groups for n, p in _pairs(g)], 0, 1)
    return optimizer


def _pairs(group: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    return list(zip(group["param_names"], group["params"], strict=True))


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("name, hparams", ALGORITHMS, ids=[a for a, _ in ALGORITHMS])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_resume_through_a_checkpoint_is_bit_exact(
    tmp_path: Path, name: str, hparams: dict, impl: str
) -> None:
    straight = named_params()
    uninterrupted = optiplug.create(name, straight, impl=impl, **hparams)
    train(uninterrupted, straight, 0, 6)
    first = named_params()
    before = optiplug.create(name, first, impl=impl, **hparams)
    train(before, first, 0, 3)
    checkpoint.save(tmp_path / "ckpt", before)
    second = clone_named(first)
    after = optiplug.create(name, second, impl=impl, **hparams)
    result = checkpoint.load(tmp_path / "ckpt", after)
    assert result.problems == () and result.info.implementation == impl
    train(after, second, 3, 6)
    for (n, p), (_, q) in zip(straight, second, strict=True):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("name, hparams", ALGORITHMS, ids=[a for a, _ in ALGORITHMS])
def test_torch_format_export_round_trips_and_loads_in_plain_torch(
    tmp_path: Path, name: str, hparams: dict
) -> None:
    named = named_params()
    optimizer = optiplug.create(name, named, impl="loop", **hparams)
    train(optimizer, named, 0, 3)
    checkpoint.export_torch(tmp_path / "opt.pt", optimizer)
    raw = torch.load(tmp_path / "opt.pt", weights_only=True)
    assert set(raw) == {"state", "param_groups"}
    twin = clone_named(named)
    imported = optiplug.create(name, twin, impl="loop", **hparams)
    assert checkpoint.import_torch(tmp_path / "opt.pt", imported) == []
    plain_params = clone_named(named)
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    plain = cls([p for _, p in plain_params], **hparams, foreach=False)
    plain.load_state_dict(raw)
    for opt, params in ((optimizer, named), (imported, twin), (plain, plain_params)):
        train(opt, params, 3, 5)
    for (_, p), (_, q), (_, r) in zip(named, twin, plain_params, strict=True):
        assert torch.equal(p, q) and torch.equal(p, r)


def test_import_torch_rejects_unreadable_files(tmp_path: Path) -> None:
    optimizer = fresh_adam()
    before = state_tensors(optimizer)
    with pytest.raises(CheckpointError, match="no torch state file"):
        checkpoint.import_torch(tmp_path / "missing.pt", optimizer)
    checkpoint.export_torch(tmp_path / "opt.pt", optimizer)
    data = (tmp_path / "opt.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable torch file"):
        checkpoint.import_torch(tmp_path / "cut.pt", optimizer)
    assert_same_state(optimizer, before)


def test_extra_data_comes_back_from_load_and_verify(saved) -> None:
    path, _, _ = saved
    assert checkpoint.verify(path).extra == {"epoch": 2, "note": "two steps"}
    assert checkpoint.load(path, fresh_adam()).extra == {"epoch": 2, "note": "two steps"}


def test_extra_data_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="JSON-serialisable"):
        checkpoint.save(tmp_path / "ckpt", fresh_adam(), tensor=torch.zeros(1))
    assert not list(tmp_path.iterdir())


def test_verify_describes_what_the_checkpoint_holds(saved) -> None:
    path, _, _ = saved
    info = checkpoint.verify(path)
    assert (info.algorithm, info.implementation, info.steps) == ("adam", "loop", (2.0,))
    assert info.plugin is not None and info.plugin.distribution == "optiplug-adam"
    assert info.versions["torch"] == torch.__version__
    assert [(p.name, p.shape, p.dtype) for p in info.parameters] == [
        ("w", (3, 2), "float32"),
        ("b", (3,), "float32"),
        ("v", (2,), "float32"),
    ]
    assert info.parameters[0].slots == ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    assert info.hyperparameters[0]["betas"] == (0.9, 0.999)
    assert info.sha256 == sha((path / TENSORS).read_bytes())
    assert info.problems == ()


def test_saving_over_a_checkpoint_replaces_it(saved) -> None:
    path, optimizer, named = saved
    first = checkpoint.verify(path).checkpoint_id
    train(optimizer, named, 2, 3)
    second = checkpoint.save(path, optimizer, epoch=3)
    assert checkpoint.verify(path).checkpoint_id == second.checkpoint_id != first
    assert checkpoint.verify(path).steps == (3.0,)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt"]


def test_saving_refuses_to_replace_other_files(tmp_path: Path) -> None:
    target = tmp_path / "results"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="refusing to replace"):
        checkpoint.save(target, fresh_adam())
    assert (target / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        checkpoint.save(tmp_path / "file", fresh_adam())


def test_checkpoint_of_another_algorithm_is_refused(saved) -> None:
    path, _, _ = saved
    sgd = optiplug.create("sgd", named_params(), momentum=0.9)
    with pytest.raises(StateDictError) as raised:
        checkpoint.load(path, sgd)
    kinds = {p.kind for p in raised.value.problems}
    assert {"algorithm", "foreign-state"} <= kinds
    assert "a checkpoint of adam" in str(raised.value)
    adamw = optiplug.create("adamw", named_params(), amsgrad=True)
    result = checkpoint.load(path, adamw, strict=False)
    assert {"algorithm", "hyperparameter-mismatch"} <= {p.kind for p in result.problems}
    assert adamw.param_groups[0]["decoupled_weight_decay"] is True


# ------------------------------------------------------------------ damaged files
def forge(
    path: Path,
    *,
    tensors: bytes | None = None,
    edit: Callable[[dict], None] | None = None,
    raw_metadata: bytes | None = None,
) -> None:
    """Rewrite a checkpoint consistently (hashes and sizes updated), as an attacker could."""
    metadata = json.loads((path / METADATA).read_text())
    if tensors is not None:
        (path / TENSORS).write_bytes(tensors)
        metadata["tensors"].update(sha256=sha(tensors), bytes=len(tensors))
    if edit is not None:
        edit(metadata)
    text = raw_metadata if raw_metadata is not None else json.dumps(metadata).encode()
    (path / METADATA).write_bytes(text)
    marker = json.loads((path / MARKER).read_text())
    marker["metadata_sha256"] = sha(text)
    (path / MARKER).write_text(json.dumps(marker))


def _truncate(path: Path) -> None:
    data = (path / TENSORS).read_bytes()
    (path / TENSORS).write_bytes(data[: len(data) // 2])


def _append(path: Path) -> None:
    with open(path / TENSORS, "ab") as handle:
        handle.write(b"\0" * 16)


def _flip_last_byte(path: Path) -> None:
    data = bytearray((path / TENSORS).read_bytes())
    data[-1] ^= 0x01
    (path / TENSORS).write_bytes(bytes(data))


def _from_another_save(path: Path) -> None:
    other = path.parent / "other"
    optimizer = fresh_adam()
    checkpoint.save(other, optimizer)
    (path / TENSORS).write_bytes((other / TENSORS).read_bytes())


def _gigabyte_header(path: Path) -> None:
    data = bytearray((path / TENSORS).read_bytes())
    data[:8] = struct.pack("<Q", 5_000_000_000)
    forge(path, tensors=bytes(data))


def _overlapping_tensors(path: Path) -> None:
    data = (path / TENSORS).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    names = sorted(k for k in header if k != "__metadata__")
    header[names[1]]["data_offsets"] = header[names[0]]["data_offsets"]
    text = json.dumps(header).encode()
    forge(path, tensors=struct.pack("<Q", len(text)) + text + data[8 + size :])


def _metadata_edit(path: Path) -> None:
    metadata = json.loads((path / METADATA).read_text())
    metadata["param_groups"][0]["hyperparameters"]["lr"] = 10.0
    (path / METADATA).write_text(json.dumps(metadata))


def _future_schema(path: Path) -> None:
    forge(path, edit=lambda m: m.update(schema_version=99))


def _undecodable_value(path: Path) -> None:
    forge(path, edit=lambda m: m["param_groups"][0]["hyperparameters"].update(lr={"pickle": "x"}))


@attrs.frozen
class Damage:
    id: str
    apply: Callable[[Path], Any]
    message: str


DAMAGES = [
    Damage("truncated-tensor-file", _truncate, "is truncated"),
    Damage("appended-tensor-file", _append, "longer than saved"),
    Damage("flipped-byte", _flip_last_byte, "is corrupt: SHA-256"),
    Damage("tensor-file-from-another-save", _from_another_save, "belongs to checkpoint"),
    Damage("missing-marker", lambda p: (p / MARKER).unlink(), "no commit marker"),
    Damage("garbage-marker", lambda p: (p / MARKER).write_text("{"), "not valid JSON"),
    Damage("missing-tensor-file", lambda p: (p / TENSORS).unlink(), "cannot read tensor file"),
    Damage("missing-metadata", lambda p: (p / METADATA).unlink(), "cannot read metadata"),
    Damage("edited-metadata", _metadata_edit, "does not match the commit marker"),
    Damage("header-claims-gigabytes", _gigabyte_header, "claims 5000000000 header bytes"),
    Damage("overlapping-tensors", _overlapping_tensors, "corrupt safetensors header at tensor"),
    Damage("schema-from-the-future", _future_schema, "newer than this optiplug reads"),
    Damage("metadata-not-json", lambda p: forge(p, raw_metadata=b"\xff{"), "not valid JSON"),
    Damage("undecodable-value", _undecodable_value, "undecodable value"),
    Damage("directory-removed", lambda p: os.rename(p, p.with_name("gone")), "does not exist"),
]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.id)
def test_damaged_checkpoints_are_refused_before_the_optimizer_is_touched(saved, damage) -> None:
    path, _, _ = saved
    damage.apply(path)
    optimizer = fresh_adam()
    before = state_tensors(optimizer)
    lr = optimizer.param_groups[0]["lr"]
    with pytest.raises(CheckpointError, match=damage.message):
        checkpoint.load(path, optimizer)
    with pytest.raises(CheckpointError, match=damage.message):
        checkpoint.verify(path)
    assert_same_state(optimizer, before)
    assert optimizer.param_groups[0]["lr"] == lr


# ------------------------------------------------------------------ crash safety
_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import torch, optiplug
    from optiplug import checkpoint

    path, mode, block_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    params = [torch.nn.Parameter(torch.ones(256, 256) * i) for i in range(6)]
    optimizer = optiplug.create("adam", params, impl="loop", lr=0.01)

    def step():
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer.step()

    step()
    step()
    if mode == "block":
        real, calls = os.fsync, [0]

        def fsync(descriptor):
            real(descriptor)
            calls[0] += 1
            if calls[0] == block_at:
                print("blocked", flush=True)
                time.sleep(600)

        os.fsync = fsync
        checkpoint.save(path, optimizer)
        print("finished", flush=True)
    else:
        checkpoint.save(path, optimizer)
        print("saving", flush=True)
        while True:
            step()
            checkpoint.save(path, optimizer)
    """
)


def _big_adam() -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.ones(256, 256) * i) for i in range(6)]
    optimizer = optiplug.create("adam", params, impl="loop", lr=0.01)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    return optimizer


def _wait_for_line(process: subprocess.Popen, timeout: float = 120.0) -> str:
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    ready = selector.select(timeout)
    selector.close()
    line = process.stdout.readline() if ready else ""
    if not line:
        process.kill()
        raise AssertionError(f"child printed nothing: {process.stderr.read()}")
    return line.strip()


def _spawn(path: Path, mode: str, block_at: int = 0) -> subprocess.Popen:
    args = [sys.executable, "-c", _CHILD, str(path), mode, str(block_at)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    process.stdout.close()
    process.stderr.close()


@pytest.mark.slow
def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    """SIGKILL a child saving over a checkpoint: after the tensor file, after the
    commit marker, before the rename (blocked in fsync), then at a random moment
    of a save loop."""
    previous = _big_adam()
    expected = state_tensors(previous)
    blocked = {}
    for block_at in (1, 3, 4):
        path = tmp_path / f"block{block_at}" / "ckpt"
        checkpoint.save(path, previous)
        blocked[path] = _spawn(path, "block", block_at)
    for path, process in blocked.items():
        assert _wait_for_line(process) == "blocked"
        _kill(process)
        _assert_recoverable(path, expected)
    path = tmp_path / "loop" / "ckpt"
    checkpoint.save(path, previous)
    process = _spawn(path, "loop")
    assert _wait_for_line(process) == "saving"
    time.sleep(0.3)
    _kill(process)
    _assert_recoverable(path, None)
    for path in [*blocked, tmp_path / "loop" / "ckpt"]:
        checkpoint.save(path, previous)  # the next save sweeps the dead save's temporaries
        assert [p.name for p in path.parent.iterdir()] == ["ckpt"]


def _assert_recoverable(path: Path, expected: list | None) -> None:
    info = checkpoint.verify(path)
    assert info.problems == ()
    optimizer = _big_adam()
    checkpoint.load(path, optimizer)
    if expected is not None:
        assert_same_state(optimizer, expected)
    for leftover in path.parent.iterdir():
        if leftover == path:
            continue
        assert leftover.name.startswith(".ckpt.tmp-")
        try:
            checkpoint.verify(leftover)
        except CheckpointError as error:
            assert "no commit marker" in str(error)
        else:
            checkpoint.load(leftover, _big_adam())  # complete: the marker was written


# ------------------------------------------------------------------ optiplug check
def test_check_reports_a_good_checkpoint(saved, capsys) -> None:
    path, _, _ = saved
    assert cli.main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: OK" in out
    assert "algorithm    adam (implementation loop" in out
    assert "parameters   3 in 1 group(s), 11 elements" in out
    assert "steps        2" in out
    assert "extra        epoch, note" in out
    assert "w     0      [3, 2]  float32  step, exp_avg, exp_avg_sq, max_exp_avg_sq" in out


@pytest.mark.parametrize(
    "damage, message",
    [(_truncate, "is truncated"), (_flip_last_byte, "is corrupt: SHA-256")],
    ids=["truncated", "tampered"],
)
def test_check_reports_a_damaged_checkpoint(saved, capsys, damage, message) -> None:
    path, _, _ = saved
    damage(path)
    assert cli.main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: INVALID checkpoint" in out and message in out


def _negative_exp_avg_sq(path: Path) -> None:
    """Rewrite parameter 0's exp_avg_sq as -1 (save refuses such state; an old writer might not)."""
    tensors = safetensors_load((path / TENSORS).read_bytes())
    tensors["state.0.exp_avg_sq"] = torch.full_like(tensors["state.0.exp_avg_sq"], -1.0)
    owner = json.loads((path / MARKER).read_text())["checkpoint_id"]
    forge(
        path, tensors=to_safetensors(tensors, metadata={"format": FORMAT, "checkpoint_id": owner})
    )


def test_check_reports_invalid_state_in_an_intact_checkpoint(tmp_path: Path, capsys) -> None:
    checkpoint.save(tmp_path / "ckpt", fresh_adam())
    _negative_exp_avg_sq(tmp_path / "ckpt")
    assert cli.main(["check", str(tmp_path / "ckpt")]) == 1
    out = capsys.readouterr().out
    assert "INVALID state (1 problem(s))" in out
    assert "parameter w, slot 'exp_avg_sq': negative" in out


@pytest.mark.slow
def test_check_runs_as_a_command(saved) -> None:
    path, _, _ = saved
    good = subprocess.run(
        [sys.executable, "-m", "optiplug", "check", str(path)], capture_output=True, text=True
    )
    assert good.returncode == 0 and f"{path}: OK" in good.stdout
    _truncate(path)
    bad = subprocess.run(
        [sys.executable, "-m", "optiplug", "check", str(path)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "is truncated" in bad.stdout


def test_failed_loads_leave_the_optimizer_as_it_was(saved) -> None:
    path, _, _ = saved
    optimizer = optiplug.create("adam", named_params(), impl="loop", amsgrad=False)
    train(optimizer, [(n, p) for n, p in _pairs(optimizer.param_groups[0])], 0, 1)
    before = state_tensors(optimizer)
    groups = copy.deepcopy(
        [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    )
    with pytest.raises(StateDictError, match="amsgrad"):
        checkpoint.load(path, optimizer)
    assert_same_state(optimizer, before)
    assert [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] == groups


PORTABLE_CHILD = """
import os, sys, tempfile
for flag in ("O_NOFOLLOW", "O_NONBLOCK", "O_DIRECTORY"):  # as on Windows
    delattr(os, flag)
import torch, optiplug
from optiplug import checkpoint
model = torch.nn.Linear(3, 2)
optimizer = optiplug.create("sgd", model.named_parameters(), lr=0.1, momentum=0.9)
model(torch.ones(1, 3)).sum().backward()
optimizer.step()
folder = os.path.join(tempfile.mkdtemp(), "run")
checkpoint.save(folder, optimizer)
fresh = optiplug.create("sgd", model.named_parameters(), lr=0.1, momentum=0.9)
checkpoint.load(folder, fresh)
print(sorted(fresh.state_dict()["state"]) == sorted(optimizer.state_dict()["state"]))
"""


def test_checkpoints_import_save_and_load_where_the_os_lacks_posix_open_flags() -> None:
    from conftest import run_python

    done = run_python(PORTABLE_CHILD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"


# ------------------------------------------------------------------ memory layout
def test_a_state_tensor_keeps_its_strides_through_a_checkpoint(tmp_path: Path) -> None:
    """A column-major state tensor comes back column-major, not row-major.

    safetensors stores tensors contiguous; a matrix product over the reloaded
    row-major copy took another kernel path than over the original, so
    SPlus's resume (its eigenbasis is ``torch.linalg.eigh``'s column-major
    output) differed from the uninterrupted run in the last bits.
    """
    named = named_params()
    optimizer = optiplug.create("adam", named, impl="loop", lr=0.01)
    train(optimizer, named, 0, 1)
    weight = dict(named)["w"]
    column_major = optimizer.state[weight]["exp_avg"].t().contiguous().t()
    optimizer.state[weight]["exp_avg"] = column_major
    assert not column_major.is_contiguous()
    checkpoint.save(tmp_path / "ckpt", optimizer)
    metadata = json.loads((tmp_path / "ckpt" / METADATA).read_text())
    assert {"strided"} <= {next(iter(v)) for e in metadata["state"].values() for v in e.values()}
    fresh = optiplug.create("adam", clone_named(named), impl="loop", lr=0.01)
    checkpoint.load(tmp_path / "ckpt", fresh)
    loaded = fresh.state[dict(_pairs(fresh.param_groups[0]))["w"]]["exp_avg"]
    assert loaded.stride() == column_major.stride() and torch.equal(loaded, column_major)
    # every other tensor is stored and reloaded as before: contiguous
    assert all(
        v.is_contiguous() for s in fresh.state.values() for k, v in s.items() if v is not loaded
    )


# ------------------------------------------------------------------ one validator
def _nan_moments(optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A load pre-hook (torch's API) that breaks the state: every second moment NaN."""
    del optimizer
    state = {
        key: {**slots, "exp_avg_sq": torch.full_like(slots["exp_avg_sq"], float("nan"))}
        for key, slots in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


def test_save_refuses_a_state_load_refuses_with_the_same_problems(tmp_path: Path) -> None:
    """A NaN second moment, stored as load reads it: save and load refuse it alike.

    The load side is a checkpoint forged to hold it (hashes updated), so only
    the state checks can refuse it; the save side is the optimizer holding it.
    """
    named = named_params()
    optimizer = optiplug.create("adam", named, impl="loop", lr=0.01)
    train(optimizer, named, 0, 2)
    checkpoint.save(tmp_path / "good", optimizer)
    tensors = stored_tensors(tmp_path / "good")
    forged = {
        k: torch.full_like(v, float("nan")) if "exp_avg_sq" in k else v for k, v in tensors.items()
    }
    forge_tensors(tmp_path / "good", forged)
    fresh = optiplug.create("adam", clone_named(named), impl="loop", lr=0.01)
    with pytest.raises(StateDictError) as loading:
        checkpoint.load(tmp_path / "good", fresh)
    for slots in optimizer.state.values():
        slots["exp_avg_sq"].fill_(float("nan"))
    with pytest.raises(StateDictError) as saving:
        checkpoint.save(tmp_path / "refused", optimizer)
    assert saving.value.problems == loading.value.problems != ()
    assert not (tmp_path / "refused").exists()


def test_save_refuses_what_the_optimizers_load_pre_hooks_make_of_its_state(
    tmp_path: Path,
) -> None:
    """Load runs the optimizer's load pre-hooks before validating; save validates the same.

    Save validated the state as ``state_dict()`` returned it and wrote it;
    load, through the hook, refused it: a checkpoint that could not be loaded.
    """
    named = named_params()
    optimizer = optiplug.create("adam", named, impl="loop", lr=0.01)
    train(optimizer, named, 0, 2)
    checkpoint.save(tmp_path / "good", optimizer)
    fresh = optiplug.create("adam", clone_named(named), impl="loop", lr=0.01)
    fresh.register_load_state_dict_pre_hook(_nan_moments)
    with pytest.raises(StateDictError) as loading:
        checkpoint.load(tmp_path / "good", fresh)
    optimizer.register_load_state_dict_pre_hook(_nan_moments)
    with pytest.raises(StateDictError) as saving:
        checkpoint.save(tmp_path / "refused", optimizer)
    assert saving.value.problems == loading.value.problems != ()
    assert "refusing to save" in str(saving.value) and not (tmp_path / "refused").exists()
    assert optiplug.validate_state_dict(optimizer, optimizer.state_dict()) == list(
        saving.value.problems
    )

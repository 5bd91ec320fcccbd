"""Regression tests for the checkpoint fault campaign: defects 1, 2, 6, 7, 8, 13 and 17.

Each test names what it proves. Everything is real: checkpoints written by
:func:`optiplug.checkpoint.save` and then damaged on disk, FIFOs, symbolic
links, a writer in another process, file-size limits set with
``resource.setrlimit`` in a child interpreter, ``/dev/full`` for a genuine
ENOSPC, and an immutable (``chattr +i``) or read-only directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from state_helpers import named_params, train

import optiplug
from optiplug import checkpoint, cli
from optiplug._checkpoint.io import publish_directory
from optiplug.errors import CheckpointError, StateDictError

TENSORS, METADATA, MARKER = "tensors.safetensors", "metadata.json", "COMMITTED"
FILES = (TENSORS, METADATA, MARKER)

# ------------------------------------------------------------------ helpers


def make_adam(seed: int = 0, steps: int = 2) -> torch.optim.Optimizer:
    """A named Adam (amsgrad) over w, b, v after ``steps`` deterministic steps."""
    named = named_params(seed=seed)
    optimizer = optiplug.create("adam", named, impl="loop", lr=0.01, amsgrad=True)
    train(optimizer, named, 0, steps)
    return optimizer


def state_of(optimizer: torch.optim.Optimizer) -> list[tuple[str, Any]]:
    """Every state value and hyperparameter, copied, in a stable order."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    found: list[tuple[str, Any]] = []
    for i, param in enumerate(params):
        for key, value in optimizer.state.get(param, {}).items():
            found.append((f"{i}.{key}", value.clone() if torch.is_tensor(value) else value))
    for i, group in enumerate(optimizer.param_groups):
        found += [(f"group{i}.{k}", v) for k, v in group.items() if k != "params"]
    return found


def assert_unchanged(optimizer: torch.optim.Optimizer, before: list[tuple[str, Any]]) -> None:
    """``optimizer`` holds exactly ``before`` (bit for bit)."""
    after = state_of(optimizer)
    assert [k for k, _ in after] == [k for k, _ in before]
    for (key, a), (_, b) in zip(after, before, strict=True):
        if torch.is_tensor(a):
            assert a.dtype == b.dtype and torch.equal(a, b), key
        else:
            assert a == b, key


def file_bytes(path: Path) -> dict[str, bytes]:
    """The bytes of each checkpoint file."""
    return {name: (path / name).read_bytes() for name in FILES}


def sha(data: bytes) -> str:
    """Hex SHA-256."""
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A valid checkpoint of :func:`make_adam` with one extra tensor and extra data."""
    path = tmp_path / "ckpt"
    checkpoint.save(path, make_adam(), tensors={"rng": torch.arange(4)}, epoch=2)
    return path


def run_check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``optiplug check PATH`` in this process: exit status, stdout, stderr."""
    status = cli.main(["check", str(path)])
    out, err = capsys.readouterr()
    return status, out, err


# ------------------------------------------------------------------ defect 1


def _poison(optimizer: torch.optim.Optimizer, value: float) -> None:
    """One step on a batch whose gradients are ``value`` (NaN or Inf)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.full_like(param, value)
    optimizer.step()


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_save_refuses_non_finite_state_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, value: float
) -> None:
    optimizer = make_adam()
    path = tmp_path / "ckpt"
    checkpoint.save(path, optimizer, epoch=2)
    before = file_bytes(path)
    _poison(optimizer, value)
    with pytest.raises((CheckpointError, StateDictError)) as raised:
        checkpoint.save(path, optimizer, epoch=3)
    assert "non-finite" in str(raised.value) and str(path) in str(raised.value)
    if isinstance(raised.value, StateDictError):
        assert {p.kind for p in raised.value.problems} == {"non-finite"}
    assert file_bytes(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert checkpoint.verify(path).problems == ()


# ------------------------------------------------------------------ defect 2


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _stale(parent: Path, name: str, committed: bool) -> Path:
    """A directory ``name`` in ``parent``: a full checkpoint, or one without its marker."""
    entry = parent / name
    checkpoint.save(entry, make_adam(seed=3))
    if not committed:
        (entry / MARKER).unlink()
    return entry


def _stale_cases() -> list[tuple[str, bool, bool]]:
    """(name template, holds a commit marker, a later save removes it).

    Only exact staging names of this host's dead saves go: an uncommitted one
    before the save, a committed one (a complete but superseded checkpoint)
    once the save has put a newer checkpoint in place.
    """
    return [
        (".run.tmp-{host}-999999-keep", True, False),
        (".run.tmp-{host}-999999-keep", False, False),
        (".run.tmp-{host}-{dead}-abcd1234", True, True),
        (".run.tmp-{host}-{dead}-abcd1234.bak", False, False),
        (".run.tmp-{host}-{dead}-abcd1234-x", False, False),
        (".run.tmp-{host}x-{dead}-abcd1234", False, False),
        (".run.tmp-other{host}-{dead}-abcd1234", False, False),
        (".run.tmp-{host}-{alive}-abcd1234", False, False),
        (".run.tmp-{host}-{dead}-abcd1234", False, True),
        (".run.tmp-{host}-{dead}-x_9z0q1w", False, True),
    ]


def test_stale_staging_cleanup_removes_only_dead_uncommitted_temporaries(tmp_path: Path) -> None:
    host, dead, alive = socket.gethostname(), _dead_pid(), os.getpid()
    entries = {}
    for index, (template, committed, removed) in enumerate(_stale_cases()):
        parent = tmp_path / f"case{index}"
        parent.mkdir()
        name = template.format(host=host, dead=dead, alive=alive)
        entries[index] = (_stale(parent, name, committed), removed)
    link = tmp_path / "case0" / f".run.tmp-{host}-{dead}-qwerty12"
    link.symlink_to(entries[1][0])
    for index, (entry, removed) in entries.items():
        checkpoint.save(entry.parent / "run", make_adam())
        assert entry.exists() != removed, (index, entry.name)
    assert link.is_symlink()


# ------------------------------------------------------------------ defect 6

_WRITER = textwrap.dedent(
    """
    import sys, time
    import torch, optiplug
    from optiplug import checkpoint

    path, seconds = sys.argv[1], float(sys.argv[2])
    params = [torch.nn.Parameter(torch.ones(64, 64) * i) for i in range(4)]
    optimizer = optiplug.create("adam", params, impl="loop", lr=0.01)
    end, saves = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer.step()
        checkpoint.save(path, optimizer, saves=saves)
        saves += 1
        if saves == 1:
            print("saving", flush=True)
    print(saves, flush=True)
    """
)


def _writer_adam() -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros(64, 64)) for _ in range(4)]
    return optiplug.create("adam", params, impl="loop", lr=0.01)


def test_loading_while_another_process_saves_never_fails(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    command = [sys.executable, "-c", _WRITER, str(path), "4"]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "saving"
    failures, rounds = [], 0
    while writer.poll() is None and rounds < 400:
        try:
            assert checkpoint.verify(path).problems == ()
            checkpoint.load(path, _writer_adam())
        except (CheckpointError, StateDictError) as error:
            failures.append(str(error))
        rounds += 1
    saves = int(writer.stdout.read().strip() or 0)
    assert writer.wait(timeout=60) == 0
    assert rounds >= 20 and saves >= 20, (rounds, saves)
    assert failures == [], f"{len(failures)} of {rounds}: {failures[:3]}"


# ------------------------------------------------------------------ defect 7


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _link_out(path: Path) -> None:
    outside = path.parent.parent / f"outside-{path.name}"
    shutil.copyfile(path, outside)
    path.unlink()
    path.symlink_to(outside)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _link_to_dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


SPECIAL = [
    (MARKER, _fifo),
    (METADATA, _fifo),
    (TENSORS, _fifo),
    (METADATA, _link_out),
    (MARKER, _link_out),
    (TENSORS, _link_out),
    (METADATA, _directory),
    (MARKER, _link_to_dev_zero),
]


def _release(fifos: list[Path]) -> None:
    """Unblock a reader stuck opening one of ``fifos`` (gives it end-of-file)."""
    for fifo in fifos:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _within(seconds: float, fifos: list[Path], call: Callable[[], Any]) -> Any:
    """``call()``'s result or raised error, failing the test if it blocks."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:
            outcome["value"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _release(fifos)
        thread.join(seconds)
        pytest.fail(f"blocked for {seconds} s reading a special file")
    return outcome["value"]


@pytest.mark.parametrize(
    "name, make", SPECIAL, ids=[f"{n}-{m.__name__.strip('_')}" for n, m in SPECIAL]
)
def test_special_files_in_a_checkpoint_are_refused_without_blocking(
    saved: Path, capsys: pytest.CaptureFixture[str], name: str, make: Callable[[Path], None]
) -> None:
    make(saved / name)
    fifos = [saved / n for n in FILES if (saved / n).is_fifo()]
    optimizer = make_adam(seed=5, steps=1)
    before = state_of(optimizer)
    for call in (lambda: checkpoint.verify(saved), lambda: checkpoint.load(saved, optimizer)):
        error = _within(10, fifos, call)
        assert isinstance(error, CheckpointError), error
        assert str(saved / name) in str(error)
    assert_unchanged(optimizer, before)
    status, out, err = _within(10, fifos, lambda: run_check(saved, capsys))
    assert status == 1 and name in out and "Traceback" not in out + err


# ------------------------------------------------------------------ defects 8 and 17


def forge(
    path: Path, edit: Callable[[dict[str, Any]], Any] | None = None, text: bytes = b""
) -> None:
    """Rewrite metadata.json as an attacker could, the marker's hash updated to match."""
    if edit is not None:
        metadata = json.loads((path / METADATA).read_text())
        edit(metadata)
        text = json.dumps(metadata).encode()
    (path / METADATA).write_bytes(text)
    marker = json.loads((path / MARKER).read_text())
    marker["metadata_sha256"] = sha(text)
    (path / MARKER).write_text(json.dumps(marker))


def forge_raw(path: Path, pattern: str, replacement: str) -> None:
    """Substitute text in metadata.json (for what ``json.dumps`` cannot write), rehashed."""
    text = (path / METADATA).read_text()
    changed = re.sub(pattern, replacement, text, count=1)
    assert changed != text, pattern
    forge(path, text=changed.encode())


def forge_tensors(path: Path, data: bytes) -> None:
    """Replace the tensor file, with the metadata's size and hash updated to match."""
    (path / TENSORS).write_bytes(data)
    forge(path, lambda m: m["tensors"].update(sha256=sha(data), bytes=len(data)))


def write_marker(path: Path, text: str) -> None:
    """Replace COMMITTED (not hash-protected) with ``text``."""
    (path / MARKER).write_text(text)


def marker_sub(path: Path, pattern: str, replacement: str) -> None:
    """Substitute text in COMMITTED."""
    text = (path / MARKER).read_text()
    changed = re.sub(pattern, replacement, text, count=1)
    assert changed != text, pattern
    write_marker(path, changed)


def marker_with(path: Path, extra: str) -> None:
    """The real marker with ``extra`` JSON members added before its own."""
    real = (path / MARKER).read_text()
    write_marker(path, "{" + extra + ", " + real.lstrip("{"))


def header_with(path: Path, extra: str) -> None:
    """The tensor file's safetensors header with ``extra`` JSON members prepended."""
    data = (path / TENSORS).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = b"{" + extra.encode() + b", " + data[9 : 8 + size]
    forge_tensors(path, struct.pack("<Q", len(header)) + header + data[8 + size :])


DEEP = "[" * 30_000 + "]" * 30_000
HUGE = "9" * 5000


def _group(m: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any] = m["param_groups"][0]
    return group


def _record(m: dict[str, Any], index: int = 0) -> dict[str, Any]:
    record: dict[str, Any] = m["parameters"][index]
    return record


@attrs.frozen
class Crafted:
    """A crafted checkpoint: ``apply`` rewrites a valid one; ``file`` is the one to blame."""

    id: str
    file: str
    apply: Callable[[Path], Any]


CRAFTED = [
    # COMMITTED (not hash-protected)
    Crafted("marker-30k-deep", MARKER, lambda p: marker_with(p, f'"x": {DEEP}')),
    Crafted("marker-5000-digits", MARKER, lambda p: marker_with(p, f'"x": {HUGE}')),
    Crafted("marker-a-list", MARKER, lambda p: write_marker(p, "[1, 2]")),
    Crafted(
        "marker-hash-an-int",
        MARKER,
        lambda p: marker_sub(p, r'"metadata_sha256": "\w+"', '"metadata_sha256": 5'),
    ),
    Crafted(
        "marker-hash-nan",
        MARKER,
        lambda p: marker_sub(p, r'"metadata_sha256": "\w+"', '"metadata_sha256": NaN'),
    ),
    Crafted(
        "marker-id-a-list",
        MARKER,
        lambda p: marker_sub(p, r'"checkpoint_id": "\w+"', '"checkpoint_id": ["x"]'),
    ),
    Crafted("marker-duplicate-keys", MARKER, lambda p: marker_with(p, '"format": "evil"')),
    Crafted("marker-not-utf8", MARKER, lambda p: (p / MARKER).write_bytes(b'{"\xff": 1}')),
    Crafted("marker-empty", MARKER, lambda p: write_marker(p, "")),
    # metadata.json (rehashed: only the schema can catch these)
    Crafted(
        "metadata-30k-deep",
        METADATA,
        lambda p: forge_raw(p, r'"extra": \{', f'"extra": {{"x": {DEEP}, '),
    ),
    Crafted(
        "metadata-5000-digits", METADATA, lambda p: forge_raw(p, r'"epoch": 2', f'"epoch": {HUGE}')
    ),
    Crafted("metadata-a-list", METADATA, lambda p: forge(p, text=b"[]")),
    Crafted(
        "param-names-5", METADATA, lambda p: forge(p, lambda m: _group(m).update(param_names=5))
    ),
    Crafted(
        "param-names-wrong-length",
        METADATA,
        lambda p: forge(p, lambda m: _group(m).update(param_names=["w"])),
    ),
    Crafted(
        "state-key-superscript",
        METADATA,
        lambda p: forge(p, lambda m: m["state"].update({"²": m["state"].pop("0")})),
    ),
    Crafted(
        "state-key-padded",
        METADATA,
        lambda p: forge(p, lambda m: m["state"].update({" 0": m["state"].pop("0")})),
    ),
    Crafted(
        "params-nested-lists",
        METADATA,
        lambda p: forge(p, lambda m: _group(m).update(params=[[0], [1], [2]])),
    ),
    Crafted(
        "negative-ids",
        METADATA,
        lambda p: forge(
            p,
            lambda m: (
                _group(m).update(params=[-1, 1, 2]),
                m["state"].update({"-1": m["state"].pop("0")}),
            ),
        ),
    ),
    Crafted(
        "params-a-string", METADATA, lambda p: forge(p, lambda m: _group(m).update(params="012"))
    ),
    Crafted(
        "dtype-Tensor", METADATA, lambda p: forge(p, lambda m: _record(m).update(dtype="Tensor"))
    ),
    Crafted("dtype-an-int", METADATA, lambda p: forge(p, lambda m: _record(m).update(dtype=7))),
    Crafted(
        "missing-extra-tensor",
        METADATA,
        lambda p: forge(p, lambda m: m["extra_tensors"].update(gone={"tensor": "gone"})),
    ),
    Crafted(
        "extra-tensors-a-string",
        METADATA,
        lambda p: forge(p, lambda m: m.update(extra_tensors="rng")),
    ),
    Crafted("parameters-a-dict", METADATA, lambda p: forge(p, lambda m: m.update(parameters={}))),
    Crafted(
        "parameter-a-string",
        METADATA,
        lambda p: forge(p, lambda m: m["parameters"].__setitem__(0, "w")),
    ),
    Crafted("parameter-dropped", METADATA, lambda p: forge(p, lambda m: m["parameters"].pop())),
    Crafted(
        "parameter-indices-swapped",
        METADATA,
        lambda p: forge(
            p, lambda m: (_record(m, 0).update(index=1), _record(m, 1).update(index=0))
        ),
    ),
    Crafted(
        "parameter-in-a-missing-group",
        METADATA,
        lambda p: forge(p, lambda m: _record(m).update(group=3)),
    ),
    Crafted(
        "parameter-name-differs",
        METADATA,
        lambda p: forge(p, lambda m: _record(m).update(name="q")),
    ),
    Crafted(
        "shape-huge", METADATA, lambda p: forge(p, lambda m: _record(m).update(shape=[10**30, 2]))
    ),
    Crafted(
        "shape-negative", METADATA, lambda p: forge(p, lambda m: _record(m).update(shape=[-3, 2]))
    ),
    Crafted(
        "shape-a-float", METADATA, lambda p: forge(p, lambda m: _record(m).update(shape=[3.0, 2]))
    ),
    Crafted(
        "hyperparameters-a-list",
        METADATA,
        lambda p: forge(p, lambda m: _group(m).update(hyperparameters=[])),
    ),
    Crafted(
        "hyperparameter-huge-int",
        METADATA,
        lambda p: forge(p, lambda m: _group(m)["hyperparameters"].update(lr=10**400)),
    ),
    Crafted(
        "hyperparameter-unknown-tag",
        METADATA,
        lambda p: forge(p, lambda m: _group(m)["hyperparameters"].update(lr={"set": [1]})),
    ),
    Crafted(
        "state-entry-a-list", METADATA, lambda p: forge(p, lambda m: m["state"].update({"0": []}))
    ),
    Crafted(
        "state-step-huge-int",
        METADATA,
        lambda p: forge(p, lambda m: m["state"]["0"].update(step=10**400)),
    ),
    Crafted(
        "state-names-a-missing-tensor",
        METADATA,
        lambda p: forge(p, lambda m: m["state"]["0"].update(step={"tensor": "nope"})),
    ),
    Crafted(
        "schema-version-nan",
        METADATA,
        lambda p: forge_raw(p, r'"schema_version": 1', '"schema_version": NaN'),
    ),
    Crafted(
        "schema-version-true", METADATA, lambda p: forge(p, lambda m: m.update(schema_version=True))
    ),
    Crafted(
        "bytes-infinity", METADATA, lambda p: forge_raw(p, r'"bytes": \d+', '"bytes": Infinity')
    ),
    Crafted(
        "count-a-string", METADATA, lambda p: forge(p, lambda m: m["tensors"].update(count="3"))
    ),
    Crafted("versions-a-list", METADATA, lambda p: forge(p, lambda m: m.update(versions=["2.0"]))),
    Crafted(
        "duplicate-keys",
        METADATA,
        lambda p: forge_raw(p, r'"algorithm": "adam"', '"algorithm": "sgd", "algorithm": "adam"'),
    ),
    Crafted("extra-a-string", METADATA, lambda p: forge(p, lambda m: m.update(extra="x"))),
    Crafted(
        "group-a-string",
        METADATA,
        lambda p: forge(p, lambda m: m["param_groups"].__setitem__(0, "g")),
    ),
    # tensors.safetensors (rehashed)
    Crafted("header-30k-deep", TENSORS, lambda p: header_with(p, f'"x": {DEEP}')),
    Crafted("header-duplicate-keys", TENSORS, lambda p: header_with(p, '"__metadata__": {}')),
    Crafted("header-5000-digits", TENSORS, lambda p: header_with(p, f'"x": {HUGE}')),
]


@pytest.mark.parametrize("case", CRAFTED, ids=lambda c: c.id)
def test_crafted_checkpoints_are_a_checkpoint_error_naming_the_file(
    saved: Path, capsys: pytest.CaptureFixture[str], case: Crafted
) -> None:
    case.apply(saved)
    optimizer = make_adam(seed=5, steps=1)
    before = state_of(optimizer)
    with pytest.raises(CheckpointError, match=re.escape(str(saved / case.file))):
        checkpoint.verify(saved)
    with pytest.raises(CheckpointError, match=re.escape(str(saved / case.file))):
        checkpoint.load(saved, optimizer)
    assert_unchanged(optimizer, before)
    status, out, err = run_check(saved, capsys)
    assert status == 1 and "Traceback" not in out + err, (out, err)
    assert len(out.strip().splitlines()) == 1 and "INVALID" in out and case.file in out


def _rewrite_exp_avg(path: Path, value: float) -> None:
    tensors = safetensors_load((path / TENSORS).read_bytes())
    tensors["state.0.exp_avg"] = torch.full_like(tensors["state.0.exp_avg"], value)
    header = {
        "format": "optiplug-checkpoint",
        "checkpoint_id": checkpoint.verify(path).checkpoint_id,
    }
    data = safetensors_save(tensors, metadata=header)
    forge_tensors(path, data)


STATE_LEVEL = [
    Crafted(
        "recorded-shape-differs",
        METADATA,
        lambda p: forge(p, lambda m: _record(m).update(shape=[9, 9])),
    ),
    Crafted(
        "recorded-dtype-differs",
        METADATA,
        lambda p: forge(p, lambda m: _record(m).update(dtype="float64")),
    ),
    Crafted("lr-nan", METADATA, lambda p: forge_raw(p, r'"lr": [0-9.e-]+', '"lr": NaN')),
    Crafted(
        "lr-negative",
        METADATA,
        lambda p: forge(p, lambda m: _group(m)["hyperparameters"].update(lr=-1.0)),
    ),
    Crafted(
        "orphan-state",
        METADATA,
        lambda p: forge(p, lambda m: m["state"].update({"7": m["state"]["0"]})),
    ),
    Crafted(
        "duplicate-ids", METADATA, lambda p: forge(p, lambda m: _group(m).update(params=[0, 0, 2]))
    ),
    Crafted("exp-avg-nan", TENSORS, lambda p: _rewrite_exp_avg(p, float("nan"))),
    Crafted("intact", "", lambda p: None),
]


def _verdict(call: Callable[[], Any]) -> str:
    """``"refused"`` when ``call`` raises a typed error or reports problems, else ``"ok"``."""
    try:
        result = call()
    except (CheckpointError, StateDictError):
        return "refused"
    problems = getattr(result, "problems", ())
    return "refused" if problems else "ok"


@pytest.mark.parametrize("case", CRAFTED + STATE_LEVEL, ids=lambda c: c.id)
def test_check_and_load_reach_the_same_verdict(saved: Path, case: Crafted) -> None:
    case.apply(saved)
    optimizer = make_adam(seed=5, steps=1)
    verified = _verdict(lambda: checkpoint.verify(saved))
    loaded = _verdict(lambda: checkpoint.load(saved, optimizer))
    assert verified == loaded, (verified, loaded)
    assert verified == ("ok" if case.id == "intact" else "refused")


# ------------------------------------------------------------------ defect 13

_FULL_DISK = textwrap.dedent(
    """
    import json, resource, sys
    import torch, optiplug
    from optiplug import checkpoint
    from optiplug.errors import OptiplugError

    path, write = sys.argv[1], getattr(checkpoint, sys.argv[2])  # save or export_torch
    params = [torch.nn.Parameter(torch.ones(256, 256)) for _ in range(2)]
    optimizer = optiplug.create("adam", params, impl="loop", lr=0.01)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        write(path, optimizer)
    except BaseException as error:
        print(json.dumps([type(error).__name__, str(error), isinstance(error, OptiplugError)]))
    else:
        print(json.dumps(["saved", "", False]))
    """
)


def _write_past_the_file_size_limit(path: Path, function: str) -> str:
    """Run ``checkpoint.<function>`` to ``path`` in a child under a 64 KiB file-size limit.

    Asserts it raised a typed ``CheckpointError``; returns its message.
    """
    child = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(path), function],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    kind, message, typed = json.loads(child.stdout)
    assert (kind, typed) == ("CheckpointError", True), message
    return str(message)


def test_save_past_the_file_size_limit_is_a_checkpoint_error_keeping_the_previous(
    saved: Path,
) -> None:
    before = file_bytes(saved)
    message = _write_past_the_file_size_limit(saved, "save")
    assert "file too large" in message.lower() and str(saved) in message
    assert file_bytes(saved) == before
    assert [p.name for p in saved.parent.iterdir()] == ["ckpt"]


def _fill_dev_full(directory: Path) -> None:
    (directory / TENSORS).write_bytes(b"partial")
    with open("/dev/full", "wb") as device:
        device.write(b"\0" * 4096)
        device.flush()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full for a real ENOSPC")
def test_no_space_left_while_publishing_is_a_checkpoint_error_and_leaves_nothing(
    saved: Path,
) -> None:
    before = file_bytes(saved)
    with pytest.raises(CheckpointError, match="no space left on device") as raised:
        publish_directory(saved, _fill_dev_full, FILES, marker=MARKER)
    assert str(saved) in str(raised.value)
    assert isinstance(raised.value.__cause__, OSError)
    assert raised.value.__cause__.errno == errno.ENOSPC
    assert file_bytes(saved) == before
    assert [p.name for p in saved.parent.iterdir()] == ["ckpt"]


def _freeze(directory: Path) -> Callable[[], None]:
    """Make ``directory`` refuse new entries for this process; returns the undo."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return lambda: directory.chmod(0o755)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(directory)]).returncode != 0:
        pytest.skip("running as root without chattr +i: no way to make a directory read-only")

    def undo() -> None:
        subprocess.run([chattr, "-i", str(directory)], check=True)

    return undo


@pytest.fixture
def frozen_parent(saved: Path) -> Iterator[Path]:
    """``saved``, in a directory where nothing can be created or renamed."""
    undo = _freeze(saved.parent)
    try:
        yield saved
    finally:
        undo()


def test_save_into_a_read_only_directory_is_a_checkpoint_error_keeping_the_previous(
    frozen_parent: Path,
) -> None:
    before = file_bytes(frozen_parent)
    with pytest.raises(CheckpointError) as raised:
        checkpoint.save(frozen_parent, make_adam(seed=7))
    message = str(raised.value)
    assert str(frozen_parent) in message
    assert "operation not permitted" in message.lower() or "permission denied" in message.lower()
    assert file_bytes(frozen_parent) == before
    assert [p.name for p in frozen_parent.parent.iterdir()] == ["ckpt"]


def test_save_under_a_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    with pytest.raises(CheckpointError, match="plain"):
        checkpoint.save(tmp_path / "plain" / "ckpt", make_adam())
    with pytest.raises(CheckpointError, match="plain"):
        checkpoint.export_torch(tmp_path / "plain" / "opt.pt", make_adam())


NAMES = ["c" * 240, "d" * 255, "é" * 120, "ckpt-" + "0" * 200 + ".final"]


@pytest.mark.parametrize("name", NAMES, ids=["240-bytes", "255-bytes", "240-bytes-utf8", "dotted"])
def test_long_checkpoint_names_save_and_replace(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    first = checkpoint.save(path, make_adam())
    second = checkpoint.save(path, make_adam(steps=3))
    assert checkpoint.verify(path).checkpoint_id == second.checkpoint_id != first.checkpoint_id
    checkpoint.export_torch(tmp_path / (name[:-3] + ".pt"), make_adam())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, name[:-3] + ".pt"])


# ------------------------------------------------------------------ sharded manifest


@pytest.fixture
def sharded(tmp_path: Path) -> tuple[Path, torch.nn.Module, torch.optim.Optimizer]:
    """A sharded checkpoint saved in this process, with its model and optimizer."""
    model = torch.nn.Linear(4, 3)
    optimizer = optiplug.create("adamw", list(model.named_parameters()), lr=0.01)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    path = tmp_path / "sharded"
    checkpoint.save_sharded(path, model, optimizer)
    return path, model, optimizer


def test_a_missing_manifest_is_named_by_verify_check_and_load_alike(
    sharded: tuple[Path, torch.nn.Module, torch.optim.Optimizer],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without ``manifest.json`` every reader names the manifest, not the commit marker."""
    path, model, optimizer = sharded
    (path / "manifest.json").unlink()
    manifest = str(path / "manifest.json")
    with pytest.raises(CheckpointError) as verified:
        checkpoint.verify(path)
    with pytest.raises(CheckpointError) as loaded:
        checkpoint.load_sharded(path, model, optimizer)
    status, out, err = run_check(path, capsys)
    for message in (str(verified.value), str(loaded.value), out + err):
        assert manifest in message and "no such file" in message.lower(), message
        assert "not an optiplug commit marker" not in message, message
    assert status != 0
    graph = optiplug.Graph(model)
    graph.set_optimizer("adamw", lr=0.01)
    with pytest.raises(CheckpointError, match=re.escape(manifest)):
        graph.load(path)


# ------------------------------------------------------------------ export_torch on a full disk


def test_export_torch_past_the_file_size_limit_is_a_checkpoint_error_keeping_the_previous(
    tmp_path: Path,
) -> None:
    """As for ``save``: a write the file system refuses is a CheckpointError, no file half-written."""
    path = tmp_path / "opt.pt"
    checkpoint.export_torch(path, make_adam())
    before = path.read_bytes()
    message = _write_past_the_file_size_limit(path, "export_torch")
    assert "file too large" in message.lower() and str(path) in message
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["opt.pt"]

"""Measured implementation choices kept on disk, so that a later process need not measure.

One JSON file per user and machine (:func:`cache_path`): ``$OPTIPLUG_CACHE_DIR``,
else the platform's user cache directory (``$XDG_CACHE_HOME/optiplug`` or
``~/.cache/optiplug`` on Linux, ``~/Library/Caches/optiplug`` on macOS,
``%LOCALAPPDATA%\\optiplug\\Cache`` on Windows), holding ``autotune.json``. Each entry is keyed by everything a choice depends on
(:func:`key_fields`): the algorithm, the candidates, the parameters' sizes,
dtype and device type, and the machine (torch's version, the device's name,
torch's thread count), and holds the winner and the timings it won with.

The file is written atomically (a temporary file, then :func:`os.replace`)
and read tolerantly: a file that cannot be read or parsed is ignored, with
one warning per process, and rewritten at the next decision; an entry that
does not fit the candidates is a miss. ``OPTIPLUG_AUTOTUNE_CACHE=0`` (or
``false``, ``no``, ``off``) neither reads nor writes it. A write reads,
merges and replaces the file under a lock file beside it (``autotune.json.lock``,
:mod:`filelock`), so processes writing at once keep every entry; a lock not
had within :data:`LOCK_SECONDS` skips that write, with one warning.

Reading never follows the file into anything but a regular file of at most
:data:`MAX_BYTES` (a FIFO, a device, a directory or a larger file is ignored
and warned about, so creating an optimizer neither hangs nor fills memory),
and keeps only entries of the shape it writes: a winner's name and finite,
non-negative timings.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import stat
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock
import torch

from .._core.env import CACHE_DIRECTORY_VARIABLE, cache_directory, cpu_model, env_flag

__all__ = [
    "CACHE_VARIABLE",
    "DIRECTORY_VARIABLE",
    "FILE_NAME",
    "LOCK_SECONDS",
    "MAX_BYTES",
    "cache_path",
    "clear_cache",
    "device_name",
    "directory",
    "enabled",
    "entry_key",
    "key_fields",
    "load",
    "size_key",
    "store",
]

CACHE_VARIABLE = "OPTIPLUG_AUTOTUNE_CACHE"
"""Environment variable: a switch, on by default; off neither reads nor writes the file."""

DIRECTORY_VARIABLE = CACHE_DIRECTORY_VARIABLE
"""Environment variable: the directory of the cache file (default: the XDG cache directory)."""

FILE_NAME = "autotune.json"
"""The cache file's name inside :func:`directory`."""

LOCK_SECONDS = 10.0
"""How long a write waits for another process's write to the file to finish."""

MAX_BYTES = 4 * 1024 * 1024
"""The largest cache file read; a larger one is ignored (it holds thousands of entries at most)."""

_FORMAT = 1
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
_lock = threading.Lock()
_warned: set[str] = set()


def enabled() -> bool:
    """Whether ``OPTIPLUG_AUTOTUNE_CACHE`` leaves the cache on (it is on by default).

    Raises:
        EnvironmentVariableError: the variable is not a boolean word.
    """
    return env_flag(CACHE_VARIABLE, default=True)


def directory() -> Path:
    """``$OPTIPLUG_CACHE_DIR``, else ``$XDG_CACHE_HOME/optiplug``, else ``~/.cache/optiplug``."""
    return cache_directory()


def cache_path() -> Path:
    """The cache file: ``autotune.json`` in :func:`directory`."""
    return directory() / FILE_NAME


def size_key(shapes: Sequence[Sequence[int]]) -> str:
    """The parameters' size distribution: ``"64 tensors, 64000000 elements, shapes 1a2b..."``.

    The digest covers every distinct shape and how often it occurs (not their
    order), so the same model gives the same key and a different one another.

    Args:
        shapes: the parameters' shapes.

    Returns:
        A short, readable key.
    """
    counts = Counter(tuple(int(size) for size in shape) for shape in shapes)
    canonical = json.dumps(sorted([list(shape), count] for shape, count in counts.items()))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    elements = sum(math.prod(shape) * count for shape, count in counts.items())
    return f"{sum(counts.values())} tensors, {elements} elements, shapes {digest}"


def device_name(device: torch.device) -> str:
    """The device's model: the CUDA device's name, else the CPU's.

    Args:
        device: the parameters' device.

    Returns:
        E.g. ``"NVIDIA H100 80GB HBM3"`` or ``"AMD EPYC 7B13"``.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return cpu_model()


def key_fields(
    algorithm: str,
    candidates: Sequence[str],
    shapes: Sequence[Sequence[int]],
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, Any]:
    """Everything a choice depends on, as the cache keys it.

    Args:
        algorithm: the algorithm's name.
        candidates: the competing implementations' names, in priority order.
        shapes: the parameters' shapes.
        dtype: the parameters' dtype.
        device: the parameters' device.

    Returns:
        The algorithm, candidates, sizes (:func:`size_key`), dtype, device
        type and name, torch's version and torch's intra-op thread count.
    """
    device = torch.device(device)
    return {
        "algorithm": algorithm,
        "candidates": list(candidates),
        "sizes": size_key(shapes),
        "dtype": str(dtype),
        "device": device.type,
        "device_name": device_name(device),
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
    }


def entry_key(fields: Mapping[str, Any]) -> str:
    """The entry's name in the file: ``fields`` as compact, sorted JSON."""
    return json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))


def load(
    fields: Mapping[str, Any], file: Path | None = None
) -> tuple[str, dict[str, float]] | None:
    """The stored choice for ``fields``: ``(winner, timings)``, or None.

    Args:
        fields: the key (:func:`key_fields`).
        file: the cache file; None for :func:`cache_path`.

    Returns:
        None when there is no usable entry: none stored, a winner that is not
        one of the candidates, or a file that cannot be read (warned once).
    """
    entry = _read(cache_path() if file is None else file).get(entry_key(fields))
    if not isinstance(entry, dict):
        return None
    winner, timings = entry.get("winner"), entry.get("timings")
    candidates = fields.get("candidates", [])
    if winner not in candidates or not isinstance(timings, dict):
        return None
    return str(winner), {name: _seconds(timings.get(name)) for name in candidates}


def store(
    fields: Mapping[str, Any],
    winner: str,
    timings: Mapping[str, float],
    file: Path | None = None,
) -> None:
    """Record ``winner`` for ``fields``, atomically; a failure to write is warned once.

    Args:
        fields: the key (:func:`key_fields`).
        winner: the chosen implementation.
        timings: seconds per step of each candidate (``inf`` when not timed).
        file: the cache file; None for :func:`cache_path`.
    """
    target = cache_path() if file is None else file
    entry = {
        "winner": winner,
        "timings": {
            name: (value if math.isfinite(value) else None) for name, value in timings.items()
        },
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        with _lock, _file_lock(target):
            entries = _read(target)
            entries[entry_key(fields)] = entry
            _write(target, {"format": _FORMAT, "entries": entries})
    except (OSError, filelock.Timeout) as error:
        _warn_once(f"write:{target}", f"could not write the autotune cache {target}: {error}")


def _file_lock(target: Path) -> filelock.BaseFileLock:
    """The lock every process takes to rewrite ``target`` (its directory is created)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(f"{target}.lock", timeout=LOCK_SECONDS)


def clear_cache(file: Path | None = None) -> bool:
    """Remove the cache file.

    Args:
        file: the cache file; None for :func:`cache_path`.

    Returns:
        Whether there was a file to remove.

    Raises:
        IsADirectoryError: the path is a directory (it is left alone).
        OSError: the file could not be removed.
    """
    target = cache_path() if file is None else file
    if target.is_dir() and not target.is_symlink():
        raise IsADirectoryError(
            errno.EISDIR, "the autotune cache path is a directory; nothing removed", str(target)
        )
    with _lock:
        try:
            target.unlink()
        except FileNotFoundError:
            return False
    return True


def _seconds(value: object) -> float:
    """A stored timing: a number, or ``inf`` for ``null`` and anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.inf
    try:
        seconds = float(value)
    except OverflowError:
        return math.inf
    return seconds if math.isfinite(seconds) and seconds >= 0 else math.inf


def _read(file: Path) -> dict[str, Any]:
    """The file's well-formed entries; empty when it is missing or unusable (warned once)."""
    try:
        data = json.loads(_read_bytes(file).decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        _ignored(file, f"{type(error).__name__}: {error}")
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or data.get("format") != _FORMAT:
        _ignored(file, f"not an optiplug autotune cache of format {_FORMAT}")
        return {}
    return {key: entry for key, entry in entries.items() if _well_formed(entry)}


def _read_bytes(file: Path) -> bytes:
    """The bytes of ``file`` if it is a regular file of at most :data:`MAX_BYTES`.

    Raises:
        FileNotFoundError: there is no file.
        OSError: it is (or links to) something other than a regular file, or is too large.
    """
    descriptor = os.open(file, _READ_FLAGS)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(file))
        if status.st_size > MAX_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_BYTES} bytes", str(file))
        with os.fdopen(descriptor, "rb", closefd=False) as stream:
            data = stream.read(MAX_BYTES + 1)
    finally:
        os.close(descriptor)
    if len(data) > MAX_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_BYTES} bytes", str(file))
    return data


def _well_formed(entry: object) -> bool:
    """Whether ``entry`` has the shape :func:`store` writes (so rewriting it is safe)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("winner"), str):
        return False
    timings = entry.get("timings")
    if not isinstance(timings, dict):
        return False
    return all(
        isinstance(name, str) and (value is None or _seconds(value) < math.inf)
        for name, value in timings.items()
    ) and isinstance(entry.get("written", ""), str)


def _ignored(file: Path, why: str) -> None:
    _warn_once(
        f"read:{file}",
        f"ignoring the unreadable autotune cache {file} ({why}); measuring instead, "
        "and the file is rewritten with the next choice",
    )


def _write(file: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON to ``file`` through a temporary file in the same directory."""
    file.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(data, stream, indent=1, sort_keys=True)
            stream.write("\n")
        os.replace(temporary, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _warn_once(topic: str, message: str) -> None:
    if topic in _warned:
        return
    _warned.add(topic)
    warnings.warn(f"optiplug: {message}", UserWarning, stacklevel=3)

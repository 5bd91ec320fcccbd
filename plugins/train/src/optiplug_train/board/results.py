"""The results file: JSON lines, appended one whole record at a time.

Each line is one record written with a single ``write`` of the whole line,
then flushed and ``fsync``-ed, so a run killed at any moment leaves every
earlier record intact and at most a torn last line, which :func:`read_records`
ignores (and the next run truncates before appending). Four kinds of record:
``header`` (one per invocation: machine, versions, seeds, tier), ``run``
(one per optimizer, workload, lr and seed), and the markers a run in the
leaderboard's own process writes around itself: ``start`` before it, and
``interrupted`` when Ctrl-C stops it (a ``start`` with neither a record nor
``interrupted`` after it is a run whose process died).

Importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from optiplug.errors import OptiplugError

__all__ = ["ResultsFile", "key_of", "machine", "read_records"]


def key_of(record: Mapping[str, Any]) -> tuple[str, str, float | None, int]:
    """The key of a run record: ``(optimizer, workload, lr, seed)`` (lr to 12 digits)."""
    lr = record["lr"]
    return (
        str(record["optimizer"]),
        str(record["workload"]),
        None if lr is None else float(f"{float(lr):.12g}"),
        int(record["seed"]),
    )


def machine() -> dict[str, Any]:
    """The machine and versions a header record names."""
    versions: dict[str, str | None] = {}
    for name in ("optiplug", "torch", "scikit-learn", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def _parse(lines: list[bytes], path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of whole lines, and the byte length of the intact prefix."""
    records: list[dict[str, Any]] = []
    intact = 0
    for number, line in enumerate(lines, 1):
        if not line.endswith(b"\n"):  # torn: the write was cut short
            break
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break
            raise OptiplugError(
                f"{path}: line {number} is not a JSON record; not a leaderboard results file?"
            ) from None
        records.append(record)
        intact += len(line)
    return records, intact


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every whole record of the results file ``path``; a torn last line is left out.

    Args:
        path: the file (a missing file has no records).

    Returns:
        The records, in file order.

    Raises:
        OptiplugError: a line other than the last is not JSON.
    """
    found = Path(path)
    if not found.exists():
        return []
    return _parse(found.read_bytes().splitlines(keepends=True), found)[0]


class ResultsFile:
    """An open results file to append to; a torn last line is cut off first.

    Args:
        path: the file (created with its folders if missing).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        self.records, intact = _parse(data.splitlines(keepends=True), self.path)
        self._handle = open(self.path, "ab")  # noqa: SIM115 (closed by close())
        if intact < len(data):
            self._handle.truncate(intact)

    def done(self) -> set[tuple[str, str, float | None, int]]:
        """The keys of the run records already present."""
        return {key_of(r) for r in self.records if r.get("kind") == "run"}

    def append(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one line, flushed and fsynced, and keep it in :attr:`records`."""
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        self._handle.write(line.encode("utf-8"))
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.records.append(dict(record))

    def extend(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append each of ``records``."""
        for record in records:
            self.append(record)

    def close(self) -> None:
        """Close the file."""
        self._handle.close()

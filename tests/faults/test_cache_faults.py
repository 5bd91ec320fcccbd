"""The autotune cache under fault: crafted entries and paths never break ``create``.

A file or path another process (or a user) crafted is read defensively: a
FIFO, a device or a huge file is ignored with one warning and no hang, an
entry of any shape writing does not give is a miss, and clearing a path
that is a directory says so on one line.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from autotune_helpers import choose, entries

from optiplug import cli
from optiplug._choice import cache as _cache

pytestmark = pytest.mark.usefixtures("_cache_in_tmp")  # every test in a fresh cache


def _set_timing(file: Path, value: Any) -> None:
    """Rewrite every stored timing of the file's entries to ``value`` (raw JSON text)."""
    data = json.loads(file.read_text())
    for entry in data["entries"].values():
        entry["timings"] = dict.fromkeys(entry["timings"], "@@")
    file.write_text(json.dumps(data).replace('"@@"', value))


DEPTH = 100_000  # beyond any recursion limit: the JSON parser raises RecursionError


@pytest.mark.parametrize(
    "timing",
    [str(10**400), "-1.0", "NaN", "Infinity", "[" * 500 + "]" * 500, "[" * DEPTH + "]" * DEPTH],
    ids=["huge-integer", "negative", "nan", "infinity", "nested-500", "nested-deep"],
)
def test_a_crafted_entry_is_a_miss_and_never_breaks_creating(
    timing: str, _cache_in_tmp: Path
) -> None:
    choose()
    _set_timing(_cache_in_tmp, timing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deepest one makes the whole file unreadable
        assert choose().source == "measured"
    [entry] = entries(_cache_in_tmp).values()
    assert all(value is None or math.isfinite(value) for value in entry["timings"].values())
    assert choose().source == "cache"


def _fifo(file: Path) -> None:
    os.mkfifo(file)


def _link_to_zero(file: Path) -> None:
    file.symlink_to("/dev/zero")


def _too_large(file: Path) -> None:
    file.write_text('{"format": 1, "entries": {}}' + " " * _cache.MAX_BYTES)


def _nested_file(file: Path) -> None:
    file.write_text("[" * DEPTH + "]" * DEPTH)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("craft", [_fifo, _link_to_zero, _too_large, _nested_file])
def test_a_cache_path_that_is_no_regular_file_is_ignored_without_blocking(
    craft: Any, _cache_in_tmp: Path
) -> None:
    craft(_cache_in_tmp)
    with pytest.warns(UserWarning, match="ignoring the unreadable autotune cache"):
        assert choose().source == "measured"
    assert _cache_in_tmp.is_file() and not _cache_in_tmp.is_symlink()  # replaced by the choice
    assert choose().source == "cache"


def test_clearing_a_cache_path_that_is_a_directory_says_so_and_leaves_it(
    _cache_in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _cache_in_tmp.mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        _cache.clear_cache()
    assert cli.main(["bench", "--clear-cache"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"optiplug: cannot clear the autotune cache {_cache_in_tmp}: "
        "the autotune cache path is a directory; nothing removed"
    )
    assert "Traceback" not in captured.err and _cache_in_tmp.is_dir()


WRITER = """
import sys
from pathlib import Path
from optiplug._choice import cache
file, who = Path(sys.argv[1]), sys.argv[2]
for index in range(40):
    cache.store({"writer": who, "index": index}, "loop", {"loop": 1e-3}, file=file)
"""


@pytest.mark.slow
def test_processes_writing_the_cache_at_once_keep_every_entry(_cache_in_tmp: Path) -> None:
    import subprocess
    import sys

    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(_cache_in_tmp), who])
        for who in ("a", "b", "c")
    ]
    assert [writer.wait(timeout=300) for writer in writers] == [0, 0, 0]
    stored = entries(_cache_in_tmp)
    assert len(stored) == 3 * 40  # read, merged and replaced under the lock: none lost

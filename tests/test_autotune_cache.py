"""The autotune cache file: measured choices kept per machine, reused by later processes."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from autotune_helpers import choose, entries, params
from conftest import run_python

import optiplug
from optiplug import cli
from optiplug._choice import cache as _cache
from optiplug._choice import chooser as _chooser_module
from optiplug._choice.chooser import chooser_of
from optiplug._core import ranks as _ranks
from optiplug.errors import EnvironmentVariableError

# A fresh interpreter creates sgd (loop, foreach, fused: nothing to compile) and
# prints how the choice was made, once the background measurement (if any) is
# done and a step has taken it. It inherits OPTIPLUG_CACHE_DIR from the test.
pytestmark = pytest.mark.usefixtures("_cache_in_tmp")  # every test in a fresh cache

CHILD = """
import json, torch, optiplug
from optiplug._choice import cache as _cache
from optiplug._choice import timing as _timing
from optiplug._choice.chooser import Tuning, chooser_of
params = [torch.nn.Parameter(torch.ones({size}, dtype=torch.{dtype})) for _ in range({count})]
optimizer = optiplug.create("sgd", params, momentum=0.9)
chooser_of().wait_for_measurements()
optimizer.step()
[record] = chooser_of().measurements().values()
print(json.dumps({{"impl": optimizer.impl, "source": record.source, "tensors": record.tensors}}))
"""


def child() -> dict[str, Any]:
    """Run :data:`CHILD` in a fresh interpreter; its printed record."""
    done = run_python(CHILD.format(size=64, count=2, dtype="float32"))
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_next_fresh_process_takes_the_choice_from_the_cache_without_measuring(
    _cache_in_tmp: Path,
) -> None:
    first = child()
    assert first["source"] == "measured" and first["tensors"] == 2
    [(key, entry)] = entries(_cache_in_tmp).items()
    fields = json.loads(key)
    assert fields["algorithm"] == "sgd" and fields["dtype"] == "torch.float32"
    assert fields["device"] == "cpu" and fields["device_name"] and fields["threads"] >= 1
    assert fields["torch"] == torch.__version__ and fields["sizes"].startswith("2 tensors, 128 ")
    assert sorted(fields["candidates"]) == ["foreach", "fused", "loop"]
    assert entry["winner"] == first["impl"]
    second = child()
    assert second == {"impl": first["impl"], "source": "cache", "tensors": 0}


def test_a_different_dtype_or_size_distribution_is_measured_and_stored_beside(
    _cache_in_tmp: Path,
) -> None:
    assert choose().source == "measured"
    assert choose(dtype=torch.float64).source == "measured"
    assert choose(size=32, count=4).source == "measured"  # as many elements, other shapes
    assert len(entries(_cache_in_tmp)) == 3
    for kwargs in ({}, {"dtype": torch.float64}, {"size": 32, "count": 4}):
        assert choose(**kwargs).source == "cache"


def test_the_stored_winner_is_used_even_if_it_was_not_the_fastest_here(
    _cache_in_tmp: Path,
) -> None:
    measured = choose()
    data = json.loads(_cache_in_tmp.read_text())
    [entry] = data["entries"].values()
    other = next(name for name in measured.timings if name != measured.winner)
    entry["winner"] = other
    _cache_in_tmp.write_text(json.dumps(data))
    cached = choose()
    assert (cached.source, cached.winner) == ("cache", other)
    assert math.isfinite(cached.timings[measured.winner])


@pytest.mark.parametrize(
    "content",
    ["{not json", "[]", '{"format": 1, "entries": []}', '{"format": 99, "entries": {}}'],
    ids=["not-json", "a-list", "entries-not-a-mapping", "other-format"],
)
def test_a_corrupt_file_is_ignored_with_one_warning_and_rewritten(
    content: str, _cache_in_tmp: Path
) -> None:
    _cache_in_tmp.write_text(content)
    with pytest.warns(UserWarning, match="ignoring the unreadable autotune cache") as caught:
        assert choose().source == "measured"
    assert len([w for w in caught if "autotune cache" in str(w.message)]) == 1
    assert len(entries(_cache_in_tmp)) == 1
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert choose().source == "cache"
    assert not [w for w in again if "autotune cache" in str(w.message)]


def test_a_cache_path_that_cannot_be_read_or_written_never_breaks_creating(
    _cache_in_tmp: Path,
) -> None:
    _cache_in_tmp.mkdir()  # a directory where the file should be
    with pytest.warns(UserWarning) as caught:
        assert choose().source == "measured"
        assert choose().source == "measured"
    messages = [str(w.message) for w in caught if "autotune cache" in str(w.message)]
    assert len(messages) == 2, messages  # one for reading, one for writing, once each
    assert any("could not write" in message for message in messages)


def test_bench_clear_cache_removes_the_file(
    _cache_in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    choose()
    assert _cache_in_tmp.exists()
    assert cli.main(["bench", "--clear-cache"]) == 0
    assert capsys.readouterr().out.strip() == f"removed {_cache_in_tmp}"
    assert not _cache_in_tmp.exists()
    assert cli.main(["bench", "--clear-cache", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"cache": str(_cache_in_tmp), "removed": False}
    assert choose().source == "measured"


def test_clear_autotune_cache_removes_the_file_and_keeps_this_processes_choices(
    _cache_in_tmp: Path,
) -> None:
    choose()
    assert _cache.cache_path() == _cache_in_tmp
    assert _cache.clear_cache() is True
    assert not _cache_in_tmp.exists() and len(chooser_of().decisions()) == 1
    assert _cache.clear_cache() is False


def test_the_default_location_follows_xdg_and_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPTIPLUG_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _cache.cache_path() == tmp_path / "xdg" / "optiplug" / "autotune.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _cache.cache_path() == tmp_path / "home/.cache/optiplug/autotune.json"


def test_the_default_location_is_the_platforms_user_cache_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import platformdirs

    monkeypatch.delenv("OPTIPLUG_CACHE_DIR")
    expected = Path(platformdirs.user_cache_dir("optiplug", appauthor=False))
    assert _cache.cache_path() == expected / "autotune.json"  # ~/Library/Caches on macOS, and so on


def test_cache_off_neither_reads_nor_writes(
    _cache_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a fresh interpreter with a provisional choice, which would be stored at exit
    done = run_python(LATE, OPTIPLUG_AUTOTUNE_BUDGET="1", OPTIPLUG_AUTOTUNE_CACHE="off")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"late": ["late"], "source": "measured"}
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE_CACHE", "0")
    assert choose().source == "measured"
    assert not _cache_in_tmp.exists()  # not written
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE_CACHE", "1")
    choose()
    before = _cache_in_tmp.read_text()
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE_CACHE", "no")
    assert choose().source == "measured"  # not read
    assert choose(dtype=torch.float64).source == "measured"
    assert _cache_in_tmp.read_text() == before  # not written


def test_an_unreadable_cache_switch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTIPLUG_AUTOTUNE_CACHE", "maybe")
    with pytest.raises(EnvironmentVariableError, match="OPTIPLUG_AUTOTUNE_CACHE"):
        choose()


def test_ranks_agreeing_measure_and_leave_the_file_alone(
    _cache_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choose()
    before = _cache_in_tmp.read_text()
    monkeypatch.setattr(_ranks, "world_size", lambda: 2)
    monkeypatch.setattr(_chooser_module, "_slowest_rank", lambda timings, device: timings)
    chooser_of().clear()
    with chooser_of().agreed_across_ranks(torch.device("cpu")):
        optiplug.create("sgd", params(), momentum=0.9)
    [record] = chooser_of().measurements().values()
    assert record.source == "measured" and len(chooser_of().decisions(agreed=True)) == 1
    assert _cache_in_tmp.read_text() == before


# A fresh interpreter whose preferred candidate's first build outlasts the budget,
# as a first compilation does: the choice made then is provisional.
LATE = """
import json, time, types, torch, optiplug
from optiplug._choice import cache as _cache
from optiplug._choice import timing as _timing
from optiplug._choice.chooser import Tuning, chooser_of

def building(name, pause):
    calls = []
    def build(params, **hparams):
        if not calls:
            time.sleep(pause)
        calls.append(1)
        return torch.optim.SGD(params, foreach=False, **hparams)
    return build

impls = [
    optiplug.ImplementationSpec("toy", "late", building("late", 2.0), priority=2),
    optiplug.ImplementationSpec("toy", "quick", building("quick", 0.0), priority=1),
]
spec = optiplug.OptimizerSpec("toy", torch.optim.SGD, defaults={"lr": 0.1}, implementations=impls)
module = types.ModuleType("toy_plugin")
module.optiplug_optimizers = optiplug.hookimpl(lambda: [spec])
registry = optiplug.Registry(autoload=False, strict=False)
registry.register(module, "toy", distribution="optiplug-toy", version="1.0")
first = torch.nn.Parameter(torch.ones(1))  # torch's one-time imports happen here
first.grad = torch.ones(1)
torch.optim.SGD([first], lr=0.1, foreach=False).step()
registry.create("toy", [torch.nn.Parameter(torch.ones(64)) for _ in range(2)])
[record] = registry.chooser.measurements().values()
print(json.dumps({"late": list(record.late), "source": record.source}))
"""


def test_a_provisional_choice_is_not_written_and_nothing_is_measured_at_exit(
    _cache_in_tmp: Path,
) -> None:
    # the toy's candidates are two classes, so it is measured on the calling thread;
    # compiling or measuring while the interpreter exits can fail or abort it
    done = run_python(LATE, OPTIPLUG_AUTOTUNE_BUDGET="1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"late": ["late"], "source": "measured"}
    assert not _cache_in_tmp.exists() or not entries(_cache_in_tmp)


# lion's fused kernel compiles on its first step, which outlasts a 0.3 s budget
LATE_LION = """
import json, torch, optiplug
from optiplug._choice import cache as _cache
from optiplug._choice import timing as _timing
from optiplug._choice.chooser import Tuning, chooser_of
params = [torch.nn.Parameter(torch.zeros(4096)) for _ in range(4)]
for p in params:
    p.grad = torch.ones_like(p)
optimizer = optiplug.create("lion", params)
chooser_of().wait_for_measurements()
optimizer.step()
[record] = chooser_of().measurements().values()
print(json.dumps({"late": list(record.late), "impl": optimizer.impl, "winner": record.winner}))
"""


def test_a_background_measurement_left_provisional_is_measured_again_and_written(
    _cache_in_tmp: Path,
) -> None:
    done = run_python(LATE_LION, OPTIPLUG_AUTOTUNE_BUDGET="0.3")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # measured again once the compilation was done: complete, followed and written
    assert found["late"] == [] and found["impl"] == found["winner"]
    [entry] = entries(_cache_in_tmp).values()
    assert entry["winner"] == found["winner"]

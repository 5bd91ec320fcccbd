"""optiplug.base.build_c_library: C kernels built with the system's compiler, kept per machine."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optiplug._native import FLAG_SETS, _compiler
from optiplug.base import NativeLibrary, build_c_library
from optiplug.errors import EnvironmentVariableError, NativeBuildError

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and shutil.which("clang") is None,
    reason="no C compiler on this machine",
)

SOURCE = r"""
#include <stdint.h>
int64_t add(int64_t a, int64_t b) { return a + b; }
void scale(double *x, int64_t n, double by) {
  #pragma omp parallel for
  for (int64_t i = 0; i < n; i++) x[i] *= by;
}
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPTIPLUG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OPTIPLUG_NATIVE", raising=False)
    monkeypatch.delenv("CC", raising=False)
    return tmp_path / "cache" / "kernels"


def test_builds_loads_and_calls(own_cache) -> None:
    built = build_c_library(SOURCE, name="adder")
    assert isinstance(built, NativeLibrary)
    add = built.library.add
    add.argtypes, add.restype = [ctypes.c_int64, ctypes.c_int64], ctypes.c_int64
    assert add(2**40, 3) == 2**40 + 3
    assert built.path.parent == own_cache and built.path.name.startswith("adder-")
    values = (ctypes.c_double * 5)(1, 2, 3, 4, 5)
    built.library.scale.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
    built.library.scale(ctypes.addressof(values), 5, 2.5)
    assert list(values) == [2.5, 5.0, 7.5, 10.0, 12.5]
    assert "-ffast-math" not in built.flags and "-ffp-contract=off" in built.flags
    assert built.openmp == ("-fopenmp" in built.flags)


def test_a_later_call_loads_the_kept_library_without_building(own_cache) -> None:
    first = build_c_library(SOURCE, name="adder")
    stamp = first.path.stat().st_mtime_ns
    again = build_c_library(SOURCE, name="adder")
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in own_cache.iterdir()) == [first.path.name]  # no leftovers


def test_another_source_is_kept_apart(own_cache) -> None:
    one = build_c_library(SOURCE, name="adder")
    other = build_c_library(SOURCE.replace("a + b", "a - b"), name="adder")
    assert one.path != other.path
    other.library.add.argtypes = [ctypes.c_int64, ctypes.c_int64]
    other.library.add.restype = ctypes.c_int64
    assert other.library.add(5, 3) == 2


def test_a_damaged_kept_file_is_built_again(own_cache) -> None:
    # built in another process: a library loaded here must never be overwritten (it is mapped)
    source = SOURCE.replace("a + b", "b + a")
    script = f"from optiplug.base import build_c_library; print(build_c_library({source!r}, name='kept').path)"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    kept = Path(done.stdout.strip())
    kept.unlink()
    kept.write_bytes(b"not a shared library")
    again = build_c_library(source, name="kept")
    assert again.path == kept and kept.stat().st_size > 100
    again.library.add.restype = ctypes.c_int64
    assert again.library.add(ctypes.c_int64(1), ctypes.c_int64(2)) == 3


def test_an_unwritable_cache_directory_builds_in_a_temporary_one(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OPTIPLUG_CACHE_DIR", str(blocker))  # kernels/ cannot be made under a file
    built = build_c_library(SOURCE, name="adder")
    assert not built.path.is_relative_to(blocker) and built.path.exists()


def test_switched_off_is_a_typed_error_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("OPTIPLUG_NATIVE", "off")
    with pytest.raises(NativeBuildError, match="OPTIPLUG_NATIVE"):
        build_c_library(SOURCE, name="adder")
    monkeypatch.setenv("OPTIPLUG_NATIVE", "perhaps")
    with pytest.raises(EnvironmentVariableError, match="OPTIPLUG_NATIVE"):
        build_c_library(SOURCE, name="adder")


def test_a_missing_compiler_is_named(monkeypatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(NativeBuildError, match="/nonexistent/cc"):
        build_c_library(SOURCE, name="adder")


def test_a_source_that_does_not_build_says_what_the_compiler_said(own_cache) -> None:
    with pytest.raises(NativeBuildError, match=r"could not build 'broken'.*error") as caught:
        build_c_library("int broken( {", name="broken")
    assert isinstance(caught.value, RuntimeError)
    assert not any(own_cache.glob("*broken*"))  # no partial file left behind


@pytest.mark.parametrize("name", ["", "a b", "../up", "x/y"])
def test_a_bad_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        build_c_library(SOURCE, name=name)


def test_a_compiler_whose_version_fails_is_named_with_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cannot run here' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    _compiler.cache_clear()
    try:
        with pytest.raises(NativeBuildError, match="--version exited 3: cannot run here"):
            build_c_library(SOURCE, name="optiplug-test")
    finally:
        _compiler.cache_clear()


NO_COMPILER_CHILD = """
import warnings, torch, optiplug, optiplug.errors
warnings.simplefilter("always")
param = torch.nn.Parameter(torch.randn(128, 64, generator=torch.Generator().manual_seed(0)))
opt = optiplug.create("adamw", [param], lr=1e-3, state_precision="int8", impl="fused")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for step in range(5):
        param.grad = torch.randn(128, 64, generator=torch.Generator().manual_seed(1 + step))
        opt.step()
        if step == 0:
            first = param.detach().clone()
            codes = opt.state[param]["exp_avg"].codes.clone()
torch.save({{"param": first, "codes": codes}}, {out!r})
said = [str(w.message) for w in seen if "C kernels are unavailable" in str(w.message)]
print(all("10x slower" in m and "point CC at one" in m and "OPTIPLUG_NATIVE=0" in m for m in said))
print(sum(w.category is optiplug.errors.PluginWarning for w in seen if str(w.message) in said))
"""


@pytest.mark.slow
def test_without_a_compiler_int8_adamw_warns_once_and_steps_as_the_c_path(
    tmp_path: Path,
) -> None:
    import torch

    import optiplug

    out = tmp_path / "first.pt"
    child = subprocess.run(
        [sys.executable, "-c", NO_COMPILER_CHILD.format(out=str(out))],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_environment(), "CC": "/nonexistent", "OPTIPLUG_CACHE_DIR": str(tmp_path / "c")},
    )
    assert child.returncode == 0, child.stderr
    *_, names_cost_and_fix, warned = child.stdout.strip().splitlines()
    assert warned == "1" and names_cost_and_fix == "True"  # one warning, for every kernel
    torch_path = torch.load(out)
    param = torch.nn.Parameter(torch.randn(128, 64, generator=torch.Generator().manual_seed(0)))
    start = param.detach().clone()
    opt = optiplug.create("adamw", [param], lr=1e-3, state_precision="int8", impl="fused")
    param.grad = torch.randn(128, 64, generator=torch.Generator().manual_seed(1))
    opt.step()  # the C step
    # the documented bound of the C step against the torch path: 8 ulps of the parameter
    # and of the update's terms (|update| <= lr * (1 + weight decay |p|)), the moments
    # within one code
    bound = 8 * 2.0**-23 * (start.abs() + 1e-3 * (1 + start.abs()))
    assert bool(((param.detach() - torch_path["param"]).abs() <= bound).all())
    codes = opt.state[param]["exp_avg"].codes.int()
    assert int((codes - torch_path["codes"].int()).abs().max()) <= 1


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("OPTIPLUG_STRICT_PLUGINS", "CC")}


def _fake_compiler(folder: Path, body: str) -> Path:
    """A real executable standing in for the compiler: a shell script running ``body``."""
    script = folder / "fake-cc"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def _real_compiler() -> str:
    return next(path for path in map(shutil.which, ("cc", "gcc", "clang")) if path)


def test_a_compiler_rejecting_openmp_builds_without_it_single_threaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as Apple's clang does: "clang: error: unsupported option '-fopenmp'"
    rejects = (
        'for arg in "$@"; do\n  if [ "$arg" = -fopenmp ]; then\n'
        "    echo \"clang: error: unsupported option '-fopenmp'\" >&2; exit 1\n  fi\ndone\n"
    )
    fake = _fake_compiler(tmp_path, rejects + f'exec {_real_compiler()} "$@"')
    monkeypatch.setenv("CC", str(fake))
    built = build_c_library(SOURCE, name="adder-no-openmp")
    assert not built.openmp and built.flags == FLAG_SETS[1]  # -march=native kept
    built.library.add.argtypes = [ctypes.c_int64, ctypes.c_int64]
    built.library.add.restype = ctypes.c_int64
    assert built.library.add(40, 2) == 42
    values = (ctypes.c_double * 3)(1, 2, 3)
    built.library.scale.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
    built.library.scale(ctypes.addressof(values), 3, -2.0)  # its omp pragma ignored
    assert list(values) == [-2.0, -4.0, -6.0]


def test_a_compile_exiting_non_zero_is_named_with_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_cache: Path
) -> None:
    fake = _fake_compiler(
        tmp_path,
        'if [ "$1" = --version ]; then echo "fake cc 1.0"; exit 0; fi\n'
        'echo "fake-cc: error: cannot compile" >&2\nexit 2',
    )
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(NativeBuildError) as caught:
        build_c_library(SOURCE, name="adder-failing")
    assert str(caught.value).count("exited 2: fake-cc: error: cannot compile") == len(FLAG_SETS)
    assert not any(own_cache.glob("*adder-failing*"))  # no partial file left behind


def test_a_compile_exiting_zero_without_output_is_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_cache: Path
) -> None:
    fake = _fake_compiler(tmp_path, 'echo "fake cc 1.0"\nexit 0')
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(NativeBuildError, match="exited 0 but wrote nothing"):
        build_c_library(SOURCE, name="adder-empty")
    assert not any(own_cache.glob("*adder-empty*"))


CONCURRENT_CHILD = """
import sys
from optiplug.base import build_c_library
built = build_c_library(sys.argv[1], name="shared")
print(built.path)
"""


@pytest.mark.slow
def test_processes_building_into_one_cache_directory_at_once_share_one_whole_file(
    own_cache: Path,
) -> None:
    source = SOURCE.replace("a + b", "a + b + 0")  # built by nobody yet
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_CHILD, source],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(),
        )
        for _ in range(4)
    ]
    paths = set()
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        paths.add(out.strip())
    assert len(paths) == 1  # each renamed a whole file into place; every one loaded
    assert sorted(p.name for p in own_cache.iterdir()) == [Path(paths.pop()).name]
    loaded = build_c_library(source, name="shared").library
    loaded.add.argtypes, loaded.add.restype = [ctypes.c_int64, ctypes.c_int64], ctypes.c_int64
    assert loaded.add(2, 3) == 5

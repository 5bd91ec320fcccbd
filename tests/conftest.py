"""Shared fixtures: throwaway installed distributions and fresh interpreters."""

from __future__ import annotations

import atexit
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Set before collection: a module or fixture that builds optimizers before any
# test's own fixture runs never writes the user's autotune cache either.
os.environ["OPTIPLUG_CACHE_DIR"] = tempfile.mkdtemp(prefix="optiplug-test-cache-")
atexit.register(shutil.rmtree, os.environ["OPTIPLUG_CACHE_DIR"], ignore_errors=True)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(where: Path, dist: str, plugin_source: str, entry_name: str) -> Path:
    """Write a minimal valid wheel of ``dist`` whose entry point names ``<package>.plugin``."""
    package = dist.replace("-", "_")
    stem = f"{package}-0.1.0"
    info = f"{stem}.dist-info"
    files = {
        f"{package}/__init__.py": b"",
        f"{package}/plugin.py": plugin_source.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: optiplug-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[optiplug.plugins]\n{entry_name} = {package}.plugin\n".encode(),
    }
    record = [_record_line(path, data) for path, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = where / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


@pytest.fixture(autouse=True)
def _own_autotune_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each test (and the interpreters it starts) keeps autotune choices in its own empty directory.

    Never in the user's ~/.cache, and never a choice another test measured.
    """
    monkeypatch.setenv("OPTIPLUG_CACHE_DIR", str(tmp_path_factory.mktemp("optiplug-cache")))


@pytest.fixture
def make_distribution(tmp_path: Path) -> Callable[..., Path]:
    """Build a throwaway plugin distribution and pip-install it into its own directory.

    Returns a function ``(dist, plugin_source, entry_name=None) -> target dir``;
    put the directory on ``PYTHONPATH`` (see :func:`run_python`) to "install" it,
    leave it off to "uninstall" it.
    """

    def make(dist: str, source: str, entry_name: str | None = None) -> Path:
        wheels = tmp_path / "wheels"
        wheels.mkdir(exist_ok=True)
        wheel = build_wheel(wheels, dist, source, entry_name or dist.removeprefix("optiplug-"))
        target = tmp_path / dist
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        subprocess.run(
            [*command, "--target", str(target), str(wheel)], check=True, capture_output=True
        )
        return target

    return make


def run_python(code: str, *paths: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``paths`` on PYTHONPATH.

    CI runs in strict plugin mode; children choose their own strictness
    through ``env``.
    """
    environment = {k: v for k, v in os.environ.items() if k != "OPTIPLUG_STRICT_PLUGINS"}
    environment.update(PYTHONPATH=os.pathsep.join(map(str, paths)), **env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=False
    )


@pytest.fixture
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The cache file lives in ``tmp_path``; measuring and the cache are on; nothing cached here.

    The budget is wide, so that a busy machine does not leave a choice
    provisional (and unstored) where a test expects it stored.
    """
    from optiplug._choice import timing as _timing  # deferred: conftest imports no optiplug
    from optiplug._choice.chooser import chooser_of

    monkeypatch.setenv("OPTIPLUG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(_timing.BUDGET_VARIABLE, "60")
    for name in ("OPTIPLUG_AUTOTUNE", "OPTIPLUG_AUTOTUNE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    chooser_of().clear()
    yield tmp_path / "autotune.json"
    chooser_of().clear()

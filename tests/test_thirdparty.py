"""Discovery of real installed third-party distributions, in fresh processes.

Each test builds throwaway wheels (written by hand: a zip with a dist-info
directory and an ``optiplug.plugins`` entry point), installs them with pip
into a temporary target directory, and runs Python with that directory on
``PYTHONPATH`` - exactly how an installed plugin is found.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ACME_PLUGIN = """
import torch
import optiplug

OPTIPLUG_API = {api}

@optiplug.hookimpl
def optiplug_optimizers():
    return [optiplug.OptimizerSpec(name="acme_sgd", factory=torch.optim.SGD,
                                   defaults={{"lr": 0.1}}, description="SGD by Acme")]
"""

BROKEN_PLUGIN = """
raise ImportError("optiplug_broken needs a library that is not installed")
"""


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(where: Path, dist: str, package: str, plugin_source: str, entry_name: str) -> Path:
    """Write a minimal, valid wheel for distribution ``dist``."""
    stem = f"{dist.replace('-', '_')}-0.1.0"
    files = {
        f"{package}/__init__.py": b"",
        f"{package}/plugin.py": plugin_source.encode(),
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n".encode(),
        f"{stem}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: optiplug-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{stem}.dist-info/entry_points.txt": f"[optiplug.plugins]\n{entry_name} = {package}.plugin\n".encode(),
    }
    record = [record_line(path, data) for path, data in files.items()] + [
        f"{stem}.dist-info/RECORD,,"
    ]
    files[f"{stem}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = where / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def install(wheel: Path, target: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        "--target",
        str(target),
        str(wheel),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return target


def make_dist(tmp_path: Path, dist: str, source: str, entry: str | None = None) -> Path:
    package = dist.replace("-", "_")
    (tmp_path / "wheels").mkdir(exist_ok=True)
    wheel = build_wheel(
        tmp_path / "wheels", dist, package, source, entry or dist.removeprefix("optiplug-")
    )
    return install(wheel, tmp_path / dist)


def python(code: str, *paths: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # CI runs strict; these children choose their own strictness.
    environment = {k: v for k, v in os.environ.items() if k != "OPTIPLUG_STRICT_PLUGINS"}
    environment.update(PYTHONPATH=os.pathsep.join(map(str, paths)), **env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=False
    )


LIST_JSON = "import optiplug.cli, sys; sys.exit(optiplug.cli.main(['list', '--json']))"


def test_installed_plugin_is_discovered_listed_and_usable(tmp_path: Path) -> None:
    acme = make_dist(tmp_path, "optiplug-acme", ACME_PLUGIN.format(api=1))
    code = (
        "import optiplug, torch\n"
        "print(optiplug.optimizers())\n"
        "opt = optiplug.create('acme_sgd', [torch.nn.Parameter(torch.ones(2))])\n"
        "print(type(opt).__name__, opt.param_groups[0]['lr'])\n"
    )
    out = python(code, acme)
    assert out.returncode == 0, out.stderr
    names, created = out.stdout.splitlines()
    assert "acme_sgd" in names and "adam" in names
    assert created == "SGD 0.1"
    listing = json.loads(python(LIST_JSON, acme).stdout)
    row = next(o for o in listing["optimizers"] if o["name"] == "acme_sgd")
    assert (row["distribution"], row["version"], row["plugin"]) == (
        "optiplug-acme",
        "0.1.0",
        "acme",
    )


def test_same_distribution_twice_on_the_path_is_listed_once(tmp_path: Path) -> None:
    acme = make_dist(tmp_path, "optiplug-acme", ACME_PLUGIN.format(api=1))
    listing = json.loads(python(LIST_JSON, acme, acme).stdout)
    assert [p["name"] for p in listing["plugins"]].count("acme") == 1
    assert [o["name"] for o in listing["optimizers"]].count("acme_sgd") == 1


def test_broken_plugin_fails_alone_and_strict_mode_raises(tmp_path: Path) -> None:
    broken = make_dist(tmp_path, "optiplug-broken", BROKEN_PLUGIN)
    out = python(LIST_JSON, broken)
    assert out.returncode == 0, out.stderr
    plugins = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    assert plugins["broken"]["status"] == "failed"
    assert "not installed" in plugins["broken"]["error"]
    assert plugins["adam"]["status"] == "active"
    assert "failed to load" in out.stderr  # one PluginWarning
    use = "import optiplug, torch; optiplug.create('adam', [torch.nn.Parameter(torch.ones(1))]); print('ok')"
    assert python(use, broken).stdout.strip() == "ok"
    asked = python("import optiplug; optiplug.spec('broken')", broken)
    assert "OptimizerUnavailableError" in asked.stderr and "ImportError" in asked.stderr
    strict = python(use, broken, OPTIPLUG_STRICT_PLUGINS="1")
    assert strict.returncode != 0
    assert "PluginError" in strict.stderr and "broken" in strict.stderr


def test_table_shows_failed_plugin_with_its_error(tmp_path: Path) -> None:
    broken = make_dist(tmp_path, "optiplug-broken", BROKEN_PLUGIN)
    out = python("import optiplug.cli; optiplug.cli.main(['list'])", broken)
    assert "failed: plugin broken (optiplug-broken 0.1.0): ImportError" in out.stdout


def test_two_distributions_claiming_one_name_conflict(tmp_path: Path) -> None:
    acme = make_dist(tmp_path, "optiplug-acme", ACME_PLUGIN.format(api=1))
    rival = make_dist(tmp_path, "optiplug-rival", ACME_PLUGIN.format(api=1))
    code = (
        "import optiplug, torch\n"
        "try:\n"
        "    optiplug.spec('acme_sgd')\n"
        "except optiplug.errors.PluginConflictError as error:\n"
        "    print(error)\n"
        "print(optiplug.spec('acme_sgd', provider='optiplug-rival').provider.distribution)\n"
    )
    out = python(code, acme, rival)
    assert out.returncode == 0, out.stderr
    conflict, chosen = out.stdout.splitlines()
    assert "optiplug-acme 0.1.0" in conflict and "optiplug-rival 0.1.0" in conflict
    assert chosen == "optiplug-rival"


def test_incompatible_plugin_is_reported(tmp_path: Path) -> None:
    future = make_dist(tmp_path, "optiplug-future", ACME_PLUGIN.format(api=2))
    plugins = {p["name"]: p for p in json.loads(python(LIST_JSON, future).stdout)["plugins"]}
    assert plugins["future"]["status"] == "incompatible"
    assert "API 2" in plugins["future"]["error"]

"""Build every distribution's sdist and wheel, check them, and discover plugins from the wheels.

Used by ``tox -e wheels`` and runnable in any development environment::

    python scripts/check_wheels.py [-- PYTEST_ARGS...]

1. Builds an sdist and, from that sdist, a wheel of the core and of each
   plugin (``python -m build --no-isolation``: the current environment's
   setuptools, which must satisfy ``[build-system].requires``).
2. Runs ``twine check --strict`` over all of them (a missing or unrenderable
   long description fails).
3. Checks every wheel holds ``*.dist-info/licenses/LICENSE`` (the Apache-2.0
   text of the repository root), its package's ``py.typed``, an SPDX
   ``License-Expression`` and the distribution's README as a markdown long
   description; every sdist holds ``LICENSE``, ``README.md`` and
   ``pyproject.toml``.
4. Installs the wheels with ``pip install --no-deps --target`` into a
   temporary directory - never into the current environment, whose editable
   installs other people use - and runs ``optiplug list --json`` in a child
   interpreter with that directory first on ``PYTHONPATH``. The child asserts
   every optiplug module and distribution it used came from the temporary
   directory, so an entry point missing from a plugin's packaging (which
   editable installs can hide) shows up as a plugin missing from the listing.
5. With ``-- PYTEST_ARGS``, runs ``python -m pytest PYTEST_ARGS`` the same
   way, against the wheels.

Dependencies (torch, pluggy, ...) come from the current environment.
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
LICENSE = (ROOT / "LICENSE").read_bytes()

# Run in the child interpreter: import everything from the wheels, list the
# plugins, and prove nothing came from anywhere but the target directory.
PROBE = """
import importlib, importlib.metadata, io, json, sys
from contextlib import redirect_stdout
from pathlib import Path

target = Path(sys.argv[1]).resolve()
packages = json.loads(sys.argv[2])   # {distribution: import package}
import optiplug.cli

out = io.StringIO()
with redirect_stdout(out):
    code = optiplug.cli.main(["list", "--json"])
listing = json.loads(out.getvalue())
for package in packages.values():
    importlib.import_module(package)
elsewhere = sorted(
    f"{name} from {module.__file__}"
    for name, module in list(sys.modules.items())
    if name.split(".")[0] in packages.values()
    and getattr(module, "__file__", None)
    and not Path(module.__file__).resolve().is_relative_to(target)
)
for distribution in packages:
    found = Path(str(importlib.metadata.distribution(distribution).locate_file(""))).resolve()
    if found != target:
        elsewhere.append(f"distribution {distribution} from {found}")
print(json.dumps({"code": code, "listing": listing, "elsewhere": elsewhere,
                  "optiplug": optiplug.__file__}))
"""


def run(*command: str | Path, env: dict[str, str] | None = None) -> str:
    """Run a command, failing loudly with its output; return its stdout."""
    done = subprocess.run(
        list(map(str, command)), capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"wheels: failed ({done.returncode}): {' '.join(map(str, command))}")
    return done.stdout


def distributions() -> dict[str, Path]:
    """Every distribution's name and source directory: the core, then the plugins."""
    plugins = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists())
    return {"optiplug": ROOT / "core", **{_project(p)["name"]: p for p in plugins}}


def _project(source: Path) -> dict[str, object]:
    """The ``[project]`` table of ``source``'s pyproject.toml."""
    with (source / "pyproject.toml").open("rb") as file:
        project: dict[str, object] = tomllib.load(file)["project"]
    return project


def plugin_name(source: Path) -> str | None:
    """The entry-point name a plugin distribution registers in ``optiplug.plugins``.

    None for a library distribution that registers none (the integrations).
    """
    entry_points = _project(source).get("entry-points", {})
    names = list(entry_points.get("optiplug.plugins", {})) if isinstance(entry_points, dict) else []
    if len(names) > 1:
        raise SystemExit(f"wheels: {source} must name at most one optiplug.plugins entry point")
    return str(names[0]) if names else None


def build(source: Path, out: Path) -> None:
    """Build ``source``'s sdist, then a wheel from that sdist, into ``out``."""
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source)


def twine_check(artifacts: list[Path]) -> list[str]:
    """``twine check --strict`` over ``artifacts``: its complaints, as messages."""
    command = [sys.executable, "-m", "twine", "--no-color", "check", "--strict", *artifacts]
    env = {**os.environ, "COLUMNS": "500"}  # one line per message
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, env=env)
    if not done.returncode:
        return []
    lines = (line.strip() for line in (done.stdout + done.stderr).splitlines())
    return [f"twine: {line}" for line in lines if line and not line.endswith("PASSED")] or [
        f"twine check exited {done.returncode}"
    ]


def check_wheel(wheel: Path, dist: str, source: Path) -> list[str]:
    """What is missing from ``wheel`` (built from ``source``), as messages."""
    package = dist.replace("-", "_")
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        if f"{info}/licenses/LICENSE" not in names:
            problems.append("no .dist-info/licenses/LICENSE")
        elif archive.read(f"{info}/licenses/LICENSE") != LICENSE:
            problems.append("LICENSE differs from the repository's")
        if f"{package}/py.typed" not in names:
            problems.append(f"no {package}/py.typed")
        metadata = email.message_from_bytes(
            archive.read(f"{info}/METADATA"), policy=email.policy.compat32
        )
    if metadata["License-Expression"] != "Apache-2.0":
        problems.append(f"License-Expression is {metadata['License-Expression']!r}")
    if metadata.get_all("License-File") != ["LICENSE"]:
        problems.append(f"License-File is {metadata.get_all('License-File')!r}")
    if metadata["Description-Content-Type"] != "text/markdown":
        problems.append(f"Description-Content-Type is {metadata['Description-Content-Type']!r}")
    readme = (source / "README.md").read_text(encoding="utf-8")
    if str(metadata.get_payload()).strip() != readme.strip():
        problems.append("long description is not README.md")
    return [f"{wheel.name}: {p}" for p in problems]


def check_sdist(sdist: Path) -> list[str]:
    """What is missing from ``sdist``, as messages."""
    with tarfile.open(sdist) as archive:
        top = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    wanted = ["LICENSE", "README.md", "pyproject.toml", "PKG-INFO"]
    return [f"{sdist.name}: no {name}" for name in wanted if name not in top]


def discover(target: Path, dists: dict[str, Path]) -> list[str]:
    """Plugins not discovered, or not from the wheels, in a child on ``target``."""
    packages = {dist: dist.replace("-", "_") for dist in dists}
    env = child_environment(target)
    env["OPTIPLUG_STRICT_PLUGINS"] = "1"
    out = run(sys.executable, "-c", PROBE, target, json.dumps(packages), env=env)
    probe = json.loads(out.splitlines()[-1])
    problems = [f"not from the wheels: {line}" for line in probe["elsewhere"]]
    if probe["code"] != 0:
        problems.append(f"optiplug list --json exited {probe['code']}")
    found = {p["name"]: p for p in probe["listing"]["plugins"]}
    for dist, source in dists.items():
        if dist == "optiplug":
            continue
        name = plugin_name(source)
        if name is None:
            continue
        row = found.get(name, {})
        if row.get("status") != "active" or row.get("distribution") != dist:
            problems.append(f"plugin {name}: {row.get('status', 'missing')} ({row})")
    return problems


def child_environment(target: Path) -> dict[str, str]:
    """This environment with ``target`` first on PYTHONPATH and its scripts first on PATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(target / "bin"), env.get("PATH")]))
    return env


def main(argv: list[str]) -> int:
    """Build, check, install into a temporary directory, discover; 0 when all is well."""
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else None
    started = time.perf_counter()
    dists = distributions()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="optiplug-wheels-") as tmp:
        out, target = Path(tmp) / "dist", Path(tmp) / "site"
        with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 1))) as pool:
            list(pool.map(lambda source: build(source, out), dists.values()))
        sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
        if (len(sdists), len(wheels)) != (len(dists), len(dists)):
            problems.append(f"built {len(sdists)} sdists and {len(wheels)} wheels for {len(dists)}")
        problems += twine_check([*sdists, *wheels])
        for dist, source in dists.items():
            stem = dist.replace("-", "_") + "-"
            problems += [
                p for w in wheels if w.name.startswith(stem) for p in check_wheel(w, dist, source)
            ]
            problems += [p for s in sdists if s.name.startswith(stem) for p in check_sdist(s)]
        run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, *wheels)
        problems += discover(target, dists)
        for line in problems:
            print(f"wheels: {line}", file=sys.stderr)
        seconds = time.perf_counter() - started
        plugins = [d for d, s in dists.items() if d != "optiplug" and plugin_name(s) is not None]
        verdict = f"{len(problems)} problems" if problems else "all checks pass"
        print(
            f"wheels: {len(sdists)} sdists and {len(wheels)} wheels of {len(dists)} distributions "
            f"(twine check --strict; LICENSE, py.typed, README); {len(plugins)} plugins "
            f"expected from the wheels: {verdict} ({seconds:.0f} s)"
        )
        if problems:
            return 1
        if pytest_args is not None:
            command = [sys.executable, "-m", "pytest", *pytest_args]
            return subprocess.run(command, env=child_environment(target), check=False).returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

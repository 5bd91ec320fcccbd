"""Build every distribution as a wheel, install them non-editable, check discovery.

Used by ``tox -e wheels``: an entry point missing from a plugin's packaging
(which editable installs can hide) shows up here as a plugin missing from
``optiplug list --json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*command: str) -> str:
    """Run a command, failing loudly; return its stdout."""
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def build_and_install(wheel_dir: Path) -> list[str]:
    """Build core and each plugin into ``wheel_dir`` and install them; return plugin names."""
    plugins = sorted(
        p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists()
    )
    sources = [ROOT / "core", *(ROOT / "plugins" / name for name in plugins)]
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "-w",
        str(wheel_dir),
        *map(str, sources),
    )
    wheels = sorted(map(str, wheel_dir.glob("*.whl")))
    constraints = str(ROOT / "constraints.txt")
    run(sys.executable, "-m", "pip", "install", "-q", "-c", constraints, *wheels)
    # Same version numbers as an earlier build: force the fresh wheels in.
    run(sys.executable, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", *wheels)
    return plugins


def main() -> int:
    """Check that every plugin directory shows up active, from its own distribution."""
    with tempfile.TemporaryDirectory() as tmp:
        expected = build_and_install(Path(tmp))
    listing = json.loads(run(sys.executable, "-m", "optiplug", "list", "--json"))
    found = {p["name"]: p for p in listing["plugins"]}
    problems = [
        f"{name}: {found.get(name, {}).get('status', 'missing')}"
        for name in expected
        if found.get(name, {}).get("status") != "active"
        or found[name]["distribution"] != f"optiplug-{name}"
    ]
    editable = run(sys.executable, "-m", "pip", "list", "--editable", "--format=json")
    if json.loads(editable):
        problems.append(f"editable installs present: {editable.strip()}")
    for line in problems:
        print(f"wheels: {line}", file=sys.stderr)
    print(
        f"wheels: {len(expected) - len(problems)} of {len(expected)} plugins discovered from wheels"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

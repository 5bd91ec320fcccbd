"""``optiplug new-plugin``: a plugin distribution that installs, is discovered and passes its tests.

The fast tests call the command in-process and check names, directories and
that a failure leaves nothing behind. The slow ones scaffold a plugin, check
it with ruff and ``mypy --strict``, pip-install it (no dependencies, no build
isolation) into a throwaway ``--target`` directory, and run fresh
interpreters with that directory on ``PYTHONPATH``: ``importlib.metadata``
sees its entry point, ``optiplug list --json`` shows it active, its own tests
pass; removing the files its ``RECORD`` lists uninstalls it.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import optiplug
import optiplug.cli
from optiplug_devtools import scaffold

NAME = "acme_sgd"
PACKAGE = f"optiplug_{NAME}"
FILES = {
    ".gitignore",
    "README.md",
    "pyproject.toml",
    f"src/{PACKAGE}/__init__.py",
    f"src/{PACKAGE}/optimizer.py",
    f"src/{PACKAGE}/plugin.py",
    f"src/{PACKAGE}/py.typed",
    "tests/test_plugin.py",
}


def _tree(root: Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


def _rocket_registry() -> optiplug.Registry:
    """A registry whose plugin ``acme`` provides ``rocket`` (alias ``rkt``)."""
    module = types.ModuleType("acme_rocket")

    @optiplug.hookimpl
    def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
        return [
            optiplug.OptimizerSpec(name="rocket", factory=lambda params: None, aliases=("rkt",))
        ]

    module.optiplug_optimizers = optiplug_optimizers  # type: ignore[attr-defined]
    registry = optiplug.Registry(autoload=False)
    info = registry.register(module, "acme", distribution="optiplug-acme", version="1.2")
    assert info.status == "active", info.error
    return registry


# ------------------------------------------------------------------ writing
def test_writes_the_plugin_and_prints_next_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "plugin"
    assert optiplug.cli.main(["new-plugin", NAME, str(target)]) == 0
    assert _tree(target) == FILES
    assert os.listdir(tmp_path) == ["plugin"]  # no staging directory left
    out = capsys.readouterr().out
    assert f"plugin {NAME!r}, distribution optiplug-{NAME} 0.1.0" in out
    assert all(f"  {path}\n" in out for path in FILES)
    assert f"pip install -e {target}" in out
    assert "optiplug list" in out
    assert f"pytest {target / 'tests'}" in out


def test_dir_defaults_to_optiplug_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert optiplug.cli.main(["new-plugin", NAME]) == 0
    assert os.listdir(tmp_path) == [f"optiplug-{NAME}"]
    assert _tree(tmp_path / f"optiplug-{NAME}") == FILES


def test_an_empty_dir_is_filled_in_place(tmp_path: Path) -> None:
    target = tmp_path / "empty"
    target.mkdir()
    inode = target.stat().st_ino
    assert optiplug.cli.main(["new-plugin", NAME, str(target)]) == 0
    assert _tree(target) == FILES
    assert {p.name for p in target.iterdir()} == {".gitignore", "README.md", "pyproject.toml"} | {
        "src",
        "tests",
    }
    assert target.stat().st_ino == inode  # the same directory, not a replacement


def test_generated_files_are_valid_for_any_name_shape() -> None:
    for name in ("a", "tensor", "my_sgd2", "x" * scaffold.MAX_NAME_LENGTH):
        files = scaffold.render(name, requirement="optiplug>=0.1,<0.2")
        for path, text in files.items():
            if path.endswith(".py"):
                ast.parse(text, filename=path)
        assert f'{name} = "optiplug_{name}.plugin"' in files["pyproject.toml"]
    plugin = scaffold.render("tensor")["src/optiplug_tensor/optimizer.py"]
    assert "class TensorOptimizer(KernelTableOptimizer):" in plugin


def test_pyproject_names_the_entry_point_and_pins_the_running_core() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(scaffold.render(NAME)["pyproject.toml"])
    assert project["build-system"]["requires"] == ["setuptools>=64"]
    meta = project["project"]
    assert [meta["name"], meta["version"]] == [f"optiplug-{NAME}", "0.1.0"]
    assert meta["readme"] == "README.md" and meta["requires-python"] == ">=3.10"
    assert "license" not in meta
    assert meta["dependencies"] == [scaffold.core_requirement(optiplug.__version__), "torch>=2.4"]
    assert meta["entry-points"]["optiplug.plugins"] == {NAME: f"{PACKAGE}.plugin"}
    assert project["tool"]["setuptools"]["packages"]["find"] == {"where": ["src"]}


@pytest.mark.parametrize(
    "version, requirement",
    [
        ("0.1.0", "optiplug>=0.1,<0.2"),
        ("1.12.3rc1", "optiplug>=1.12,<1.13"),
        ("0+unknown", "optiplug>=0.0,<0.1"),
    ],
)
def test_core_requirement(version: str, requirement: str) -> None:
    assert scaffold.core_requirement(version) == requirement


def test_class_names() -> None:
    assert scaffold.class_name("my_sgd") == "MySgd"
    assert scaffold.class_name("sgd2") == "Sgd2"
    assert scaffold.class_name("tensor") == "TensorOptimizer"


def test_new_plugin_is_a_devtools_command() -> None:
    plugins = {info.name: info for info in optiplug.plugins()}
    assert plugins["devtools"].distribution == "optiplug-devtools"
    assert "command:new-plugin" in plugins["devtools"].provides


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "name, message",
    [
        ("AcmeSgd", "is not a lower-case Python identifier"),
        ("acme-sgd", "is not a lower-case Python identifier"),
        ("1sgd", "is not a lower-case Python identifier"),
        ("_sgd", "is not a lower-case Python identifier"),
        ("sgd_", "is not a lower-case Python identifier"),
        ("x" * (scaffold.MAX_NAME_LENGTH + 1), "use at most 40"),
        ("class", "is a Python keyword"),
        ("adamw", "'adamw' is an optimizer from adamw (optiplug-adamw"),
        ("adam_w", "'adamw' is an optimizer from adamw (optiplug-adamw"),
        ("commands", "plugin 'commands' (optiplug "),
    ],
)
def test_bad_names_are_refused_and_nothing_is_written(
    name: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert optiplug.cli.main(["new-plugin", name, str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("optiplug: error: ") and err.count("\n") == 1, err
    assert message in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "name, message",
    [
        ("rocket", "'rocket' is an optimizer from acme (optiplug-acme 1.2)"),
        ("rkt", "'rkt' is an alias of 'rocket' from acme (optiplug-acme 1.2)"),
        ("acme", "plugin 'acme' (optiplug-acme 1.2, active) is installed"),
    ],
)
def test_names_are_checked_in_the_commands_registry(
    name: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = _rocket_registry()
    assert optiplug.cli.main(["new-plugin", name, str(tmp_path / "x")], registry=registry) == 2
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
    assert optiplug.cli.main(["new-plugin", "adamw", str(tmp_path / "x")], registry=registry) == 0


def test_a_non_empty_dir_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    assert optiplug.cli.main(["new-plugin", NAME, str(target)]) == 2
    assert "is not empty (1 entries)" in capsys.readouterr().err
    assert _tree(tmp_path) == {"busy/notes.txt"}
    assert (target / "notes.txt").read_text() == "keep me"


def test_a_file_or_a_missing_parent_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    assert optiplug.cli.main(["new-plugin", NAME, str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert optiplug.cli.main(["new-plugin", NAME, str(tmp_path / "no" / "such")]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err
    assert _tree(tmp_path) == {"file"} and os.listdir(tmp_path) == ["file"]


@pytest.mark.parametrize("existing", [False, True], ids=["new-dir", "empty-dir"])
@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()], ids=type)
def test_a_failure_while_writing_leaves_nothing_behind(
    existing: bool,
    failure: BaseException,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = tmp_path / "out"
    if existing:
        target.mkdir()
    written: list[Path] = []
    write = scaffold._write

    def failing_write(path: Path, text: str) -> None:
        if len(written) == 3:
            raise failure
        write(path, text)
        written.append(path)

    monkeypatch.setattr(scaffold, "_write", failing_write)
    if isinstance(failure, OSError):
        assert optiplug.cli.main(["new-plugin", NAME, str(target)]) == 2
        assert "disk full" in capsys.readouterr().err
    else:
        with pytest.raises(KeyboardInterrupt):
            optiplug.cli.main(["new-plugin", NAME, str(target)])
    assert len(written) == 3 and all(not path.exists() for path in written)
    assert os.listdir(tmp_path) == (["out"] if existing else [])
    assert not existing or os.listdir(target) == []


def test_a_failed_move_into_an_empty_dir_puts_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out"
    target.mkdir()
    rename = os.rename
    calls: list[Any] = []

    def failing_rename(source: Any, destination: Any) -> None:
        calls.append(source)
        if len(calls) == 4:
            raise OSError("no space left")
        rename(source, destination)

    monkeypatch.setattr(os, "rename", failing_rename)
    assert optiplug.cli.main(["new-plugin", NAME, str(target)]) == 2
    assert os.listdir(tmp_path) == ["out"] and os.listdir(target) == []


# ------------------------------------------------------------------ installed, in fresh processes
def _child(
    args: list[str], site: Path, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` with ``site`` first on PYTHONPATH (the venv's installs stay as they are)."""
    env = {k: v for k, v in os.environ.items() if k != "OPTIPLUG_STRICT_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        check=False,
    )


_ENTRY_POINT = """
import importlib.metadata as metadata, json
found = [ep for ep in metadata.entry_points(group="optiplug.plugins") if ep.name == {name!r}]
print(json.dumps([[ep.value, ep.dist.name, ep.dist.version] for ep in found]))
"""


def _entry_points(site: Path) -> list[list[str]]:
    done = _child(["-c", _ENTRY_POINT.format(name=NAME)], site)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _listed(site: Path) -> dict[str, Any]:
    done = _child(["-m", "optiplug", "list", "--json"], site)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    return {
        "plugins": [p for p in found["plugins"] if p["name"] == NAME],
        "optimizers": [o for o in found["optimizers"] if o["name"] == NAME],
    }


def _uninstall(site: Path) -> None:
    """What ``pip uninstall`` does, for a ``--target`` install: remove what RECORD lists."""
    (dist_info,) = site.glob(f"{PACKAGE}-*.dist-info")
    with (dist_info / "RECORD").open(newline="") as stream:
        paths = [site / row[0] for row in csv.reader(stream) if row]
    for path in paths:
        path.unlink(missing_ok=True)
    for directory in sorted({p.parent for p in paths}, key=lambda p: len(p.parts), reverse=True):
        if directory != site and directory.exists() and not any(directory.iterdir()):
            directory.rmdir()


@pytest.mark.slow
def test_scaffold_installs_is_discovered_passes_its_tests_and_uninstalls(tmp_path: Path) -> None:
    source, site = tmp_path / f"optiplug-{NAME}", tmp_path / "site"
    assert optiplug.cli.main(["new-plugin", NAME, str(source)]) == 0
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--disable-pip-version-check", "--target", str(site), str(source)]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stderr

    assert _entry_points(site) == [[f"{PACKAGE}.plugin", f"optiplug-{NAME}", "0.1.0"]]
    listed = _listed(site)
    plugin = {k: listed["plugins"][0][k] for k in ("distribution", "version", "status", "error")}
    assert plugin == {
        "distribution": f"optiplug-{NAME}",
        "version": "0.1.0",
        "status": "active",
        "error": None,
    }
    assert listed["optimizers"][0]["implementations"] == ["foreach", "loop"]

    tests = _child(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], site, cwd=source)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed" in tests.stdout and "failed" not in tests.stdout

    _uninstall(site)
    assert os.listdir(site) == []
    assert _entry_points(site) == []
    assert _listed(site) == {"plugins": [], "optimizers": []}


@pytest.mark.slow
def test_scaffold_is_ruff_clean_and_mypy_strict(tmp_path: Path) -> None:
    source = tmp_path / f"optiplug-{NAME}"
    assert optiplug.cli.main(["new-plugin", NAME, str(source)]) == 0
    for command in (["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command],
            cwd=source,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    mypy = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(
        [*mypy, "src"], cwd=source, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr

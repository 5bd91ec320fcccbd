"""Every distribution's packaging metadata: extras, license, readme, classifiers.

Cheap checks of the pyproject files and of the installed (editable) metadata;
building and ``twine check``-ing the artifacts is ``scripts/check_wheels.py``
(``tox -e wheels``).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, where installed
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists())
"""Every plugin directory: the first-party algorithm plugins, the applications and the bridges."""
BRIDGES = [
    "apollo",
    "bitsandbytes",
    "galore",
    "grokadamw",
    "heavyball",
    "pytorch_optimizer",
    "schedulefree",
    "torch",
    "torchao",
]
"""The bridges: other libraries' optimizers (each pulls in its library, so not in ``all``)."""
APPLICATIONS = ["devtools", "integrations", "train"]
"""The applications and adapters built on the public API (in ``all``)."""


def _dist(directory: str) -> str:
    """``optiplug-pytorch-optimizer`` for ``plugins/pytorch_optimizer``: its project name."""
    with (ROOT / "plugins" / directory / "pyproject.toml").open("rb") as file:
        name: str = tomllib.load(file)["project"]["name"]
    return name


DISTS = {directory: _dist(directory) for directory in PLUGINS}
EXTRAS = {directory: DISTS[directory].removeprefix("optiplug-") for directory in PLUGINS}
SOURCES = {"optiplug": ROOT / "core", **{DISTS[n]: ROOT / "plugins" / n for n in PLUGINS}}
REQUIRED_CLASSIFIERS = {
    "Development Status :: 3 - Alpha",
    "Intended Audience :: Developers",
    "Programming Language :: Python :: 3 :: Only",
    "Programming Language :: Python :: 3.10",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
    "Typing :: Typed",
}
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def project(source: Path) -> dict[str, Any]:
    with (source / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def core_range() -> str:
    """The version range plugins require of the core, from the core's version: >=0.1,<0.2."""
    version = Version(project(ROOT / "core")["project"]["version"])
    return f">={version.major}.{version.minor},<{version.major}.{version.minor + 1}"


def by_name(requirements: list[str]) -> dict[str, Requirement]:
    parsed = map(Requirement, requirements)
    return {r.name: r for r in parsed}


def test_plugins_found() -> None:
    first_party = ["adam", "adamw", "fused", "lion", "multi", "muon", "sgd"]
    assert sorted(first_party + APPLICATIONS + BRIDGES) == PLUGINS
    assert DISTS["pytorch_optimizer"] == "optiplug-pytorch-optimizer"


@pytest.mark.parametrize("plugin", PLUGINS)
def test_core_has_one_extra_per_plugin_in_the_plugins_range(plugin: str) -> None:
    extras = project(ROOT / "core")["project"]["optional-dependencies"]
    assert by_name(extras[EXTRAS[plugin]]) == by_name([f"{DISTS[plugin]}{core_range()}"])
    # ... the same range the plugin declares for the core
    dependencies = by_name(project(ROOT / "plugins" / plugin)["project"]["dependencies"])
    assert str(dependencies["optiplug"].specifier) == str(Requirement(f"x{core_range()}").specifier)


def test_all_is_every_plugin_and_plot() -> None:
    extras = project(ROOT / "core")["project"]["optional-dependencies"]
    first_party = [EXTRAS[name] for name in PLUGINS if name not in BRIDGES]
    expected = [req for name in [*first_party, "plot"] for req in extras[name]]
    assert sorted(extras["all"]) == sorted(expected)
    assert by_name(extras["plot"]).keys() == {"matplotlib"}
    assert by_name(extras["checkpoint"]).keys() == {"safetensors"}


def test_installed_core_metadata_has_the_extras() -> None:
    """The environment's optiplug was (re)installed from this pyproject."""
    metadata = importlib.metadata.metadata("optiplug")
    declared = project(ROOT / "core")["project"]["optional-dependencies"]
    assert set(metadata.get_all("Provides-Extra") or []) == set(declared)
    requires = importlib.metadata.requires("optiplug") or []
    for plugin in PLUGINS:
        wanted = [r for r in map(Requirement, requires) if r.name == DISTS[plugin]]
        markers = {f'extra == "{EXTRAS[plugin]}"'} | ({'extra == "all"'} - _bridge(plugin))
        markers |= {'extra == "leaderboard"'} if plugin == "train" else set()
        assert {str(r.marker) for r in wanted} == markers, plugin


def _bridge(plugin: str) -> set[str]:
    """``{'extra == "all"'}`` for a bridge (which ``all`` leaves out), else nothing."""
    return {'extra == "all"'} if plugin in BRIDGES else set()


@pytest.mark.parametrize("dist", SOURCES)
def test_pyproject_declares_spdx_license_readme_and_classifiers(dist: str) -> None:
    config = project(SOURCES[dist])
    meta = config["project"]
    assert meta["name"] == dist
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] == ["LICENSE"]
    assert meta["readme"] == "README.md"
    classifiers = set(meta["classifiers"])
    assert classifiers >= REQUIRED_CLASSIFIERS
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression
    assert "urls" not in meta or all(u.startswith("https://") for u in meta["urls"].values())
    requires = by_name(config["build-system"]["requires"])
    assert Version("77") in requires["setuptools"].specifier
    assert Version("76.1") not in requires["setuptools"].specifier


@pytest.mark.parametrize("dist", SOURCES)
def test_license_and_readme_files_are_in_the_distribution_directory(dist: str) -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert (SOURCES[dist] / "LICENSE").read_text(encoding="utf-8") == license_text
    readme = (SOURCES[dist] / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(f"# {dist}\n")


@pytest.mark.parametrize("plugin", PLUGINS)
def test_plugin_readme_says_how_to_install_and_where_the_docs_are(plugin: str) -> None:
    readme = (ROOT / "plugins" / plugin / "README.md").read_text(encoding="utf-8")
    assert f"pip install {DISTS[plugin]}" in readme
    extras = readme.split("optiplug[", 1)[1].split("]", 1)[0] if "optiplug[" in readme else ""
    assert EXTRAS[plugin] in extras
    assert "## Documentation" in readme
    for path in re.findall(r"`(docs/[\w/.-]+\.md)`", readme):
        assert (ROOT / path).is_file(), path


@pytest.mark.parametrize("dist", SOURCES)
def test_readme_examples_run(
    dist: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = PYTHON_BLOCK.findall((SOURCES[dist] / "README.md").read_text(encoding="utf-8"))
    assert blocks
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for index, block in enumerate(blocks):
        exec(compile(block, f"{dist}/README.md[block {index}]", "exec"), namespace)


def test_changelog_keeps_a_changelog() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE)
    assert headings[:2] == ["Unreleased", project(ROOT / "core")["project"]["version"]]
    assert not re.search(r"#\d+", changelog)  # no issue numbers

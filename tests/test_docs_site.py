"""The documentation site (mkdocs.yml) builds with ``mkdocs build --strict``.

Strict mode fails on any warning: a broken link or anchor between pages, a
docstring griffe cannot parse, an API reference that does not resolve. The
API pages must document the public names. Skipped where the docs tools
(requirements-docs.txt) are not installed.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parent.parent

# page of the built site -> anchors (documented objects) it must hold
EXPECTED = {
    "api/optiplug/index.html": [
        "optiplug.create",
        "optiplug.factory",
        "optiplug.spec",
        "optiplug.optimizers",
        "optiplug.schedule",
        "optiplug.schedules",
        "optiplug.plugins",
        "optiplug.Registry",
        "optiplug.AutoOptimizer",
        "optiplug.Selection",
        "optiplug.Graph",
        "optiplug.OptimizerSpec",
    ],
    "api/base/index.html": [
        "optiplug.base.KernelTableOptimizer",
        "optiplug.base.torch_backed_optimizer",
    ],
    "api/checkpoint/index.html": ["optiplug.checkpoint.save", "optiplug.checkpoint.verify"],
    "api/errors/index.html": ["optiplug.errors.HyperparameterError"],
    "api/validators/index.html": ["optiplug.validators.hyperparameter"],
    "api/testing/index.html": ["optiplug.testing.conformance_cases"],
    "api/builtin_schedules/index.html": ["optiplug.builtin_schedules.CosineSchedule"],
    "api/integrations_transformers/index.html": [
        "optiplug_integrations.transformers.optimizer_cls_and_kwargs"
    ],
    "api/integrations_layerwise/index.html": ["optiplug_integrations.layerwise.LayerwiseOptimizer"],
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (
        f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    )
    return site_dir


@pytest.mark.parametrize("page", sorted(EXPECTED))
def test_api_page_documents_public_names(site: Path, page: str) -> None:
    html = (site / page).read_text(encoding="utf-8")
    missing = [name for name in EXPECTED[page] if f'id="{name}"' not in html]
    assert not missing, f"{page} does not document {missing}"


def test_changelog_page_includes_changelog(site: Path) -> None:
    """docs/changelog.md includes the root CHANGELOG.md: its first sentence is on the page."""
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    line = next(line for line in changelog.splitlines() if line.strip() and line[0].isalpha())
    words = list(itertools.takewhile(str.isalnum, line.split()))
    html = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    assert " ".join(words) in html


def test_every_page_is_built(site: Path) -> None:
    docs = ROOT / "docs"
    for page in docs.rglob("*.md"):
        relative = page.relative_to(docs).with_suffix("")
        built = site / ("index.html" if relative.name == "index" else relative / "index.html")
        assert built.is_file(), f"{page.relative_to(ROOT)} was not built"


def test_leaderboard_tables_are_sortable(site: Path) -> None:
    html = (site / "leaderboard" / "index.html").read_text(encoding="utf-8")
    assert 'src="../js/sort-tables.js"' in html  # the script that sorts a table by its headings
    assert (site / "js" / "sort-tables.js").is_file()

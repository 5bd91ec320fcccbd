"""Discovery of real installed third-party distributions, in fresh processes.

Each test builds throwaway wheels (written by hand: a zip with a dist-info
directory and an ``optiplug.plugins`` entry point), installs them with pip
into a temporary target directory, and runs Python with that directory on
``PYTHONPATH`` - exactly how an installed plugin is found.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import run_python

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


@pytest.fixture
def make_dist(make_distribution):
    return make_distribution


def python(code: str, *paths: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_python(code, *paths, **env)


LIST_JSON = "import optiplug.cli, sys; sys.exit(optiplug.cli.main(['list', '--json']))"


def test_installed_plugin_is_discovered_listed_and_usable(make_dist) -> None:
    acme = make_dist("optiplug-acme", ACME_PLUGIN.format(api=1))
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


def test_same_distribution_twice_on_the_path_is_listed_once(make_dist) -> None:
    acme = make_dist("optiplug-acme", ACME_PLUGIN.format(api=1))
    listing = json.loads(python(LIST_JSON, acme, acme).stdout)
    assert [p["name"] for p in listing["plugins"]].count("acme") == 1
    assert [o["name"] for o in listing["optimizers"]].count("acme_sgd") == 1


def test_broken_plugin_fails_alone_and_strict_mode_raises(make_dist) -> None:
    broken = make_dist("optiplug-broken", BROKEN_PLUGIN)
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


def test_table_shows_failed_plugin_with_its_error(make_dist) -> None:
    broken = make_dist("optiplug-broken", BROKEN_PLUGIN)
    out = python("import optiplug.cli; optiplug.cli.main(['list'])", broken)
    assert "failed: plugin broken (optiplug-broken 0.1.0): ImportError" in out.stdout


def test_two_distributions_claiming_one_name_conflict(make_dist) -> None:
    acme = make_dist("optiplug-acme", ACME_PLUGIN.format(api=1))
    rival = make_dist("optiplug-rival", ACME_PLUGIN.format(api=1))
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


def test_incompatible_plugin_is_reported(make_dist) -> None:
    future = make_dist("optiplug-future", ACME_PLUGIN.format(api=2))
    plugins = {p["name"]: p for p in json.loads(python(LIST_JSON, future).stdout)["plugins"]}
    assert plugins["future"]["status"] == "incompatible"
    assert "API 2" in plugins["future"]["error"]


LEADERBOARD = (
    "import optiplug.cli, sys; sys.exit(optiplug.cli.main(['leaderboard', '--only', "
    "'acme:acme_sgd', '--workloads', 'logistic', '--lrs', '2', '--quiet', '--results', {path!r}]))"
)


def test_a_third_party_optimizer_is_placed_against_the_published_board(
    make_dist, tmp_path: Path
) -> None:
    from optiplug_train.board.board import published_records

    acme = make_dist("optiplug-acme", ACME_PLUGIN.format(api=1))
    out = python(LEADERBOARD.format(path=str(tmp_path / "acme.jsonl")), acme)
    assert out.returncode == 0, out.stderr[-2000:]
    published = {
        r["optimizer"]
        for r in published_records()
        if r.get("kind") == "run" and r.get("workload") == "logistic"
    }
    heading = next(line for line in out.stdout.splitlines() if line.startswith("logistic"))
    place, total = heading.split("acme_sgd: ", 1)[1].rstrip(")").split(" of ")
    assert int(total) == len(published | {"acme_sgd"})  # among every published entry
    assert 1 <= int(place) <= int(total)
    assert "acme_sgd" in out.stdout.split(heading, 1)[1]  # its row is shown, whatever its place

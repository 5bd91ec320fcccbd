"""The public paths that moved to distributions of their own still resolve, with a warning.

``optiplug.leaderboard`` / ``Board`` / ``board_evidence`` now live in
``optiplug_train``; ``optiplug.integrations.transformers`` and its siblings
in ``optiplug_integrations``. The old path gives the very same object (one
module under two names, not a copy) and a ``DeprecationWarning``; where the
new distribution is missing, the error names what to install.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import optiplug
import optiplug_train

MOVED_MODULES = ["transformers", "lightning", "timm", "layerwise"]


@pytest.mark.parametrize("name", ["leaderboard", "Board", "board_evidence"])
def test_an_old_facade_name_is_the_new_object_with_a_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"optiplug.{name} moved to optiplug_train"):
        old = getattr(optiplug, name)
    assert old is getattr(optiplug_train, name)
    assert name not in optiplug.__all__


@pytest.mark.parametrize("name", MOVED_MODULES)
def test_an_old_integration_module_is_the_new_module_with_a_warning(name: str) -> None:
    sys.modules.pop(f"optiplug.integrations.{name}", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module(f"optiplug.integrations.{name}")
    assert old is importlib.import_module(f"optiplug_integrations.{name}")
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert any(
        f"optiplug.integrations.{name} moved to optiplug_integrations" in m for m in messages
    )


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_without_the_new_distribution_the_error_names_what_to_install() -> None:
    done = _run(
        "import sys\n"
        "sys.modules['optiplug_integrations'] = None  # as if not installed\n"
        "sys.modules['optiplug_train'] = None\n"
        "import warnings; warnings.simplefilter('ignore')\n"
        "import optiplug\n"
        "try:\n"
        "    import optiplug.integrations.transformers\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
        "try:\n"
        "    optiplug.leaderboard\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "pip install optiplug-integrations" in lines[0]
    assert "pip install optiplug-train" in lines[1]


def test_the_core_still_has_its_own_integrations_name() -> None:
    from optiplug.integrations import safe_globals

    assert optiplug.OptimizerFactory in safe_globals()

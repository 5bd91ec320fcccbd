"""The public API is typed for users: ``mypy --strict`` accepts ``tests/typing_user.py``.

The file is checked as a user's project would be: against the installed
``optiplug`` (its ``py.typed`` marker, its annotations), from a directory
without the repository's mypy configuration.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

USER_CODE = Path(__file__).with_name("typing_user.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_strict_accepts_user_code(tmp_path: Path) -> None:
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--config-file",
        str(config),
        "--cache-dir",
        str(tmp_path / "cache"),
        str(USER_CODE),
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr

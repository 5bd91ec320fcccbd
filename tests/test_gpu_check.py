"""scripts/gpu_check.sh stops at once, exit status 2, where no CUDA device is visible.

The device is hidden (``CUDA_VISIBLE_DEVICES=""``), so this runs the same on a
machine with a GPU: the check looks for the device with this interpreter's
torch before it installs, logs or runs anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_gpu_check_stops_early_without_a_device(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "OUT": str(logs)}
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gpu_check: no CUDA device: torch.cuda.is_available() is False" in done.stderr
    assert "nothing was run" in done.stderr
    assert not logs.exists()  # stopped before the log folder, the install and the tests

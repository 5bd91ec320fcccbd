"""Regenerate the curves shown in docs/schedules.md.

Run from the repository root (needs ``pip install 'optiplug[plot]'``)::

    python docs/plot_schedules.py

It calls the ``optiplug schedule NAME --steps N --param k=v --plot PATH``
command for each built-in schedule and writes ``docs/img/schedules/NAME.png``.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from optiplug.cli import main

OUT = Path(__file__).resolve().parent / "img" / "schedules"

EXAMPLES: dict[str, tuple[int, list[str]]] = {
    "constant": (1000, []),
    "linear_warmup": (1000, ["warmup_steps=200", "start_factor=0.1"]),
    "cosine": (1000, ["total_steps=1000", "warmup_steps=100", "min_ratio=0.1"]),
    "linear": (1000, ["total_steps=1000", "warmup_steps=100"]),
    "step": (1000, ["step_size=250", "gamma=0.5"]),
    "multistep": (1000, ["milestones=[300, 600, 850]", "gamma=0.3"]),
    "exponential": (1000, ["gamma=0.997"]),
    "polynomial": (1000, ["total_steps=1000", "power=2", "end_ratio=0.05", "warmup_steps=100"]),
    "inverse_sqrt": (1000, ["warmup_steps=100"]),
    "wsd": (
        1000,
        ["warmup_steps=100", "stable_steps=600", "decay_steps=250", "decay='1-sqrt'"],
    ),
    "onecycle": (1000, ["total_steps=1000"]),
    "sequence": (
        1000,
        [
            "schedules=[{'name': 'linear_warmup', 'warmup_steps': 100},"
            " {'name': 'cosine', 'total_steps': 400, 'min_ratio': 0.2},"
            " {'name': 'cosine', 'total_steps': 500, 'min_ratio': 0.0}]",
            "boundaries=[100, 500]",
        ],
    ),
}


def plot_all(out: Path = OUT) -> list[Path]:
    """Write one PNG per example schedule into ``out``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (steps, params) in EXAMPLES.items():
        target = out / f"{name}.png"
        argv = ["schedule", name, "--steps", str(steps), "--plot", str(target)]
        for param in params:
            argv += ["--param", param]
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        if code != 0:
            raise SystemExit(f"optiplug {' '.join(argv)} failed with exit code {code}")
        written.append(target)
    return written


if __name__ == "__main__":
    for path in plot_all():
        print(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path)
    sys.exit(0)

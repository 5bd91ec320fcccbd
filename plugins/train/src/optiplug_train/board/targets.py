"""The workloads' targets: what lr-tuned AdamW reaches at its full step budget.

As AlgoPerf sets its targets from tuned baselines, each workload's target
is derived once by :func:`derive` and stored as data (``targets.json``
beside this module, with how it was derived): AdamW at its registered
defaults but the lr, over a log-spaced sweep ``10**-4 .. 10**-1`` in
half-decade steps on seed 0; the lr with the lowest final validation metric
is then run on seeds 0, 1 and 2, and the target is the largest of those
three final metrics, so tuned AdamW reaches it on every one of them at its
full budget. ``scripts/leaderboard_targets.py`` reruns the derivation.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from optiplug import Registry

__all__ = ["SWEEP", "TARGET_SEEDS", "derive", "load_targets", "load_tuned_lrs"]

SWEEP = tuple(10.0 ** (e / 2) for e in range(-8, -1))
"""AdamW's learning rates, 1e-4 to 1e-1 in half decades."""
TARGET_SEEDS = (0, 1, 2)
_FILE = "targets.json"


def _stored() -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath(_FILE).read_text(encoding="utf-8")
    workloads: dict[str, dict[str, Any]] = json.loads(text)["workloads"]
    return workloads


def load_targets() -> dict[str, float]:
    """The stored target of each workload.

    Returns:
        ``{workload: target}``.
    """
    return {name: float(entry["target"]) for name, entry in _stored().items()}


def load_tuned_lrs() -> dict[str, float]:
    """The lr tuned AdamW reached each workload's target with (the board's baseline lr).

    Returns:
        ``{workload: lr}``.
    """
    return {name: float(entry["lr"]) for name, entry in _stored().items()}


def _final(record: Mapping[str, Any]) -> float:
    value = record["final_metric"]
    return float("inf") if value is None or record["status"] == "diverged" else float(value)


def derive(registry: Registry, path: Path | None = None) -> dict[str, Any]:
    """Run the sweep and the seeds for every workload; write ``targets.json``.

    Args:
        registry: where AdamW is looked up.
        path: where to write (default: beside this module).

    Returns:
        What was written: per workload the sweep's final metrics, the lr
        chosen, the seeds' final metrics and the target.
    """
    import torch  # deferred: imports torch

    from .runner import RunKey, run_one  # deferred: imports torch
    from .workloads import WORKLOADS  # deferred: imports torch

    derived: dict[str, Any] = {}
    for name, spec in WORKLOADS.items():
        sweep = {
            lr: _final(run_one(RunKey("adamw", name, lr, 0), spec, None, registry)) for lr in SWEEP
        }
        best = min(sweep, key=lambda lr: sweep[lr])
        seeds = [
            _final(run_one(RunKey("adamw", name, best, s), spec, None, registry))
            for s in TARGET_SEEDS
        ]
        derived[name] = {
            "metric": spec.metric,
            "steps": spec.steps,
            "sweep": [[lr, final] for lr, final in sweep.items()],
            "lr": best,
            "seeds": list(TARGET_SEEDS),
            "seed_finals": seeds,
            "target": max(seeds),
        }
    payload = {
        "how": __doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else "",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "workloads": derived,
    }
    out = path or Path(__file__).with_name(_FILE)
    out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return payload

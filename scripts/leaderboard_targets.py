"""Derive the leaderboard's workload targets (tuned AdamW's final metric) and store them.

Usage: python scripts/leaderboard_targets.py  (about a minute on one core)
"""

from __future__ import annotations

import json

import optiplug
from optiplug_train.board.targets import derive

if __name__ == "__main__":
    found = derive(optiplug.default_registry())
    print(json.dumps({name: (w["lr"], w["target"]) for name, w in found["workloads"].items()}))

"""optiplug-train: the training application and the leaderboard, built on optiplug's public API.

Commands (registered through the ``optiplug_cli_commands`` hook, as any
plugin's): ``optiplug train``, ``optiplug tune`` and ``optiplug leaderboard``.
The leaderboard is also a library::

    import optiplug_train
    board = optiplug_train.leaderboard(results="board.jsonl", only=["adamw", "lion"])
    evidence = optiplug_train.board_evidence("board.jsonl")

Importing this package imports no torch: the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .board.board import Board, leaderboard
    from .board.evidence import board_evidence

__all__ = ["Board", "board_evidence", "leaderboard"]

_LAZY_ATTRIBUTES = {
    "Board": ".board.board",
    "leaderboard": ".board.board",
    "board_evidence": ".board.evidence",
}
"""Public names whose modules import torch (or the results reader), imported on first access."""


def __getattr__(name: str) -> object:
    if name in _LAZY_ATTRIBUTES:
        return getattr(importlib.import_module(_LAZY_ATTRIBUTES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""``AutoOptimizer``: selection requests, model configs and the built-in rules.

``Selection`` is re-exported here because optiplug 0.1.0 pickled it under this
path (``optiplug._auto.Selection``); new pickles name ``optiplug.Selection``.
"""

from __future__ import annotations

from .._core.selection import CandidateReport, Selection

__all__ = ["CandidateReport", "Selection"]

"""optiplug-torch: torch.optim's optimizers that optiplug does not serve itself.

The entry point (:mod:`optiplug_torch.plugin`) registers every class of the
static catalogue (:mod:`optiplug_torch.catalog`) lazily: importing this
package imports no torch. The wrapper classes live in
:mod:`optiplug_torch.optimizers`.
"""

from __future__ import annotations

from .catalog import ENTRIES, LIBRARY, VERSION

__all__ = ["ENTRIES", "LIBRARY", "VERSION"]

"""The other name :mod:`optiplug.base` imports for a torch-backed optimizer's C state step.

Both names (this one and :data:`.native_state.fused_sgd_step`) are
:func:`.native_state.declared_state_step`, which runs the step the
optimizer's class declares; the algorithms' own C steps live in their
plugins.
"""

from __future__ import annotations

from .native_state import declared_state_step as fused_adam_step

__all__ = ["fused_adam_step"]

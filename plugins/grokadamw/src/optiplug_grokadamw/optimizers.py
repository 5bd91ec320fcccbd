"""GrokAdamW with optiplug's contract (imports torch and grokadamw).

:func:`optiplug.base.external_optimizer` over the library class, with its
keywords validated and validated, all-or-nothing state loading, and two
repairs that keep its numbers:

* **State where torch keeps it.** The library keeps each parameter's state
  in ``group["state"]``, a dict keyed by the parameter inside the param
  group, which ``state_dict()`` saves under the group and a load cannot put
  back on the new parameters (a resumed run would restart the moments).
  Here the step runs with ``group["state"]`` pointing at ``optimizer.state``
  (removed again after the step), so the same dicts live in torch's place:
  saved, checked and loaded like any optimizer's state.
* **Signal functions survive a load.** ``grokking_signal_fns`` are callables,
  which no checkpoint holds: ``state_dict()`` saves None (as the library's
  does) and loading keeps the loading optimizer's own functions.
"""

from __future__ import annotations

from typing import Any

import grokadamw  # type: ignore[import-untyped]  # grokadamw ships no py.typed
import torch

from optiplug.base import external_optimizer

from .catalog import NAME
from .config import GrokAdamWConfig

__all__ = ["GrokAdamW"]

_SIGNALS = "grokking_signal_fns"

_GrokAdamW = external_optimizer(
    NAME,
    grokadamw.GrokAdamW,
    GrokAdamWConfig,
    name="_GrokAdamW",
    module=__name__,
)


class GrokAdamW(_GrokAdamW):  # type: ignore[misc,valid-type]  # a class built at import
    """grokadamw's GrokAdamW with optiplug's contract (grokadamw), its state in ``optimizer.state``."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """The library's step, with each group's ``state`` pointing at ``optimizer.state``."""
        for group in self.param_groups:
            group["state"] = self.state
        try:
            return super().step(closure)
        finally:
            for group in self.param_groups:
                group.pop("state", None)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's ``__setstate__`` (a load ends here); each group keeps its own signal functions."""
        before = [g.get(_SIGNALS) for g in self.__dict__.get("param_groups", [])]
        super().__setstate__(state)
        for group, functions in zip(self.param_groups, before, strict=False):
            if group.get(_SIGNALS) is None:
                group[_SIGNALS] = functions

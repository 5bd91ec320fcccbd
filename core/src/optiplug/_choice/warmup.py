"""Warming a candidate up in a worker thread, and finishing such threads before the interpreter exits.

Split from :mod:`.chooser`: a candidate is built and stepped
:data:`~.timing.WARMUP_STEPS` times untimed here, joined with a time budget.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._core import decision as _decision
from .._core.decision import Prepared
from .._core.lifecycle import set_training
from .._core.specs import ImplementationSpec
from .timing import MAX_BUDGET, WARMUP_STEPS, synchronize, timed_step

__all__ = ["Cancelled", "Warmup", "call_at_exit"]


class Cancelled(Exception):
    """A background measurement stopped because the interpreter is exiting."""


class Warmup:
    """Build one candidate and run its untimed steps, in a worker thread."""

    def __init__(
        self,
        impl: ImplementationSpec,
        sample: list[torch.Tensor],
        hparams: Mapping[str, Any],
        device: torch.device,
        config: Any = None,
    ) -> None:
        self.impl = impl
        self.sample = sample
        self.hparams = dict(hparams)
        self.config = config
        self.device = device
        self.threads = torch.get_num_threads()
        self.optimizer: torch.optim.Optimizer | None = None
        self.error: Exception | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"optiplug-autotune-{impl.algorithm}-{impl.name}", daemon=True
        )

    def _run(self) -> None:
        try:
            # OpenMP's thread count is per thread: a new thread starts from the
            # default, and a kernel compiled here would fix that count in its code.
            torch.set_num_threads(self.threads)
            context = (
                torch.cuda.device(self.device)
                if self.device.type == "cuda"
                else contextlib.nullcontext()
            )
            with context:
                decided = Prepared(
                    self.impl.algorithm, self.sample, self.hparams, self.config, self.impl
                )
                optimizer = _decision.build(self.impl.factory, decided)
                set_training(optimizer, True)  # schedule-free optimizers step in training mode
                step = timed_step(optimizer)
                for _ in range(WARMUP_STEPS):
                    if self.stop.is_set():
                        return
                    step()
                synchronize(self.device)
            self.optimizer = optimizer
        except Exception as error:
            self.error = error

    def within(self, seconds: float) -> bool:
        """Start and wait up to ``seconds``; False (and asked to stop) when still running."""
        self.thread.start()
        self.thread.join(min(max(seconds, 0.0), MAX_BUDGET))
        if self.thread.is_alive():
            self.stop.set()
            return False
        return True


def call_at_exit(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    """Run ``method`` (while its object lives) before executors shut down at exit.

    Compilers run their work on ``concurrent.futures`` executors, which shut
    down in threading's own exit hooks; a warm-up still compiling must end
    its step before that, or the interpreter aborts. Those hooks are
    registered through ``threading._register_atexit`` (the one place a
    private name is used: public :mod:`atexit` runs too late); a Python
    without it gets :mod:`atexit`.
    """

    def finish() -> None:
        bound = method()
        if bound is not None:
            bound()

    getattr(threading, "_register_atexit", atexit.register)(finish)

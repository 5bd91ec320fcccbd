"""One leaderboard run: an optimizer at one lr and seed on one workload, measured.

Runs are deterministic on the CPU: one thread and
``torch.use_deterministic_algorithms(True)`` while a run lasts (both put back
afterwards), every random draw from the seed. Only the timing fields
(``seconds``, ``seconds_to_target``, ``curve_seconds``) differ between two
runs of the same key.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from optiplug import Registry
from optiplug.base import set_training, training_step

from .workloads import Problem, Workload

__all__ = ["DIVERGED_FACTOR", "MAX_SECONDS", "STATUSES", "WARM_UP_STEPS", "RunKey", "run_one"]

STATUSES = ("reached", "not reached", "diverged", "failed")
DIVERGED_FACTOR = 3.0
"""A validation metric above this many times its initial value counts as diverged."""
MAX_SECONDS = 30.0
"""A run still going after this many seconds of training past its warm-up stops, ``not reached``."""
WARM_UP_STEPS = 2
"""Steps whose time the :data:`MAX_SECONDS` cap leaves out: a compiled optimizer
(heavyball's) compiles its step there, which alone can take longer than the cap on
two cores; the time to target still counts them."""


@attrs.frozen
class RunKey:
    """What identifies a run in the results file (its timing aside, a run is its key's function).

    Attributes:
        optimizer: the catalogue name.
        workload: the workload's name.
        lr: the learning rate (None: the optimizer takes none).
        seed: the seed.
    """

    optimizer: str
    workload: str
    lr: float | None
    seed: int

    def as_tuple(self) -> tuple[str, str, float | None, int]:
        """The key as a hashable tuple (``lr`` rounded to 12 significant digits)."""
        lr = None if self.lr is None else float(f"{self.lr:.12g}")
        return (self.optimizer, self.workload, lr, self.seed)


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """One thread, deterministic algorithms; the previous settings put back on exit."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(strict)
        torch.set_num_threads(threads)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


@attrs.define
class _Trace:
    """The validation points of a run so far."""

    curve: list[tuple[int, float]] = attrs.Factory(list)
    seconds: list[float] = attrs.Factory(list)
    status: str = "not reached"
    reason: str = ""


def _evaluate(problem: Problem, optimizer: Any, step: int, trace: _Trace, clock: float) -> bool:
    """Add a validation point (optimizer in eval mode); False when the run diverged."""
    set_training(optimizer, False)
    value = problem.metric()
    set_training(optimizer, True)
    trace.curve.append((step, value))
    trace.seconds.append(clock)
    if not math.isfinite(value):
        trace.status, trace.reason = "diverged", f"validation metric {value} at step {step}"
    elif value > DIVERGED_FACTOR * trace.curve[0][1]:
        trace.status = "diverged"
        trace.reason = (
            f"validation metric {value:.4g} at step {step}, over {DIVERGED_FACTOR:g}x "
            f"its initial {trace.curve[0][1]:.4g}"
        )
    return trace.status != "diverged"


def _train(problem: Problem, optimizer: Any, spec: Workload, trace: _Trace) -> None:
    """The training loop: ``spec.steps`` steps, a validation point every ``eval_every``."""
    set_training(optimizer, True)
    training = warm_up = 0.0  # seconds of training (evaluations left out), of its warm-up
    _evaluate(problem, optimizer, 0, trace, training)
    for step in range(1, spec.steps + 1):
        began = time.perf_counter()
        loss = float(training_step(optimizer, problem.batch).detach())
        training += time.perf_counter() - began
        warm_up = training if step <= WARM_UP_STEPS else warm_up
        if not math.isfinite(loss):
            trace.status, trace.reason = "diverged", f"training loss {loss} at step {step}"
            return
        due = step % spec.eval_every == 0 or step == spec.steps
        if due and not _evaluate(problem, optimizer, step, trace, training):
            return
        if training - warm_up > MAX_SECONDS:
            trace.reason = (
                f"stopped at step {step}: over {MAX_SECONDS:g} s of training after "
                f"{WARM_UP_STEPS} warm-up steps"
            )
            return


def _hparams(lr: float | None) -> dict[str, Any]:
    return {} if lr is None else {"lr": lr}


def run_one(
    key: RunKey, spec: Workload, target: float | None, registry: Registry
) -> dict[str, Any]:
    """Run ``key`` and measure it: the record the results file keeps.

    A failure to build or step the optimizer is recorded (status ``failed``,
    with the reason), never raised: one broken entry never stops the board.

    Args:
        key: optimizer, workload, lr and seed.
        spec: the workload.
        target: the validation metric to reach (None: no target known).
        registry: where the optimizer is looked up.

    Returns:
        The record: the key's fields, ``status``, ``reason``, ``final_metric``,
        ``steps_to_target``, ``seconds_to_target``, ``target``, ``budget``,
        ``curve`` (``[step, metric]`` pairs), ``curve_seconds``, ``seconds``.
    """
    trace = _Trace()
    began = time.perf_counter()
    with deterministic():
        try:
            problem = spec.build(key.seed)
            optimizer = registry.create(
                key.optimizer, problem.model.named_parameters(), **_hparams(key.lr)
            )
            _train(problem, optimizer, spec, trace)
        except Exception as error:  # a broken entry is a result, not a crash
            trace.status, trace.reason = "failed", _first_line(error)
    return _record(key, spec, target, trace, time.perf_counter() - began)


def _record(
    key: RunKey, spec: Workload, target: float | None, trace: _Trace, seconds: float
) -> dict[str, Any]:
    reached = None
    if target is not None and trace.status == "not reached":
        reached = next((i for i, (_, v) in enumerate(trace.curve) if v <= target), None)
    status = "reached" if reached is not None else trace.status
    final = trace.curve[-1][1] if trace.curve and trace.status != "failed" else None
    return {
        "kind": "run",
        "optimizer": key.optimizer,
        "workload": key.workload,
        "lr": key.lr,
        "seed": key.seed,
        "status": status,
        "reason": trace.reason,
        "final_metric": None if final is None or not math.isfinite(final) else final,
        "steps_to_target": None if reached is None else trace.curve[reached][0],
        "seconds_to_target": None if reached is None else trace.seconds[reached],
        "target": target,
        "budget": spec.steps,
        "curve": [[step, value if math.isfinite(value) else None] for step, value in trace.curve],
        "curve_seconds": trace.seconds,
        "seconds": seconds,
    }

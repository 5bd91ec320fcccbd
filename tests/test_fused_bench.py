"""benchmarks/bench_cuda.py sizes its timed run on warmed steps, never on the JIT warm-up.

The benchmark's timing loop runs on any device (CUDA events on a GPU, wall
time elsewhere), so a CPU optimizer whose first step is slow, as a first
step that compiles kernels is, shows what the run is sized on.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from benchmark_modules import load_benchmark


class ColdStart(torch.optim.Optimizer):
    """Plain SGD whose first step takes ``cold`` seconds more, as a compiling step does."""

    def __init__(self, params: list[torch.nn.Parameter], cold: float) -> None:
        super().__init__(params, {"lr": 0.0})
        self.cold = cold
        self.calls = 0

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.cold)
        for group in self.param_groups:
            for param in group["params"]:
                param.add_(param.grad, alpha=-group["lr"])


def test_slow_warm_up_does_not_shorten_the_timed_run() -> None:
    """A 0.7 s first step (of 3 warm-up steps) used to cut 20 timed steps to 8."""
    bench = load_benchmark("bench_cuda.py")
    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.ones(4)
    optimizer = ColdStart([param], cold=0.7)
    timing = bench.time_steps(optimizer, 20, warmup=3)
    assert timing.steps == 20
    assert optimizer.calls == 3 + bench.PROBE_STEPS + 20
    assert timing.wall < 0.05 and timing.gpu == timing.wall  # the cold step is not in it


def test_slow_warmed_steps_are_fewer_but_never_under_the_minimum() -> None:
    bench = load_benchmark("bench_cuda.py")
    assert bench.timed_steps(0.001, 20, budget=2.0) == 20
    assert bench.timed_steps(0.1, 50, budget=2.0) == 20
    assert bench.timed_steps(1.0, 50, budget=2.0) == bench.MIN_STEPS
    assert bench.timed_steps(1.0, 4, budget=2.0) == 4

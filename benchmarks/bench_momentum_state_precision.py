"""Lion and SGD with momentum on low-precision state against fp32, all with ``impl="fused"``.

16 float32 matrices of 2048 x 2048 (64M parameters), fixed gradients, 2 warm
steps each, then 4 interleaved rounds of one step per optimizer; the median
step of each state precision and its ratio to the same algorithm's fp32 step.
int8, int4 and bf16 take the C step on the codes, each algorithm through its
:class:`optiplug.base.StateKernelSource`.

Usage: ``python benchmarks/bench_momentum_state_precision.py [--algorithm lion|sgd]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

import optiplug

HPARAMS: dict[str, dict[str, Any]] = {"lion": {"lr": 1e-4}, "sgd": {"lr": 0.01, "momentum": 0.9}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", action="append", choices=sorted(HPARAMS))
    algorithms = parser.parse_args().algorithm or sorted(HPARAMS)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(2048, 2048)) for _ in range(16)]
    for param in params:
        param.grad = torch.randn_like(param) * 0.01
    optimizers = {
        (algorithm, precision): optiplug.create(
            algorithm, params, impl="fused", state_precision=precision, **HPARAMS[algorithm]
        )
        for algorithm in algorithms
        for precision in ("fp32", "bf16", "int8", "int4")
    }
    for optimizer in optimizers.values():
        optimizer.step()
        optimizer.step()
    times: dict[tuple[str, str], list[float]] = {key: [] for key in optimizers}
    for _ in range(4):
        for key, optimizer in optimizers.items():
            began = time.perf_counter()
            optimizer.step()
            times[key].append(time.perf_counter() - began)
    for (algorithm, precision), found in times.items():
        step = statistics.median(found)
        base = statistics.median(times[(algorithm, "fp32")])
        print(f"{algorithm:4s} {precision:5s} {step * 1e3:7.1f} ms  {step / base:5.2f}x fp32")


if __name__ == "__main__":
    main()

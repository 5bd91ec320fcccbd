"""SGD with momentum on low-precision state against fp32, all with ``impl="fused"``.

16 float32 matrices of 2048 x 2048 (64M parameters), fixed gradients, 2 warm
steps, then 4 interleaved rounds of one step each; the median step per state
precision and its ratio to fp32's (torch's fused SGD kernel). int8, int4 and
bf16 take optiplug's C step on the codes.

Usage: ``python benchmarks/bench_sgd_state_precision.py``
"""

from __future__ import annotations

import statistics
import time

import torch

import optiplug


def main() -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(2048, 2048)) for _ in range(16)]
    for param in params:
        param.grad = torch.randn_like(param) * 0.01
    optimizers = {
        precision: optiplug.create(
            "sgd", params, impl="fused", momentum=0.9, lr=0.01, state_precision=precision
        )
        for precision in ("fp32", "bf16", "int8", "int4")
    }
    for optimizer in optimizers.values():
        optimizer.step()
        optimizer.step()
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(4):
        for name, optimizer in optimizers.items():
            began = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - began)
    base = statistics.median(times["fp32"])
    for name, found in times.items():
        step = statistics.median(found)
        print(f"sgd {name:5s} {step * 1e3:7.1f} ms  {step / base:5.2f}x fp32")


if __name__ == "__main__":
    main()

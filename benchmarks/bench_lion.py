"""Lion step time: optiplug's implementations (and other Lions, if installed) against the memory floor.

A Lion step must read the parameter, gradient and momentum and write the
parameter and momentum: 20 bytes per fp32 parameter. torch's fused SGD with
momentum moves exactly the same bytes with one kernel, so its step time,
measured in the same run, is the machine's floor for this traffic. The table
reports each optimizer's median step time, its ratio to that floor, and the
bandwidth it achieves (20 bytes x parameters / time). Steps are interleaved
(one step of each in turn), so load from other processes affects all alike.

Also timed when importable (never required): ``lion_pytorch.Lion``
(lucidrains) and ``pytorch_optimizer.Lion``.

    python benchmarks/bench_lion.py            # 64M parameters (16 x 4M), 10 timed steps
    python benchmarks/bench_lion.py --quick    # 8M parameters (2 x 4M), 3 timed steps
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from collections.abc import Callable

import torch

from optiplug_lion import Lion

BYTES_PER_PARAMETER = 20
TENSOR_NUMEL = 1 << 22
LR = 1e-4


def optimizers() -> dict[str, Callable]:
    """Name -> ``params -> optimizer`` for everything available here."""
    makers: dict[str, Callable] = {
        "floor: torch SGD fused, momentum": lambda p: torch.optim.SGD(
            p, lr=LR, momentum=0.9, fused=True
        ),
        "optiplug lion fused": lambda p: Lion(p, lr=LR, impl="fused"),
        "optiplug lion loop": lambda p: Lion(p, lr=LR, impl="loop"),
        "optiplug lion foreach": lambda p: Lion(p, lr=LR, impl="foreach"),
    }
    for module, label in (
        ("lion_pytorch", "lion-pytorch Lion"),
        ("pytorch_optimizer", "pytorch_optimizer Lion"),
    ):
        try:
            lion = importlib.import_module(module).Lion
        except (ImportError, AttributeError):
            continue
        makers[label] = lambda p, lion=lion: lion(p, lr=LR)
    return makers


def build(values: list[torch.Tensor], grads: list[torch.Tensor], make: Callable) -> tuple:
    params = [torch.nn.Parameter(v.clone()) for v in values]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad  # shared, read-only
    return make(params), params


def warm_up(runs: dict[str, tuple]) -> dict[str, float]:
    """Two steps each (the fused kernel compiles on the first); seconds taken."""
    taken = {}
    for name, (optimizer, _) in runs.items():
        start = time.perf_counter()
        optimizer.step()
        optimizer.step()
        taken[name] = time.perf_counter() - start
    return taken


def time_interleaved(runs: dict[str, tuple], steps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(steps):
        for name, (optimizer, _) in runs.items():
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def agreement(runs: dict[str, tuple]) -> str:
    """Largest difference of the fused and foreach parameters from the loop's."""
    reference = runs["optiplug lion loop"][1]
    parts = []
    for name in ("optiplug lion fused", "optiplug lion foreach"):
        worst = max(
            (a - b).abs().max().item() for a, b in zip(runs[name][1], reference, strict=True)
        )
        parts.append(f"{name.split()[-1]} {worst:.1e}")
    return "max |param - loop param|: " + ", ".join(parts)


def report(medians: dict[str, float], warm: dict[str, float], count: int) -> None:
    floor = medians["floor: torch SGD fused, momentum"]
    print(f"{'optimizer':<36}{'ms/step':>9}{'x floor':>9}{'GB/s':>7}{'warm-up s':>11}")
    for name, seconds in sorted(medians.items(), key=lambda item: item[1]):
        rate = BYTES_PER_PARAMETER * count / seconds / 1e9
        print(
            f"{name:<36}{seconds * 1e3:>9.1f}{seconds / floor:>9.2f}{rate:>7.1f}{warm[name]:>11.2f}"
        )
    fused = medians["optiplug lion fused"]
    for other in ("optiplug lion loop", "optiplug lion foreach"):
        print(f"fused is {medians[other] / fused:.2f}x faster than {other.split()[-1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8M parameters, 3 timed steps")
    parser.add_argument("--tensors", type=int, default=16, help="tensors of 4M parameters")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tensors, steps = (2, 3) if args.quick else (args.tensors, args.steps)
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(TENSOR_NUMEL, generator=generator) for _ in range(tensors)]
    grads = [torch.randn(TENSOR_NUMEL, generator=generator) for _ in range(tensors)]
    count = tensors * TENSOR_NUMEL
    print(
        f"{count / 2**20:.0f}M fp32 parameters in {tensors} tensors, {BYTES_PER_PARAMETER} bytes/param; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    runs = {name: build(values, grads, make) for name, make in optimizers().items()}
    warm = warm_up(runs)
    report(time_interleaved(runs, steps), warm, count)
    print(agreement(runs))


if __name__ == "__main__":
    main()

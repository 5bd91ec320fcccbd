"""Step time of AdamW with low-precision state, against the fp32 fused step and torchao.

Every optimizer steps the same parameters (``--tensors`` matrices of
``--rows`` x ``--cols`` float32, 64M elements by default) with the same fixed
gradients: optiplug's ``adamw`` with ``impl="fused"`` in fp32 (torch's fused
kernel, the reference), then with ``state_precision`` bf16, int8 and int4,
and torchao's AdamW8bit and AdamW4bit (the peer, when installed). Each is
warmed up (its state created), then each of its timed steps is paired with
a step of the reference taken just before or just after it (alternating),
so the ratio of a pair sees the same machine: on a shared machine the
reference alone drifts by a third between minutes. The report gives each
median step, the median of its paired ratios to the fp32 fused step and
the state's bytes per parameter as ``optiplug.memory`` measures them.

On a GPU (``--device cuda``) the low-precision groups take the decode,
torch's fused CUDA step, encode path, and the steps are timed between
``torch.cuda.synchronize()`` calls.

Usage: ``python benchmarks/bench_state_precision.py [--tensors 16] [--rows 2048] [--cols 2048] [--rounds 3] [--only int8] [--device cuda]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import optiplug

REFERENCE = "adamw fp32 (fused)"
"""The contender the others are measured against."""


def contenders() -> dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]]:
    """Name -> how to build it over the parameters."""
    made: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
        REFERENCE: lambda ps: optiplug.create("adamw", ps, lr=1e-3, impl="fused"),
    }
    for precision in ("bf16", "int8", "int4"):
        made[f"adamw {precision}"] = lambda ps, p=precision: optiplug.create(
            "adamw", ps, lr=1e-3, impl="fused", state_precision=p
        )
    try:
        from torchao.optim import AdamW4bit, AdamW8bit
    except ImportError:
        return made
    made["torchao AdamW8bit"] = lambda ps: AdamW8bit(ps, lr=1e-3)
    made["torchao AdamW4bit"] = lambda ps: AdamW4bit(ps, lr=1e-3)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="steps timed per round")
    parser.add_argument("--device", default="cpu", help="where the parameters live (cpu, cuda)")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="time only the contenders whose name holds this text (repeatable; fp32 fused always)",
    )
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    shape = (args.rows, args.cols)
    built: dict[str, tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]] = {}
    for name, make in contenders().items():
        if args.only and name != REFERENCE and not any(part in name for part in args.only):
            continue
        params = [
            torch.nn.Parameter(torch.randn(shape, generator=generator).to(args.device))
            for _ in range(args.tensors)
        ]
        for param in params:
            param.grad = (torch.randn(shape, generator=generator) * 1e-2).to(args.device)
        optimizer = make(params)
        optimizer.step()  # the state exists from here on
        built[name] = (optimizer, params)
    times, ratios = paired_times(built, args.rounds, args.steps)
    count = args.tensors * args.rows * args.cols
    where = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else (f"{torch.get_num_threads()} threads")
    )
    print(
        f"{count / 1e6:.0f}M float32 parameters in {args.tensors} tensors on {args.device} "
        f"({where}); median of {args.rounds * args.steps} paired steps"
    )
    print(f"{'optimizer':<22} {'step (ms)':>10} {'x fp32 fused':>13} {'state B/param':>14}")
    for name, (optimizer, _) in built.items():
        median = statistics.median(times[name])
        ratio = statistics.median(ratios[name]) if name in ratios else 1.0
        per_param = optiplug.memory(optimizer).total / count
        print(f"{name:<22} {median * 1e3:>10.1f} {ratio:>13.2f} {per_param:>14.3f}")


def timed_step(optimizer: torch.optim.Optimizer) -> float:
    """Seconds one ``optimizer.step()`` takes (its CUDA work finished, if any)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    optimizer.step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def paired_times(
    built: dict[str, tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]],
    rounds: int,
    steps: int,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each contender's step times, and their ratios to the reference step taken beside each."""
    times: dict[str, list[float]] = {name: [] for name in built}
    ratios: dict[str, list[float]] = {name: [] for name in built if name != REFERENCE}
    for round_index in range(rounds):
        for name in ratios:
            for step in range(steps):
                reference_first = (round_index + step) % 2 == 0
                pair = (REFERENCE, name) if reference_first else (name, REFERENCE)
                seconds = {member: timed_step(built[member][0]) for member in pair}
                for member, taken in seconds.items():
                    times[member].append(taken)
                ratios[name].append(seconds[name] / seconds[REFERENCE])
    return times, ratios


if __name__ == "__main__":
    main()

"""Muon step time: optiplug's muon against torch.optim.Muon, by method and batching.

The parameter set is GPT-2-small-shaped: 12 layers x {768x2304, 768x768,
768x3072, 3072x768} fp32 matrices (85M parameters) with fixed random
gradients. All optimizers use the same hyperparameters (lr=0.02,
momentum=0.95, Nesterov, 5 Newton-Schulz steps, no weight decay,
adjust_lr "original") and Newton-Schulz in bf16, as torch does. Steps are
interleaved (one step of each in turn) so load from other processes affects
all alike; the table shows the median and the best step time, and the speedup
over torch.optim.Muon from medians. optiplug runs at its default (one matrix
at a time on CPU, ns_method="auto"), batched (ns_batch=True) and with the
standard iteration only (ns_method="standard"). Afterwards it checks that each optiplug
variant's parameters equal torch's within the bf16 bound
``steps * lr * adjust * 2**-8``.

    python benchmarks/bench_muon.py            # 12 layers, 5 timed steps
    python benchmarks/bench_muon.py --quick    # 2 layers, 2 timed steps
    python benchmarks/bench_muon.py --state-precision int8   # adds int8 state rows

``--state-precision`` adds, per precision, optiplug's default muon with its
momentum stored so, and for int8/int4 the same without the low-rank factors
(a subclass naming no ``low_rank_slots``), so the factors' own cost shows;
those rows are not checked against torch (their state is rounded).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from optiplug_muon import Muon

SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768))
LOW_PRECISIONS = ("bf16", "int8", "int4")
"""What ``--state-precision`` takes: the rows it adds are named ``(precision...)``."""
LR = 0.02


def parameter_set(layers: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Start values and gradients of the GPT-2-shaped matrices."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [shape for _ in range(layers) for shape in SHAPES]
    values = [0.02 * torch.randn(s, generator=generator) for s in shapes]
    grads = [torch.randn(s, generator=generator) for s in shapes]
    return values, grads


def build(values: list[torch.Tensor], grads: list[torch.Tensor], make: Callable) -> tuple:
    """Fresh parameters (sharing the read-only gradients) and their optimizer."""
    params = [torch.nn.Parameter(v.clone()) for v in values]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    return make(params), params


class MuonWithoutFactors(Muon):
    """Muon whose int8/int4 momentum keeps no low-rank factors (codes and scales only)."""

    low_rank_slots = frozenset()


def optimizers(precisions: list[str]) -> dict[str, Callable]:
    common = {"momentum": 0.95, "nesterov": True, "weight_decay": 0.0}
    with_names = {"ns_dtype": torch.bfloat16, "adjust_lr": "original", **common}
    made: dict[str, Callable] = {
        "torch.optim.Muon": lambda p: torch.optim.Muon(p, lr=LR, adjust_lr_fn="original", **common),
        "optiplug muon (default)": lambda p: Muon(p, lr=LR, **with_names),
        "optiplug muon (ns_batch=True)": lambda p: Muon(p, lr=LR, ns_batch=True, **with_names),
        "optiplug muon (standard)": lambda p: Muon(p, lr=LR, ns_method="standard", **with_names),
    }
    for precision in precisions:
        low = {"state_precision": precision, **with_names}
        made[f"optiplug muon ({precision})"] = lambda p, low=low: Muon(p, lr=LR, **low)
        if precision != "bf16":
            made[f"optiplug muon ({precision}, no factors)"] = lambda p, low=low: (
                MuonWithoutFactors(p, lr=LR, **low)
            )
    return made


def time_interleaved(runs: dict[str, tuple], steps: int) -> dict[str, list[float]]:
    """One warm-up step each, then ``steps`` timed steps each, taking turns."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for optimizer, _ in runs.values():
        optimizer.step()
    for _ in range(steps):
        for name, (optimizer, _) in runs.items():
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
    return times


def max_error(params: list[torch.Tensor], reference: list[torch.Tensor]) -> tuple[float, float]:
    """Largest |difference| to torch's parameters, and the bf16 bound it must stay within."""
    worst, bound = 0.0, 0.0
    for ours, theirs in zip(params, reference, strict=True):
        rows, cols = ours.shape
        worst = max(worst, (ours - theirs).abs().max().item())
        bound = max(bound, math.sqrt(max(1, rows / cols)) * LR * 2**-8)
    return worst, bound


def report(times: dict[str, list[float]], runs: dict[str, tuple], steps: int) -> None:
    base = statistics.median(times["torch.optim.Muon"])
    reference = runs["torch.optim.Muon"][1]
    print(f"{'optimizer':<28}{'median s':>10}{'best s':>9}{'speedup':>9}  max |diff| vs torch")
    for name, values in times.items():
        median = statistics.median(values)
        worst, bound = max_error(runs[name][1], reference)
        check = f"  {worst:.2e} (bound {bound * (steps + 1):.2e})"
        if name.startswith("torch") or any(f"({p}" in name for p in LOW_PRECISIONS):
            check = ""  # torch itself, or rounded state: no bound to hold
        print(f"{name:<28}{median:>10.3f}{min(values):>9.3f}{base / median:>8.2f}x{check}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, 2 timed steps")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--state-precision",
        action="append",
        default=[],
        choices=LOW_PRECISIONS,
        help="add rows with the momentum stored so (repeatable)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    layers, steps = (2, 2) if args.quick else (args.layers, args.steps)
    values, grads = parameter_set(layers)
    count = sum(v.numel() for v in values)
    print(
        f"{layers} layers x {len(SHAPES)} matrices, {count / 1e6:.1f}M parameters, fp32, "
        f"NS in bf16; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bare tensors: the routing warning is expected
        made = optimizers(args.state_precision)
        runs = {name: build(values, grads, make) for name, make in made.items()}
    times = time_interleaved(runs, steps)
    report(times, runs, steps)


if __name__ == "__main__":
    main()

"""Step time of optiplug's sgd/adam/adamw implementations against torch's own.

For each algorithm and size, every variant (torch's loop/foreach/fused and
optiplug's loop/foreach/fused/default) steps over the *same* parameter and
gradient tensors, in interleaved rounds so that machine noise hits all of
them alike; the median step time of each is reported with two ratios:

* ``vs torch same``: optiplug implementation / torch with the same flags;
* ``vs torch best``: optiplug / torch's fastest variant in this run.

The acceptance figure is the default (``impl=None``) against torch's best.

Usage: ``python benchmarks/bench_torch_backed.py [--sizes 16M 64M] [--rounds 15] [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import optiplug
from optiplug._choice.chooser import chooser_of

TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
HPARAMS = {"sgd": {"lr": 1e-3, "momentum": 0.9}, "adam": {"lr": 1e-3}, "adamw": {"lr": 1e-3}}
TORCH_FLAGS = {
    "loop": {"foreach": False, "fused": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def parse_size(text: str) -> int:
    """``"16M"`` -> 16 * 2**20 elements."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return (
        int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)
    )


def make_params(total: int, count: int = 16) -> list[torch.nn.Parameter]:
    """``count`` fp32 parameters of ``total`` elements in all, with gradients."""
    generator = torch.Generator().manual_seed(0)
    params = []
    for _ in range(count):
        p = torch.nn.Parameter(torch.randn(total // count, generator=generator))
        p.grad = torch.randn(total // count, generator=generator)
        params.append(p)
    return params


def variants(name: str, params: list[torch.nn.Parameter]) -> dict[str, torch.optim.Optimizer]:
    """Every optimizer to time, keyed by label, all over the same tensors."""
    hparams = HPARAMS[name]
    found = {
        f"torch {impl}": TORCH[name](params, **hparams, **flags)
        for impl, flags in TORCH_FLAGS.items()
    }
    for impl in ("loop", "foreach", "fused"):
        found[f"optiplug {impl}"] = optiplug.create(name, params, impl=impl, **hparams)
    default = optiplug.create(name, params, **hparams)
    found[f"optiplug default ({default.impl})"] = default
    return found


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(optimizers: dict[str, torch.optim.Optimizer], rounds: int) -> dict[str, float]:
    """Median seconds per step of each optimizer, in interleaved rounds after one warm-up."""
    for optimizer in optimizers.values():
        optimizer.step()
    samples: dict[str, list[float]] = {label: [] for label in optimizers}
    for _ in range(rounds):
        for label, optimizer in optimizers.items():
            samples[label].append(timed(optimizer.step))
    return {label: statistics.median(times) for label, times in samples.items()}


def report(name: str, size: str, medians: dict[str, float]) -> list[str]:
    """Table rows for one algorithm and size."""
    torch_best = min(v for k, v in medians.items() if k.startswith("torch"))
    rows = []
    for label, seconds in medians.items():
        impl = label.split()[1]
        same = medians.get(f"torch {impl}")
        same_ratio = f"{seconds / same:.3f}" if same and label.startswith("optiplug") else "-"
        best = f"{seconds / torch_best:.3f}"
        rows.append(f"| {name} | {size} | {label} | {seconds * 1e3:.1f} | {same_ratio} | {best} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["16M", "64M"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--algorithms", nargs="+", default=list(TORCH))
    parser.add_argument("--quick", action="store_true", help="1M parameters, 5 rounds")
    args = parser.parse_args()
    sizes, rounds = (["1M"], 5) if args.quick else (args.sizes, args.rounds)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {rounds} rounds"
    )
    print("| algorithm | params | variant | ms/step | vs torch same | vs torch best |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        params = make_params(parse_size(size))
        for name in args.algorithms:
            chooser_of().clear()
            for row in report(name, size, measure(variants(name, params), rounds)):
                print(row, flush=True)
        del params


if __name__ == "__main__":
    main()

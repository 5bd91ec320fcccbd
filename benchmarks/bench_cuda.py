"""CUDA step time of AdamW and Lion: torch's kernels, every optiplug implementation, the HBM floor.

For each parameter set, every optimizer is built over its own copy of the
parameters (gradients are shared, set once, so optiplug-fused's pointer table
is reused as in a loop that zeroes gradients in place), warmed up (JIT
compiles, tables, state), sized on two warmed steps (never on the warm-up),
then timed over the same steps with CUDA events (GPU time) and
``time.perf_counter`` (wall time, which also counts the Python work of
issuing the step). Runs are sequential, each freed before the next.

The floor is the time the step's memory traffic takes at the bandwidth of an
in-place ``copy_`` measured in the same run (read + write): AdamW moves 28
bytes per fp32 parameter (read p, g, m, v; write p, m, v), Lion 20 (read p,
g, m; write p, m). For bf16 parameters optiplug-fused keeps fp32 state:
22 bytes (AdamW) and 14 (Lion); torch's own bf16 AdamW keeps bf16 state and
moves 14, so its "x floor" reads low there.

Parameter sets:

* ``a``: 256M fp32 parameters in 32 tensors (8M each);
* ``b``: 2,000 tensors of 64K fp32 elements;
* ``c``: 10,000 tensors of 4K fp32 elements (launch- and Python-bound);
* ``d``: 256M bf16 parameters in 32 tensors.

Targets on an H200 for ``triton``: <= 1.10x floor on (a), <= 1.5x on (b),
>= 20x faster than torch's fused AdamW (wall time) on (c).

    python benchmarks/bench_cuda.py                      # every set, adamw and lion
    python benchmarks/bench_cuda.py --sets a,c --algorithms adamw --steps 50
    python benchmarks/bench_cuda.py --sweep              # optiplug-fused's (BLOCK, num_warps)

``--sweep`` times optiplug-fused's AdamW for each candidate ``(BLOCK,
num_warps)`` (:func:`optiplug_fused.tuning.sweep`), fp32 then bf16, prints
one table per dtype and the fastest, then measures the sets with it.

Exits with a message when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import optiplug

LR = 1e-4
IMPLS = ("loop", "foreach", "fused", "triton")


@dataclass(frozen=True)
class ParamSet:
    """A parameter set: ``count`` tensors of ``numel`` elements of ``dtype``."""

    key: str
    label: str
    count: int
    numel: int
    dtype: torch.dtype

    @property
    def parameters(self) -> int:
        return self.count * self.numel


SETS = {
    "a": ParamSet("a", "256M fp32 in 32 tensors", 32, 1 << 23, torch.float32),
    "b": ParamSet("b", "2,000 x 64K fp32", 2000, 1 << 16, torch.float32),
    "c": ParamSet("c", "10,000 x 4K fp32", 10000, 1 << 12, torch.float32),
    "d": ParamSet("d", "256M bf16 in 32 tensors", 32, 1 << 23, torch.bfloat16),
}


def bytes_per_parameter(algorithm: str, dtype: torch.dtype) -> int:
    """Bytes a step moves per parameter with fp32 state (see the module docstring)."""
    size = torch.tensor([], dtype=dtype).element_size()
    state = 2 if algorithm == "adamw" else 1  # fp32 state tensors: m, v / m
    return 3 * size + 2 * 4 * state  # read p, g; write p; read and write each state


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def hbm_bandwidth(gib: float = 4.0, repeats: int = 20) -> float:
    """Bytes per second of an in-place device copy (read + write), median of ``repeats``."""
    numel = int(gib * 2**30) // 4 // 2
    src = torch.empty(numel, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = _event(), _event()
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)) / 1e3)
    moved = 2 * numel * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return float(moved / statistics.median(times))


def makers(
    algorithm: str,
) -> dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]]:
    """Name -> ``params -> optimizer`` for torch's kernels and every optiplug implementation."""
    found: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {}
    if algorithm == "adamw":
        found["torch AdamW fused"] = lambda p: torch.optim.AdamW(p, lr=LR, fused=True)
        found["torch AdamW foreach"] = lambda p: torch.optim.AdamW(p, lr=LR, foreach=True)
    available = {impl.name for impl in optiplug.default_registry().implementations(algorithm)}
    for impl in IMPLS:
        if impl in available:
            found[f"optiplug {algorithm} {impl}"] = _create(algorithm, impl)
    return found


def _create(
    algorithm: str, impl: str
) -> Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]:
    def make(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return optiplug.create(algorithm, params, impl=impl, lr=LR)

    return make


MIN_STEPS = 10
"""Timed steps never fall below this (nor below what was asked, if fewer)."""
PROBE_STEPS = 2
"""Warmed steps timed to size the run: the warm-up's compiles never count."""


@dataclass
class Timing:
    """Per-step GPU and wall seconds of one optimizer, over ``steps`` timed steps."""

    gpu: float
    wall: float
    steps: int


def _device_of(optimizer: torch.optim.Optimizer) -> torch.device:
    device: torch.device = next(p.device for g in optimizer.param_groups for p in g["params"])
    return device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(per_step: float, steps: int, budget: float) -> int:
    """How many steps to time: ``steps``, fewer when warmed steps would exceed ``budget`` s.

    Never fewer than ``MIN_STEPS`` (or ``steps`` when that is smaller).
    """
    fitting = int(budget / max(per_step, 1e-9))
    return max(min(MIN_STEPS, steps), min(steps, fitting))


def time_steps(
    optimizer: torch.optim.Optimizer, steps: int, warmup: int = 3, budget: float = 2.0
) -> Timing:
    """Warm up (JIT compiles, tables, state), size the run on warmed steps, then time it.

    GPU time from CUDA events (the wall time on a CPU), wall time from
    ``time.perf_counter``; the warm-up and the sizing steps are not timed.
    """
    device = _device_of(optimizer)
    for _ in range(warmup):
        optimizer.step()
    _synchronize(device)
    probe = time.perf_counter()
    for _ in range(PROBE_STEPS):
        optimizer.step()
    _synchronize(device)
    steps = timed_steps((time.perf_counter() - probe) / PROBE_STEPS, steps, budget)
    cuda = device.type == "cuda"
    begin, end = (_event(), _event()) if cuda else (None, None)
    wall_start = time.perf_counter()
    if begin is not None:
        begin.record()
    for _ in range(steps):
        optimizer.step()
    if end is not None:
        end.record()
        end.synchronize()
    wall = (time.perf_counter() - wall_start) / steps
    gpu = begin.elapsed_time(end) / 1e3 / steps if begin is not None and end else wall
    return Timing(gpu, wall, steps)


def run_set(spec: ParamSet, algorithm: str, bandwidth: float, steps: int) -> dict[str, Timing]:
    """Time every optimizer on ``spec``; prints one table."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    grads = [
        torch.randn(spec.numel, generator=generator, device="cuda").to(spec.dtype)
        for _ in range(spec.count)
    ]
    floor = bytes_per_parameter(algorithm, spec.dtype) * spec.parameters / bandwidth
    results: dict[str, Timing] = {}
    for name, make in makers(algorithm).items():
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad  # shared and kept: the triton table is reused
        try:
            optimizer = make(params)
            results[name] = time_steps(optimizer, steps)
        except Exception as error:  # one unavailable implementation must not end the run
            print(f"  {name}: skipped ({type(error).__name__}: {error})")
        finally:
            optimizer = None  # type: ignore[assignment]
            del params
            torch.cuda.empty_cache()
    print(
        f"\n{algorithm}, ({spec.key}) {spec.label}: floor {floor * 1e3:.3f} ms "
        f"({bytes_per_parameter(algorithm, spec.dtype)} B/param)"
    )
    print(f"  {'optimizer':<28}{'GPU ms':>10}{'wall ms':>10}{'x floor':>9}{'GB/s':>8}{'steps':>7}")
    for name, timing in sorted(results.items(), key=lambda item: item[1].wall):
        rate = bytes_per_parameter(algorithm, spec.dtype) * spec.parameters / timing.gpu / 1e9
        print(
            f"  {name:<28}{timing.gpu * 1e3:>10.3f}{timing.wall * 1e3:>10.3f}"
            f"{timing.gpu / floor:>9.2f}{rate:>8.0f}{timing.steps:>7}"
        )
    triton = results.get(f"optiplug {algorithm} triton")
    fused = results.get("torch AdamW fused")
    if triton is not None and fused is not None:
        print(
            f"  triton vs torch fused: {fused.wall / triton.wall:.1f}x faster (wall), "
            f"{fused.gpu / triton.gpu:.1f}x (GPU)"
        )
    return results


def print_sweep(steps: int) -> None:
    """Sweep optiplug-fused's launch configurations (fp32, bf16); the fp32 winner stays set."""
    from optiplug_fused import tuning

    chosen = {}
    for dtype in (torch.bfloat16, torch.float32):  # fp32 last: its winner is kept
        name = str(dtype).removeprefix("torch.")
        results = tuning.sweep("cuda", dtype=dtype, steps=steps)
        best = results[0]
        chosen[name] = best
        print(f"\nlaunch sweep, AdamW {name}, 64M parameters in 8 tensors (4 not a multiple of 8):")
        print(f"  {'BLOCK':>6}{'warps':>7}{'ms/step':>10}{'x best':>8}")
        for timing in results:
            print(
                f"  {timing.block:>6}{timing.num_warps:>7}{timing.seconds * 1e3:>10.3f}"
                f"{timing.seconds / best.seconds:>8.2f}"
            )
    print(
        "launch sweep best: "
        + ", ".join(f"{name} BLOCK={t.block} num_warps={t.num_warps}" for name, t in chosen.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="a,b,c,d", help="comma-separated: a, b, c, d")
    parser.add_argument("--algorithms", default="adamw,lion", help="adamw and/or lion")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (fewer if slow)")
    parser.add_argument(
        "--sweep", action="store_true", help="sweep optiplug-fused's (BLOCK, num_warps) first"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench_cuda.py needs a CUDA device: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); nothing was measured."
        )
    if args.sweep:
        print_sweep(args.steps)
    sets = [SETS[key.strip()] for key in args.sets.split(",") if key.strip()]
    algorithms = [name.strip() for name in args.algorithms.split(",") if name.strip()]
    bandwidth = hbm_bandwidth()
    print(
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}; "
        f"in-place copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write)"
    )
    for spec in sets:
        for algorithm in algorithms:
            run_set(spec, algorithm, bandwidth, args.steps)


if __name__ == "__main__":
    main()

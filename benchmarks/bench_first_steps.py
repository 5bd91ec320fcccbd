"""A fresh process's first steps: when does ``impl=None`` reach the fastest implementation?

``optiplug.create(name, params)`` returns at once on an implementation that
needs no build, measures the others in a background thread (building a
compiled one first) and switches between steps once the measurement is done;
the winner is written to the per-machine cache file, so a later process
starts on it. This runs, each in a fresh process with its own empty cache
directory (optiplug's and torch inductor's, so nothing built earlier helps):

1. ``create`` and ``--steps`` steps with ``impl=None``, recording each
   step's time and implementation;
2. the same again in a second process sharing the first one's cache
   directories (it should start on the winner);
3. ``optiplug bench``'s figures for the same sizes: each implementation
   forced, interleaved (median of 7 steps), in a third process.

It prints the seconds ``create`` took, the step at which the implementation
became the bench's fastest, and the median of the steps after the switch
against the bench's best. ``--native off`` sets ``OPTIPLUG_NATIVE=0``
(``torch.compile`` builds the fused kernel, as before the C kernels).

    python benchmarks/bench_first_steps.py                 # lion, 64 x 1M parameters
    python benchmarks/bench_first_steps.py --native off    # the torch.compile path

``--state-precision int8`` (or ``int4``, ``bf16``) measures instead the first
steps of ``adamw`` with its state in that precision and ``impl="fused"``,
whose C state step and the codec's C loops are built on first need in a
background thread while the steps run the torch ops: each step's time in a
fresh process with an empty cache directory, against the same with
``OPTIPLUG_NATIVE=0`` (the torch ops throughout), the step from which the C
step ran, and each C library's build time from an empty cache and its load
time from a kept one.

    python benchmarks/bench_first_steps.py --state-precision int8 --tensors 16 --numel 262144
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_RUN = r"""
import json, sys, time
started = time.perf_counter()
import torch
import optiplug
name, tensors, numel, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
generator = torch.Generator().manual_seed(0)
params = [torch.nn.Parameter(torch.randn(numel, generator=generator)) for _ in range(tensors)]
for param in params:
    param.grad = torch.randn(numel, generator=generator) * 1e-3
imported = time.perf_counter() - started
begin = time.perf_counter()
optimizer = optiplug.create(name, params, lr=1e-4)
created = time.perf_counter() - begin
rows = []
for _ in range(steps):
    begin = time.perf_counter()
    optimizer.step()
    rows.append([time.perf_counter() - begin, optimizer.impl])
print(json.dumps({"import": imported, "create": created, "steps": rows}))
"""

_BENCH = r"""
import json, statistics, sys, time
import torch
import optiplug
name, tensors, numel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
generator = torch.Generator().manual_seed(0)
values = [torch.randn(numel, generator=generator) for _ in range(tensors)]
grads = [torch.randn(numel, generator=generator) * 1e-3 for _ in range(tensors)]
runs = {}
for impl in sys.argv[4].split(","):
    params = [torch.nn.Parameter(v.clone()) for v in values]
    for param, grad in zip(params, grads):
        param.grad = grad
    runs[impl] = optiplug.create(name, params, lr=1e-4, impl=impl)
    runs[impl].step(); runs[impl].step()
times = {impl: [] for impl in runs}
for _ in range(7):
    for impl, optimizer in runs.items():
        begin = time.perf_counter(); optimizer.step(); times[impl].append(time.perf_counter() - begin)
print(json.dumps({impl: statistics.median(t) for impl, t in times.items()}))
"""


_RUN_STATE = r"""
import json, sys, time
import torch
import optiplug
from optiplug_adam.native import native_adam
precision, tensors, numel, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
generator = torch.Generator().manual_seed(0)
params = [torch.nn.Parameter(torch.randn(numel, generator=generator)) for _ in range(tensors)]
for param in params:
    param.grad = torch.randn(numel, generator=generator) * 1e-3
optimizer = optiplug.create("adamw", params, lr=1e-4, state_precision=precision, impl="fused")
rows, started = [], time.perf_counter()
for _ in range(steps):
    begin = time.perf_counter()
    optimizer.step()
    rows.append([time.perf_counter() - begin, native_adam(wait=False) is not None])
print(json.dumps({"steps": rows, "seconds": time.perf_counter() - started}))
"""

_BUILD_TIMES = r"""
import json, time
from optiplug.base import build_c_library
from optiplug._state import native_codec
from optiplug_adam import native as adam
from optiplug_lion import native as lion
from optiplug_lion.optimizer import Lion
from optiplug_sgd.native import SGD_STATE_KERNEL
sources = {
    "codec": (native_codec._SOURCE, "optiplug-codec"),
    "adam state step": (adam._SOURCE, "optiplug-adam"),
    "sgd state step": (SGD_STATE_KERNEL.c_source(), SGD_STATE_KERNEL.name),
    "lion state step": (Lion.state_kernel.c_source(), Lion.state_kernel.name),
    "lion fused": (lion._SOURCE, "optiplug-lion"),
}
found = {}
for label, (source, name) in sources.items():
    begin = time.perf_counter(); build_c_library(source, name=name)
    built = time.perf_counter() - begin
    begin = time.perf_counter(); build_c_library(source, name=name)
    found[label] = [built, time.perf_counter() - begin]
print(json.dumps(found))
"""


def _state_precision_steps(args: argparse.Namespace) -> None:
    """Each of the first steps of ``adamw`` in ``args.state_precision``, native on and off."""
    sizes = [args.state_precision, str(args.tensors), str(args.numel), str(args.steps)]
    runs = {}
    for native in ("1", "0"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "OPTIPLUG_CACHE_DIR": cache, "OPTIPLUG_NATIVE": native}
            runs[native] = _run(_RUN_STATE, sizes, env)
    with tempfile.TemporaryDirectory() as cache:
        builds = _run(_BUILD_TIMES, [], {**os.environ, "OPTIPLUG_CACHE_DIR": cache})
    on, off = runs["1"]["steps"], runs["0"]["steps"]
    c_from = next((index for index, (_, c) in enumerate(on) if c), None)
    print(
        f"adamw, state {args.state_precision}, impl fused, {args.tensors} x {args.numel}, "
        f"fresh process, empty cache; the C step ready from step {c_from}"
    )
    print("step  native on (ms)  OPTIPLUG_NATIVE=0 (ms)  on / off")
    for index, ((mine, c), (theirs, _)) in enumerate(zip(on, off, strict=True)):
        mark = " C" if c else ""
        print(
            f"{index:4d}  {1000 * mine:12.1f}{mark:2s}  {1000 * theirs:22.1f}  {mine / theirs:8.2f}"
        )
    late = on[c_from + 1 :] if c_from is not None else []
    if late:
        c_median = statistics.median(t for t, _ in late)
        torch_median = statistics.median(t for t, _ in off[c_from + 1 :])
        print(
            f"after the switch: median {1000 * c_median:.1f} ms against {1000 * torch_median:.1f} "
            f"ms, the torch path {torch_median / c_median:.1f}x slower"
        )
    print(
        f"all {args.steps} steps: {runs['1']['seconds']:.2f} s against {runs['0']['seconds']:.2f} s"
    )
    print("build from an empty cache / load from a kept one (s): " + ", ".join(
        f"{label} {built:.2f} / {loaded:.3f}" for label, (built, loaded) in builds.items()
    ))  # fmt: skip


def _run(code: str, args: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _switch_step(rows: list[list], best: str) -> int | None:
    """The first step from which every step ran ``best``."""
    for index in range(len(rows)):
        if all(impl == best for _, impl in rows[index:]):
            return index
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="lion")
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--impls", default="loop,foreach,fused")
    parser.add_argument("--native", choices=["on", "off"], default="on")
    parser.add_argument("--state-precision", choices=["int8", "int4", "bf16"], default=None)
    args = parser.parse_args()
    if args.state_precision is not None:
        _state_precision_steps(args)
        return
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor:
        env = {
            **os.environ,
            "OPTIPLUG_CACHE_DIR": cache,
            "TORCHINDUCTOR_CACHE_DIR": inductor,
            "OPTIPLUG_NATIVE": "1" if args.native == "on" else "0",
        }
        sizes = [args.algorithm, str(args.tensors), str(args.numel)]
        first = _run(_RUN, [*sizes, str(args.steps)], env)
        second = _run(_RUN, [*sizes, "5"], env)
        bench = _run(_BENCH, [*sizes, args.impls], env)
    best = min(bench, key=bench.__getitem__)
    switch = _switch_step(first["steps"], best)
    after = [t for t, _ in first["steps"][(switch or 0) + 2 :]] if switch is not None else []
    print(f"{args.algorithm}, {args.tensors} x {args.numel}, native kernels {args.native}")
    print("bench (ms): " + ", ".join(f"{k} {1000 * v:.1f}" for k, v in bench.items()))
    print(
        f"first process: import {first['import']:.2f} s, create {first['create']:.3f} s, "
        f"starts on {first['steps'][0][1]}, on {best} from step {switch}"
    )
    if after:
        median = statistics.median(after)
        print(
            f"  steps after the switch: median {1000 * median:.1f} ms = "
            f"{median / bench[best]:.2f}x the bench's best"
        )
    print(f"second process: create {second['create']:.3f} s, starts on {second['steps'][0][1]}")


if __name__ == "__main__":
    main()

"""Does ``impl=None`` reach the fastest implementation while other processes load the CPU?

Starts ``--spinners`` CPU-bound processes (2 by default: one per core of the
build machine), then, each in a fresh process with its own empty optiplug and
torch inductor cache directories (so nothing measured or built earlier helps):

1. ``optiplug.create(name, params)`` with ``impl=None`` and ``--steps`` steps,
   recording each step's time and implementation (bench_first_steps.py's
   script);
2. ``optiplug bench NAME`` at the same sizes, under the same load, for each
   implementation's median step time: the best of those is the reference.

The spinners are pure Python busy loops (``while True: pass``): each holds
one core's time slices and nothing else, so what the chooser meets is the
scheduler preempting its threads at random, the contention a busy shared
machine gives. A torch matmul loop would also compete for memory bandwidth
and its own intra-op threads, which slows the bandwidth-bound candidates
unequally and measures something other than preemption.

It prints, per repeat, the step from which every step ran the bench's best
implementation, the median of steps 20-25 (1-based; ``--window``) over
the bench's best, and the bench time of the implementation step 20 ran over
the best's (1.00 when the chooser runs the best: the step-time ratio also
carries the spinners' preemption, which differs between the two processes);
then the median of those over ``--repeats``.
``--no-load`` runs the same without spinners.

    python benchmarks/bench_chooser_under_load.py                # 2 spinners, 3 repeats
    python benchmarks/bench_chooser_under_load.py --no-load
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_first_steps import _RUN, _run, _switch_step

_SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def _spinning(count: int) -> Iterator[None]:
    """``count`` busy-looping processes for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def _bench(algorithm: str, tensors: int, numel: int, steps: int, env: dict[str, str]) -> dict:
    """``optiplug bench``'s ms/step per implementation (the ones timed)."""
    command = [sys.executable, "-m", "optiplug", "bench", algorithm, "--json"]
    command += ["--params", str(tensors * numel), "--tensors", str(tensors)]
    command += ["--steps", str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    (result,) = json.loads(done.stdout)
    rows = result["implementations"]
    return {
        "pick": result["pick"],
        "ms": {row["name"]: row["ms_per_step"] for row in rows if row["status"] == "ok"},
    }


def _fresh_env() -> tuple[contextlib.ExitStack, dict[str, str]]:
    stack = contextlib.ExitStack()
    cache = stack.enter_context(tempfile.TemporaryDirectory())
    inductor = stack.enter_context(tempfile.TemporaryDirectory())
    env = {**os.environ, "OPTIPLUG_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": inductor}
    return stack, env


def _once(args: argparse.Namespace) -> dict:
    """One repeat: the fresh process's steps, then the bench, each with fresh caches."""
    sizes = [args.algorithm, str(args.tensors), str(args.numel)]
    stack, env = _fresh_env()
    with stack:
        first = _run(_RUN, [*sizes, str(args.steps)], env)
    stack, env = _fresh_env()
    with stack:
        bench = _bench(args.algorithm, args.tensors, args.numel, args.bench_steps, env)
    best = min(bench["ms"], key=bench["ms"].__getitem__)
    low, high = args.window
    window = [seconds for seconds, _ in first["steps"][low - 1 : high]]
    at_low = first["steps"][low - 1][1]  # the implementation step ``low`` ran
    return {
        "at_window": at_low,
        "impl_ratio": bench["ms"][at_low] / bench["ms"][best],
        "steps": first["steps"],
        "bench": bench,
        "best": best,
        "reached": _switch_step(first["steps"], best),
        "ratio": 1e3 * statistics.median(window) / bench["ms"][best],
    }


def _report(run: dict, index: int, window: list[int]) -> None:
    bench = ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(run["bench"]["ms"].items()))
    used = [impl for _, impl in run["steps"]]
    changes = [f"{used[0]}@1"] + [
        f"{impl}@{i + 1}" for i, impl in enumerate(used) if i and impl != used[i - 1]
    ]
    print(
        f"repeat {index}: bench ms {bench} (bench's impl=None: {run['bench']['pick']}); "
        f"create ran {' -> '.join(changes)}; on {run['best']} from step "
        f"{None if run['reached'] is None else run['reached'] + 1}; "
        f"steps {window[0]}-{window[1]} median {run['ratio']:.2f}x the bench's best; "
        f"step {window[0]} ran {run['at_window']}, {run['impl_ratio']:.2f}x the best in the bench"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="lion")
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--bench-steps", type=int, default=5)
    parser.add_argument("--window", type=int, nargs=2, default=[20, 25])
    parser.add_argument("--spinners", type=int, default=2)
    parser.add_argument("--no-load", action="store_true", help="run without spinners")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print the raw runs")
    args = parser.parse_args()
    spinners = 0 if args.no_load else args.spinners
    print(
        f"{args.algorithm}, {args.tensors} x {args.numel}, {spinners} spinning processes, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    runs = []
    with _spinning(spinners):
        for index in range(1, args.repeats + 1):
            runs.append(_once(args))
            _report(runs[-1], index, args.window)
    reached = [run["reached"] for run in runs]
    ratios = [run["ratio"] for run in runs]
    chosen = [run["impl_ratio"] for run in runs]
    print(
        f"summary: best reached at step {[None if r is None else r + 1 for r in reached]}, "
        f"median ratio {statistics.median(ratios):.2f}x (runs {', '.join(f'{r:.2f}' for r in ratios)}); "
        f"the implementation run at step {args.window[0]} is "
        f"{', '.join(f'{r:.2f}' for r in chosen)}x the bench's best (its own bench time)"
    )
    if args.json:
        print(json.dumps(runs))


if __name__ == "__main__":
    main()

"""``optiplug_train.leaderboard``: plan the runs of a tier, run what the results file lacks, rank.

The smoke tier runs every selected entry on every workload at a small
log-spaced lr sweep around the entry's default lr (``lrs`` values a decade
apart from a tenth of it up, :func:`lr_grid`) on seed 0. The ranked tier takes the ``top``
entries of the board so far (most workloads reached, then mean rank) and
runs seeds ``0 .. seeds-1`` at each one's chosen lr (AdamW always among
them, as the baseline). Records go to the results file one at a time; a
run whose key is already there is skipped, so an interrupted board
resumes where it stopped.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from importlib import resources
from multiprocessing import get_context
from typing import IO, Any

import attrs

from optiplug import Registry, default_registry
from optiplug.errors import HyperparameterError

from .results import ResultsFile, key_of, machine, read_records
from .summary import BASELINE, Row, robustness, rows_of
from .targets import load_targets, load_tuned_lrs
from .workloads import WORKLOADS, Workload, workload

__all__ = ["TIERS", "Board", "leaderboard", "plan_ranked", "plan_smoke", "published_records"]

TIERS = ("smoke", "ranked")
_PUBLISHED = "published.jsonl"
_SMOKE_SEED = 0
_DEFAULT_LR = 1e-3  # for an entry whose lr has no default
_MARKS = ("start", "interrupted")


@attrs.frozen
class Board:
    """A leaderboard: its records and the rows ranked from them.

    Attributes:
        records: every record of the results file (headers included).
        rows: per optimizer and workload, ranked within each workload.
    """

    records: tuple[dict[str, Any], ...]
    rows: tuple[Row, ...]

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> Board:
        """The board of ``records`` (a results file's, or several merged)."""
        kept = tuple(dict(r) for r in records)
        return cls(records=kept, rows=tuple(rows_of(kept)))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Board:
        """The board of the results file ``path``."""
        return cls.from_records(read_records(path))

    def workload(self, name: str) -> list[Row]:
        """The rows of workload ``name``, best first."""
        return [row for row in self.rows if row.workload == name]

    def robustness(self) -> list[tuple[str, int, int, float]]:
        """Per optimizer: workloads reached, run, mean rank fraction; see :func:`robustness`."""
        return robustness(self.rows)


def published_records() -> list[dict[str, Any]]:
    """The published board's records, shipped with optiplug (the docs' board)."""
    source = resources.files(__package__).joinpath(_PUBLISHED)
    if not source.is_file():
        return []
    with resources.as_file(source) as path:
        return read_records(path)


def default_lr(name: str, registry: Registry) -> float | None:
    """The entry's registered default lr; None when it takes no lr."""
    spec = registry.spec(name)
    found = next((h for h in spec.hyperparameters if h.name == "lr"), None)
    if found is None:
        return None
    value = found.default
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return _DEFAULT_LR


def lr_grid(name: str, registry: Registry, count: int) -> list[float | None]:
    """``count`` lrs a decade apart from a tenth of the default up (``[None]`` without an lr).

    With the default 4: 0.1x, 1x, 10x and 100x the default; the grid leans up
    because the suite's models are small (tuned AdamW's lr is 3x to 30x its
    default of 1e-3 on them: ``targets.json``).
    """
    centre = default_lr(name, registry)
    if centre is None:
        return [None]
    return [float(f"{centre * 10.0**offset:.6g}") for offset in range(-1, count - 1)]


def plan_smoke(
    names: Sequence[str], workloads: Sequence[str], registry: Registry, lrs: int = 3
) -> list[tuple[str, str, float | None, int]]:
    """The smoke tier's run keys: every name, workload and lr of its grid, on seed 0.

    AdamW, the baseline, also runs at the lr its targets were derived with
    (``targets.json``), so the baseline row is lr-tuned AdamW, as in AlgoPerf.
    """
    grids = {name: lr_grid(name, registry, lrs) for name in names}
    tuned = load_tuned_lrs()
    return [
        (n, w, lr, _SMOKE_SEED)
        for n in names
        for w in workloads
        for lr in _with_tuned(grids[n], tuned.get(w) if n == BASELINE else None)
    ]


def _with_tuned(grid: list[float | None], tuned: float | None) -> list[float | None]:
    """``grid``, then ``tuned`` when it is not already in it."""
    return grid if tuned is None or tuned in grid else [*grid, tuned]


def plan_ranked(
    rows: Sequence[Row], workloads: Sequence[str], top: int, seeds: int, only: Sequence[str] = ()
) -> list[tuple[str, str, float | None, int]]:
    """The ranked tier's run keys: the ``top`` most robust entries (or ``only``) and AdamW."""
    order = [entry[0] for entry in robustness(rows)]
    chosen = list(only) if only else order[:top]
    chosen += [BASELINE] if BASELINE not in chosen else []
    lrs = {(row.optimizer, row.workload): row.lr for row in rows}
    return [
        (name, w, lrs[(name, w)], seed)
        for name in chosen
        for w in workloads
        if (name, w) in lrs
        for seed in range(seeds)
    ]


def _resolve(only: Sequence[str], provider: str | None, registry: Registry) -> list[str]:
    """The catalogue names to run: ``only`` (each checked), else all, of ``provider`` if given."""
    names = [registry.name_of(registry.spec(n)) for n in only] if only else registry.optimizers()
    if provider is None:
        return names
    kept = [n for n in names if provider in _providers(registry, n)]
    if not kept:
        raise HyperparameterError(
            "provider",
            provider,
            "provides none of the selected optimizers",
            algorithm="leaderboard",
        )
    return kept


def _providers(registry: Registry, name: str) -> set[str]:
    found = registry.spec(name).provider
    return set() if found is None else {found.plugin, found.distribution}


def _work(
    key: tuple[str, str, float | None, int], spec: Workload, target: float | None
) -> dict[str, Any]:
    """Run one key in a worker process (the default registry, discovered there)."""
    from .runner import RunKey, run_one  # deferred: imports torch

    return run_one(RunKey(*key), spec, target, default_registry())


class _Progress:
    """One line per finished run, with the estimated time left."""

    def __init__(self, total: int, jobs: int, stream: IO[str] | None) -> None:
        self.total, self.jobs, self.stream = total, jobs, stream
        self.done, self.began = 0, time.perf_counter()

    def update(self, record: Mapping[str, Any]) -> None:
        self.done += 1
        if self.stream is None:
            return
        spent = time.perf_counter() - self.began
        left = spent / self.done * (self.total - self.done)
        lr = "-" if record["lr"] is None else f"{record['lr']:.3g}"
        print(
            f"[{self.done}/{self.total}] {record['optimizer']} {record['workload']} lr={lr} "
            f"seed={record['seed']}: {record['status']} ({record['seconds']:.1f} s); "
            f"about {_duration(left)} left",
            file=self.stream,
            flush=True,
        )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _execute(
    keys: Sequence[tuple[str, str, float | None, int]],
    specs: Mapping[str, Workload],
    out: ResultsFile,
    jobs: int,
    progress: _Progress,
    registry: Registry,
) -> None:
    targets = load_targets()
    if jobs == 1:
        _run_in_process(keys, specs, targets, out, progress, registry)
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_work, key, specs[key[1]], targets.get(key[1])) for key in keys]
        try:
            for future in as_completed(futures):
                out.append(future.result())
                progress.update(out.records[-1])
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _run_in_process(
    keys: Sequence[tuple[str, str, float | None, int]],
    specs: Mapping[str, Workload],
    targets: Mapping[str, float],
    out: ResultsFile,
    progress: _Progress,
    registry: Registry,
) -> None:
    """Run ``keys`` one by one, each between a ``start`` marker and its record."""
    from .runner import RunKey, run_one  # deferred: imports torch

    ended = deaths(out.records)
    for key in keys:
        marker = _as_record(key)
        record = _died(key, specs[key[1]], targets.get(key[1]), ended[key_of(marker)])
        if record is None:
            out.append({"kind": "start", **marker})
            try:
                record = run_one(RunKey(*key), specs[key[1]], targets.get(key[1]), registry)
            except KeyboardInterrupt:
                out.append({"kind": "interrupted", **marker})
                raise
        out.append(record)
        progress.update(record)


MAX_DEATHS = 2
"""A run whose process ended this many times during it is recorded ``failed``, not retried."""


def deaths(records: Iterable[Mapping[str, Any]]) -> Counter[tuple[str, str, float | None, int]]:
    """Per key: how many of its runs started and ended with their process, before a record."""
    count: Counter[tuple[str, str, float | None, int]] = Counter()
    for record in records:
        kind = record.get("kind")
        if kind in _MARKS:
            count[key_of(record)] += 1 if kind == "start" else -1
        elif kind == "run":
            count.pop(key_of(record), None)
    return count


def _died(
    key: tuple[str, str, float | None, int], spec: Workload, target: float | None, deaths: int
) -> dict[str, Any] | None:
    """The ``failed`` record of a run that ended its process :data:`MAX_DEATHS` times, else None.

    A run that brings the interpreter down (a crash in native code, the
    out-of-memory killer) would otherwise stop every resumed board at the
    same place; one death is taken for an outside kill and retried.
    """
    if deaths < MAX_DEATHS:
        return None
    return {
        "kind": "run",
        **_as_record(key),
        "status": "failed",
        "reason": f"the process ended during this run {deaths} times (a crash or a kill)",
        "final_metric": None,
        "steps_to_target": None,
        "seconds_to_target": None,
        "target": target,
        "budget": spec.steps,
        "curve": [],
        "curve_seconds": [],
        "seconds": 0.0,
    }


def leaderboard(
    *,
    only: Sequence[str] = (),
    provider: str | None = None,
    tier: str = "smoke",
    results: str | os.PathLike[str] = "leaderboard.jsonl",
    workloads: Sequence[str] = (),
    lrs: int = 4,
    seeds: int = 5,
    top: int = 20,
    steps: int | None = None,
    jobs: int = 1,
    registry: Registry | None = None,
    stream: IO[str] | None = sys.stderr,
) -> Board:
    """Measure the catalogue (or ``only`` / ``provider``) on the workload suite.

    Runs already in ``results`` are skipped: call it again after an
    interruption and it goes on where it stopped.

    Args:
        only: catalogue names to run (default: every installed optimizer).
        provider: keep only the optimizers of this plugin or distribution.
        tier: ``"smoke"`` (lr sweep, seed 0) or ``"ranked"`` (``seeds`` seeds
            at the chosen lr, for the ``top`` entries of the board in
            ``results``, or for ``only``).
        results: the JSON-lines results file to append to.
        workloads: workload names (default: all of :data:`WORKLOADS`).
        lrs: lr values per entry in the smoke tier.
        seeds: seeds per entry in the ranked tier.
        top: entries in the ranked tier.
        steps: cap each workload's step budget (a quick check; the targets stay).
        jobs: parallel worker processes.
        registry: where the optimizers are looked up (default: the default registry).
        stream: where progress lines go (None: nowhere).

    Returns:
        The :class:`Board` of everything in ``results``.

    Raises:
        HyperparameterError: an unknown tier or workload, a count below 1, a
            provider with none of the selected optimizers.
        UnknownOptimizerError: a name of ``only`` is not installed.
    """

    registry = registry or default_registry()
    _check(tier, lrs, seeds, top, jobs, steps)
    specs = {name: _capped(workload(name), steps) for name in (workloads or WORKLOADS)}
    out = ResultsFile(results)
    try:
        if tier == "smoke":
            keys = plan_smoke(_resolve(only, provider, registry), list(specs), registry, lrs)
        else:
            names = _resolve(only, provider, registry) if only or provider else ()
            keys = plan_ranked(rows_of(out.records), list(specs), top, seeds, names)
        done = out.done()
        todo = [k for k in keys if key_of(_as_record(k)) not in done]
        out.append(_header(tier, keys, jobs))
        _execute(todo, specs, out, jobs, _Progress(len(todo), jobs, stream), registry)
    finally:
        out.close()
    return Board.from_records(out.records)


def _as_record(key: tuple[str, str, float | None, int]) -> dict[str, Any]:
    return dict(zip(("optimizer", "workload", "lr", "seed"), key, strict=True))


def _header(
    tier: str, keys: Sequence[tuple[str, str, float | None, int]], jobs: int
) -> dict[str, Any]:
    return {
        "kind": "header",
        "tier": tier,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seeds": sorted({k[3] for k in keys}),
        "runs": len(keys),
        "jobs": jobs,
        **machine(),
    }


def _capped(spec: Workload, steps: int | None) -> Workload:
    if steps is None or steps >= spec.steps:
        return spec
    return attrs.evolve(spec, steps=steps, eval_every=min(spec.eval_every, steps))


def _check(tier: str, lrs: int, seeds: int, top: int, jobs: int, steps: int | None) -> None:
    if tier not in TIERS:
        raise HyperparameterError("tier", tier, f"must be one of {TIERS}", algorithm="leaderboard")
    counts = {"lrs": lrs, "seeds": seeds, "top": top, "jobs": jobs, "steps": steps or 1}
    for field, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HyperparameterError(
                field, value, "must be an integer >= 1", algorithm="leaderboard"
            )


Board.__module__ = "optiplug_train"  # its public home, as the docs name it
leaderboard.__module__ = "optiplug_train"

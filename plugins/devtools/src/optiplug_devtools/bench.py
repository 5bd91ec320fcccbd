"""``optiplug bench``: every implementation's step time at a given size, against a copy floor.

For one algorithm (or all of them) the command builds ``--params``
parameters in ``--tensors`` equal tensors on ``--device``, creates the
optimizer once per implementation (forced with ``impl=``), runs untimed
warm-up steps (compilation, first call, state allocation), then times
``--steps`` rounds of one step per implementation, interleaved, and reports
each one's median. The floor is an in-place copy moving the bytes per
parameter the algorithm's update must move (read the parameter, its
gradient and every per-parameter state slot; write the parameter and the
slots), for the element-wise algorithms whose traffic that describes. The
implementation ``impl=None`` picks at this size is measured afresh (or taken
from the autotune cache file, as ``impl=None`` does) and marked;
``--clear-cache`` removes that file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from optiplug import ImplementationSpec, OptimizerSpec, Registry
from optiplug.cli import format_bytes, format_table, parse_count, parse_param, read_negative_values
from optiplug.errors import OptiplugError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPES",
    "WARMUP_STEPS",
    "AlgorithmBench",
    "ImplementationTime",
    "available_memory",
    "bench_algorithm",
    "bytes_per_parameter",
    "check_memory",
    "configure",
    "format_bench",
    "memory_needed",
    "run",
]

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""``--dtype`` choices and the torch dtype each names (the long names are accepted too)."""

WARMUP_STEPS = 2
"""Untimed steps per implementation before the timed rounds."""

_PICK_MARK = "*"

_ELEMENTWISE = "elementwise"
"""The capability an algorithm declares for an element-wise step (``OptimizerSpec.capabilities``)."""


@attrs.frozen
class ImplementationTime:
    """One implementation's row.

    Attributes:
        name: the implementation (``"default"`` for an algorithm without any:
            its own factory).
        status: ``"ok"``, ``"unavailable"``, ``"unsupported"`` or ``"failed"``.
        ms_per_step: median milliseconds per step (None unless ``ok``).
        times_floor: ``ms_per_step`` over the floor (None without both).
        reason: why it was not timed.
        picked: whether ``impl=None`` picks it at this size.
    """

    name: str
    status: str
    ms_per_step: float | None = None
    times_floor: float | None = None
    reason: str = ""
    picked: bool = False


@attrs.frozen
class AlgorithmBench:
    """One algorithm's benchmark.

    Attributes:
        algorithm: its name.
        parameters: parameters timed (``tensors`` x ``shape``).
        tensors: how many tensors.
        shape: each tensor's shape.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        steps: timed rounds.
        threads: torch's intra-op threads while timing.
        bytes_per_param: bytes the update moves per parameter, None when the
            floor does not apply.
        floor_ms: milliseconds of an in-place copy moving those bytes.
        floor_note: why there is no floor, when there is none.
        pick: the implementation ``impl=None`` picks, or None.
        implementations: one row each.
    """

    algorithm: str
    parameters: int
    tensors: int
    shape: tuple[int, ...]
    device: str
    dtype: str
    steps: int
    threads: int
    bytes_per_param: int | None
    floor_ms: float | None
    floor_note: str
    pick: str | None
    implementations: tuple[ImplementationTime, ...]


def _dtype_name(text: str) -> str:
    """``--dtype``: ``fp32``/``bf16``/``fp16`` (or ``float32``/``bfloat16``/``float16``)."""
    lowered = text.strip().lower()
    for short, long in DTYPES.items():
        if lowered in (short, long):
            return short
    raise argparse.ArgumentTypeError(
        f"unknown dtype {text!r}; choose from {', '.join(DTYPES)} (or {', '.join(DTYPES.values())})"
    )


def _positive(text: str) -> int:
    """``--steps``: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` command's arguments to ``parser``.

    No option of ``bench`` starts with a dash and a digit, so a value such
    as ``--params -4M`` is read as the option's value (as Python 3.14's
    argparse reads it), and refused as not positive, instead of argparse's
    "expected one argument" before Python 3.14.

    Args:
        parser: the subcommand's parser.
    """
    read_negative_values(parser)
    parser.add_argument(
        "algorithm", nargs="?", default="all", help="an optimizer name, or all (default)"
    )
    parser.add_argument(
        "--params",
        type=parse_count,
        default=parse_count("1M"),
        metavar="N",
        help="parameters in all (7B, 64M, 1M, 1.3b, 7e9; default 1M)",
    )
    parser.add_argument(
        "--tensors",
        type=parse_count,
        default=8,
        metavar="K",
        help="split into K equal tensors (default 8)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default: cpu")
    parser.add_argument(
        "--dtype", type=_dtype_name, default="fp32", help="fp32 (default), bf16 or fp16"
    )
    parser.add_argument(
        "--steps", type=_positive, default=5, help="timed rounds, one step each (default 5)"
    )
    parser.add_argument(
        "--threads",
        type=_positive,
        metavar="N",
        help="intra-op threads on the CPU (default: torch's own choice)",
    )
    parser.add_argument(
        "--param",
        type=parse_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a hyperparameter, e.g. momentum=0.9 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--clear-cache",
        action="store_true",
        help="remove the autotune cache file (the choices impl=None keeps per machine) and exit",
    )


def run(args: argparse.Namespace) -> int:
    """Benchmark ``args.algorithm`` (or every algorithm) and print the table.

    Args:
        args: the parsed arguments (``algorithm``, ``params``, ``tensors``,
            ``device``, ``dtype``, ``steps``, ``threads``, ``param``, ``json``,
            ``clear_cache``, ``registry``); ``clear_cache`` only removes the
            autotune cache file.

    Returns:
        0.

    Raises:
        UnknownOptimizerError: an unknown algorithm (with a did-you-mean).
        OptiplugError: ``--device cuda`` without a CUDA device, more tensors
            than parameters, or more memory needed than is available
            (:func:`check_memory`, before anything is allocated).
        HyperparameterError: a bad ``--param``.
    """
    import torch  # deferred: imports torch

    if getattr(args, "clear_cache", False):
        return _clear_cache(json_output=args.json)
    registry: Registry = args.registry
    if args.tensors > args.params:
        raise OptiplugError(
            f"--tensors: {args.tensors:,} tensors cannot hold --params {args.params:,} parameters"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise OptiplugError("--device: cuda was asked for, but no CUDA device is available")
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(args.threads)
    if args.algorithm == "all":
        specs = registry.optimizer_specs()
    else:
        specs = [registry.spec(args.algorithm)]
    overrides = {key.replace("-", "_"): value for key, value in args.param}
    for spec in specs:
        wanted = overrides if args.algorithm != "all" else _known(spec, overrides)
        check_memory(registry, spec, wanted, args.params, args.dtype, args.device)
    results = []
    for spec in specs:
        results.append(
            bench_algorithm(
                registry,
                spec,
                parameters=args.params,
                tensors=args.tensors,
                device=args.device,
                dtype=args.dtype,
                steps=args.steps,
                overrides=overrides if args.algorithm != "all" else _known(spec, overrides),
            )
        )
    if args.json:
        print(json.dumps([attrs.asdict(result) for result in results], indent=2))
    else:
        print("\n\n".join(format_bench(result) for result in results))
    return 0


def _clear_cache(*, json_output: bool) -> int:
    """Remove the autotune cache file and say so; 0, or 1 where it cannot be removed."""
    from optiplug import autotune  # deferred: imports torch

    where = autotune.cache_path()
    try:
        removed = autotune.clear_cache()
    except OSError as error:
        print(
            f"optiplug: cannot clear the autotune cache {where}: {error.strerror}", file=sys.stderr
        )
        return 1
    if json_output:
        print(json.dumps({"cache": str(where), "removed": removed}))
    else:
        print(f"removed {where}" if removed else f"no autotune cache at {where}")
    return 0


def _validated(
    registry: Registry, spec: OptimizerSpec, hparams: Mapping[str, Any]
) -> dict[str, Any]:
    """``spec``'s defaults under ``hparams``, checked as :meth:`Registry.factory` checks them.

    Raises:
        HyperparameterError: naming the algorithm, field and value.
    """
    registry.factory(registry.name_of(spec), **hparams)
    return {**spec.defaults, **hparams}


def _autotune_enabled() -> bool:
    from optiplug.autotune import autotune_enabled  # deferred: imports torch

    return autotune_enabled()


def _known(spec: OptimizerSpec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--param`` values ``spec`` takes (with ``all``, each algorithm gets its own)."""
    names = {h.name for h in spec.hyperparameters}
    return {key: value for key, value in overrides.items() if key in names}


def _shape(per_tensor: int) -> tuple[int, ...]:
    """A matrix holding ``per_tensor`` elements or slightly fewer: power-of-two columns.

    Matrices, not vectors, so that algorithms that treat matrices specially
    (muon) run their matrix path.
    """
    columns = 1 << max(0, (per_tensor.bit_length() - 1) // 2)
    return (max(1, per_tensor // columns), columns)


def bytes_per_parameter(
    spec: OptimizerSpec, hparams: Mapping[str, Any], itemsize: int
) -> int | None:
    """Bytes an element-wise update of ``spec`` moves per parameter, or None.

    Read the parameter, its gradient and each per-parameter state slot
    present for ``hparams``; write the parameter and the slots: Adam in fp32
    moves 28 bytes (read p, g, m, v; write p, m, v), SGD with momentum 20,
    without 12, Lion 20.

    Args:
        spec: the algorithm.
        hparams: its hyperparameters (which decide conditional slots).
        itemsize: bytes per parameter element.

    Returns:
        The bytes; None for an algorithm whose spec does not declare the
        ``"elementwise"`` capability (muon) or declares no state layout.
    """
    if _ELEMENTWISE not in spec.capabilities or spec.state_slots is None:
        return None
    # read p and g, write p; read and write each state slot
    return 3 * itemsize + 2 * _state_bytes_per_parameter(spec, hparams, itemsize)


def _state_bytes_per_parameter(
    spec: OptimizerSpec, hparams: Mapping[str, Any], itemsize: int
) -> int:
    """Bytes of the ``"param"``-shaped state slots present for ``hparams``, per parameter."""
    return sum(
        4 if slot.dtype == "float32" else itemsize
        for slot in spec.state_slots or ()
        if slot.shape == "param" and slot.present_for(hparams)
    )


def memory_needed(
    spec: OptimizerSpec,
    hparams: Mapping[str, Any],
    parameters: int,
    itemsize: int,
    *,
    implementations: int,
) -> int:
    """Bytes a benchmark of ``parameters`` parameters holds at once, at most.

    The parameters and their gradients, a copy of both with the optimizer
    state for each implementation (every optimizer is kept until all are
    timed), and the copy floor's two buffers (:func:`bytes_per_parameter`).

    Args:
        spec: the algorithm (its declared ``"param"``-shaped state slots count).
        hparams: its hyperparameters (which decide conditional slots).
        parameters: parameters in all.
        itemsize: bytes per parameter element.
        implementations: implementations timed (at least one: its own factory).

    Returns:
        The bytes.
    """
    built = max(1, implementations)
    state = _state_bytes_per_parameter(spec, hparams, itemsize)
    floor = bytes_per_parameter(spec, hparams, itemsize) or 0
    return parameters * ((1 + built) * 2 * itemsize + built * state + floor)


def available_memory() -> tuple[int, str] | None:
    """The host memory a new allocation can take, and what limits it, or None when unknown.

    The least of: ``MemAvailable`` in ``/proc/meminfo`` (else the free
    physical pages ``os.sysconf`` reports), the memory cgroup's limit less
    its usage (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), and the
    address-space and data-size limits (``ulimit -v``, ``ulimit -d``) less
    what the process maps.

    Returns:
        ``(bytes, where the bound comes from)``, or None when nothing is known.
    """
    found = list(_memory_bounds())
    return min(found) if found else None


def _memory_bounds() -> Iterator[tuple[int, str]]:
    meminfo = _read_fields(Path("/proc/meminfo"))
    if "MemAvailable" in meminfo:
        yield _kib(meminfo["MemAvailable"]), "MemAvailable in /proc/meminfo"
    else:
        pages = _sysconf("SC_AVPHYS_PAGES")
        if pages is not None:
            yield pages * (_sysconf("SC_PAGE_SIZE") or 4096), "free pages from os.sysconf"
    cgroups = (
        (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
        (
            Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
            Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
        ),
    )
    for limit_file, usage_file in cgroups:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:
            yield max(0, limit - usage), f"the memory cgroup's {limit_file} less its usage"
    status = _read_fields(Path("/proc/self/status"))
    for row, mapped, name in (
        ("Max address space", "VmSize", "RLIMIT_AS (ulimit -v)"),
        ("Max data size", "VmData", "RLIMIT_DATA (ulimit -d)"),
    ):
        limit = _soft_limit(row)
        if limit is not None and mapped in status:
            yield max(0, limit - _kib(status[mapped])), f"{name} less the process's {mapped}"


def _read_fields(path: Path) -> dict[str, str]:
    """``Name: value`` lines of a ``/proc`` file (empty when it cannot be read)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return {
        name.strip(): value.strip() for name, _, value in (line.partition(":") for line in lines)
    }


def _kib(value: str) -> int:
    """``"123 kB"`` as bytes."""
    return int(value.split()[0]) << 10


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None  # absent, unreadable, or "max"


def _sysconf(name: str) -> int | None:
    try:
        value = os.sysconf(name)
    except (AttributeError, ValueError, OSError):
        return None  # not on this platform
    return value if value > 0 else None


def _soft_limit(row: str) -> int | None:
    """The soft limit on ``row`` of ``/proc/self/limits``, in bytes; None when unlimited."""
    try:
        lines = Path("/proc/self/limits").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(row):
            soft = line[len(row) :].split()[0]
            return int(soft) if soft.isdigit() else None
    return None


def check_memory(
    registry: Registry,
    spec: OptimizerSpec,
    overrides: Mapping[str, Any],
    parameters: int,
    dtype: str,
    device: str,
) -> None:
    """Refuse, before anything is allocated, a benchmark that cannot fit in memory.

    Args:
        registry: where ``spec``'s implementations are registered.
        spec: the algorithm.
        overrides: ``--param`` values over its example hyperparameters.
        parameters: ``--params``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        device: ``"cpu"`` or ``"cuda"``.

    Raises:
        OptiplugError: :func:`memory_needed` exceeds what is available (the
            free memory of the CUDA device, or :func:`available_memory`);
            states both numbers and where the bound comes from.
        HyperparameterError: a bad override.
    """
    import torch  # deferred: imports torch

    from optiplug.autotune import availability_reason  # deferred: imports torch

    itemsize = getattr(torch, DTYPES[dtype]).itemsize
    hparams = _validated(registry, spec, {**spec.example_hparams, **overrides})
    runnable = [
        impl for impl in registry.implementations(spec.name) if availability_reason(impl) is None
    ]
    needed = memory_needed(spec, hparams, parameters, itemsize, implementations=len(runnable))
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        bound: tuple[int, str] | None = (free, f"free memory on cuda:{torch.cuda.current_device()}")
    else:
        bound = available_memory()
    if bound is None or needed <= bound[0]:
        return
    available, source = bound
    copies = f"{max(1, len(runnable))} implementation(s)"
    raise OptiplugError(
        f"--params {parameters:,}: {spec.name} needs about {format_bytes(needed)} "
        f"({needed // parameters:,} B per {dtype} parameter: the parameters and gradients, a "
        f"copy of them with the optimizer state for each of its {copies}, and the copy "
        f"floor's buffers), but only {format_bytes(available)} is available ({source}); "
        "give a smaller --params"
    )


def _make_params(
    tensors: int, shape: tuple[int, ...], device: str, dtype: torch.dtype
) -> list[torch.Tensor]:
    import torch  # deferred: imports torch

    generator = torch.Generator(device=device).manual_seed(0)
    made: list[torch.Tensor] = []
    for _ in range(tensors):
        values = torch.randn(shape, generator=generator, device=device).to(dtype)
        param = torch.nn.Parameter(values)
        param.grad = torch.randn(shape, generator=generator, device=device).to(dtype)
        made.append(param)
    return made


def _clone(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    import torch  # deferred: imports torch

    copies: list[torch.Tensor] = []
    for param in params:
        copy = torch.nn.Parameter(param.detach().clone())
        copy.grad = None if param.grad is None else param.grad.clone()
        copies.append(copy)
    return copies


def _median_ms(step: Callable[[], Any], steps: int, device: torch.device) -> float:
    return 1e3 * statistics.median(_timed(step, device) for _ in range(steps))


def _timed(step: Callable[[], Any], device: torch.device) -> float:
    """Seconds ``step()`` takes, the device synchronized before and after."""
    _synchronize(device)
    start = time.perf_counter()
    step()
    _synchronize(device)
    return time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        import torch  # deferred: imports torch

        torch.cuda.synchronize(device)


def _floor_ms(parameters: int, moved: int, steps: int, device: torch.device) -> float:
    """An in-place copy of ``parameters * moved / 2`` bytes (read once, written once).

    The buffers are float32 (a byte-wise copy is slower on some CPUs), so the
    bytes are rounded up to a multiple of 4.
    """
    import torch  # deferred: imports torch

    size = max(1, -(-parameters * moved // 8))
    source = torch.ones(size, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    for _ in range(WARMUP_STEPS):
        target.copy_(source)
    return _median_ms(lambda: target.copy_(source), steps, device)


def _pick(
    spec: OptimizerSpec,
    candidates: Sequence[ImplementationSpec],
    params: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
) -> str | None:
    """What ``impl=None`` picks for these parameters, by a fresh chooser (no choice kept in memory).

    The autotune cache file is read as ``impl=None`` reads it.
    """
    from optiplug.autotune import ImplementationChooser  # deferred: imports torch

    chosen = ImplementationChooser().select(spec.name, candidates, None, params, hparams)
    return None if chosen is None else chosen.name


def bench_algorithm(
    registry: Registry,
    spec: OptimizerSpec,
    *,
    parameters: int,
    tensors: int,
    device: str,
    dtype: str,
    steps: int,
    overrides: Mapping[str, Any] | None = None,
) -> AlgorithmBench:
    """Time every implementation of ``spec`` at one size, and the copy floor.

    Args:
        registry: where ``spec`` and its implementations are registered.
        spec: the algorithm.
        parameters: parameters in all (rounded down to ``tensors`` equal matrices).
        tensors: how many tensors.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        steps: timed rounds (one step per implementation each, interleaved).
        overrides: hyperparameters over the algorithm's defaults and example.

    Returns:
        The benchmark.

    Raises:
        HyperparameterError: a bad override.
    """
    import torch  # deferred: imports torch

    torch_dtype = getattr(torch, DTYPES[dtype])
    where = torch.device(device)
    shape = _shape(parameters // tensors)
    params = _make_params(tensors, shape, device, torch_dtype)
    hparams = _validated(registry, spec, {**spec.example_hparams, **(overrides or {})})
    candidates = registry.implementations(spec.name)
    rows: dict[str, ImplementationTime] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    for impl in candidates:
        status, reason = _status(impl, params)
        if status != "ok":
            rows[impl.name] = ImplementationTime(impl.name, status, reason=reason)
            continue
        built = _warmed(registry, spec, _clone(params), hparams, impl.name)
        if isinstance(built, str):
            rows[impl.name] = ImplementationTime(impl.name, "failed", reason=built)
        else:
            optimizers[impl.name] = built
    if not candidates:
        built = _warmed(registry, spec, _clone(params), hparams, None)
        if isinstance(built, str):
            rows["default"] = ImplementationTime("default", "failed", reason=built)
        else:
            optimizers["default"] = built
    pick = _pick(spec, candidates, params, hparams) if candidates else None
    timed = _interleaved(optimizers, steps, where)
    moved = bytes_per_parameter(spec, hparams, torch_dtype.itemsize)
    count = tensors * shape[0] * shape[1]
    floor = _floor_ms(count, moved, steps, where) if moved is not None else None
    for name, ms in timed.items():
        ratio = ms / floor if floor else None
        rows[name] = ImplementationTime(name, "ok", ms, ratio, picked=name == pick)
    if "default" in timed:
        reason = "no implementations registered: the algorithm's own factory"
        rows["default"] = attrs.evolve(rows["default"], reason=reason)
    ordered = tuple(rows[name] for name in sorted(rows))
    return AlgorithmBench(
        algorithm=spec.name,
        parameters=count,
        tensors=tensors,
        shape=shape,
        device=device,
        dtype=dtype,
        steps=steps,
        threads=torch.get_num_threads(),
        bytes_per_param=moved,
        floor_ms=floor,
        floor_note=(
            "" if moved is not None else "n/a: not an element-wise update with a known state layout"
        ),
        pick=pick,
        implementations=ordered,
    )


def _status(impl: ImplementationSpec, params: Sequence[torch.Tensor]) -> tuple[str, str]:
    """``("ok", "")``, or ``("unavailable" | "unsupported" | "failed", reason)``."""
    from optiplug.autotune import availability_reason, tensor_kinds  # deferred: imports torch

    reason = availability_reason(impl)
    if reason is not None:
        return "unavailable", reason
    try:
        runs = impl.can_run(params)
    except Exception as error:
        return "failed", f"its supports check raised {type(error).__name__}: {error}"
    if not runs:
        return "unsupported", f"does not support {tensor_kinds(params)} parameters"
    return "ok", ""


def _warmed(
    registry: Registry,
    spec: OptimizerSpec,
    params: list[torch.Tensor],
    hparams: Mapping[str, Any],
    impl: str | None,
) -> torch.optim.Optimizer | str:
    """The optimizer forced to ``impl`` after its warm-up steps, or why it failed.

    The parameters are named like a model's hidden matrices, so an algorithm
    that routes by name (muon) treats them as such.
    """
    named = [(f"blocks.{index}.weight", param) for index, param in enumerate(params)]
    try:
        optimizer = registry.create(spec.name, named, impl=impl, **hparams)
        for _ in range(WARMUP_STEPS):
            optimizer.step()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return optimizer


def _interleaved(
    optimizers: Mapping[str, torch.optim.Optimizer], steps: int, device: torch.device
) -> dict[str, float]:
    """Median ms per step of each optimizer over ``steps`` interleaved rounds."""
    names = list(optimizers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(steps):
        shift = index % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            times[name].append(_timed(optimizers[name].step, device))
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def format_bench(result: AlgorithmBench) -> str:
    """The benchmark of one algorithm as a heading and a table.

    Args:
        result: what :func:`bench_algorithm` measured.

    Returns:
        Lines of text; the implementation ``impl=None`` picks is marked ``*``.
    """
    shape = "x".join(str(n) for n in result.shape)
    lines = [
        f"{result.algorithm}: {result.parameters:,} {result.dtype} parameters in "
        f"{result.tensors:,} tensors of {shape} on {result.device} ({result.threads} "
        f"intra-op thread{'s' if result.threads != 1 else ''}); median of "
        f"{result.steps} interleaved steps after {WARMUP_STEPS} untimed",
    ]
    if result.floor_ms is not None:
        lines.append(
            f"floor: in-place copy of {result.bytes_per_param} B/param: {result.floor_ms:.3f} ms"
        )
    else:
        lines.append(f"floor: {result.floor_note}")
    rows = []
    for row in result.implementations:
        mark = f"{row.name} {_PICK_MARK}" if row.picked else row.name
        ms = f"{row.ms_per_step:.3f}" if row.ms_per_step is not None else "-"
        ratio = f"{row.times_floor:.2f}" if row.times_floor is not None else "n/a"
        note = row.status if not row.reason else f"{row.status}: {row.reason}"
        if row.picked:
            note += " (impl=None picks it)"
        rows.append([mark, ms, ratio if row.status == "ok" else "-", note])
    lines.append(format_table(["implementation", "ms/step", "x floor", "status"], rows))
    if result.pick is None and any(row.name != "default" for row in result.implementations):
        lines.append("impl=None: no implementation can run these parameters here")
    elif not _autotune_enabled():
        lines.append("impl=None: chosen by priority (OPTIPLUG_AUTOTUNE is off)")
    return "\n".join(lines)

"""``optiplug schedule NAME --steps N``: print a schedule's curve, optionally plot it.

The table shows about 20 evenly spaced steps plus the steps on either side of
each phase change (end of warm-up, start of decay, end). ``--plot out.png``
writes the curve with matplotlib (the ``plot`` extra), without touching
pyplot's global state.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._core.registry import Registry
from .._text import format_table
from ..errors import OptiplugError

__all__ = [
    "check_plot_path",
    "configure",
    "parse_param",
    "plot_formats",
    "plot_schedule",
    "run",
    "table_steps",
]

_BAR_WIDTH = 30
_PLOT_POINTS = 2000
_MATPLOTLIB_MISSING = (
    "--plot needs matplotlib, which is not installed; install it with: pip install 'optiplug[plot]'"
)


def parse_param(text: str) -> tuple[str, Any]:
    """Parse one ``--param key=value``; the value is a Python literal or else a string.

    Args:
        text: ``"warmup_steps=100"``, ``"decay=linear"``, ``"milestones=[30, 60]"``.

    Returns:
        ``(key, value)``.

    Raises:
        argparse.ArgumentTypeError: no ``=`` or an empty key.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = raw.strip()
    return key.strip(), value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``schedule`` command's arguments to ``parser``."""
    parser.add_argument("name", help="schedule name (see `optiplug list`)")
    parser.add_argument(
        "--steps", type=int, required=True, help="show steps 0..N (also total_steps if unset)"
    )
    parser.add_argument(
        "--param",
        type=parse_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a schedule parameter (repeatable); values are Python literals",
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="also write the curve as an image (.png, .pdf, .svg...)"
    )
    parser.add_argument("--points", type=int, default=20, help="evenly spaced rows (default 20)")


def table_steps(schedule: Any, steps: int, points: int = 20) -> list[int]:
    """Steps to tabulate: evenly spaced over [0, steps] plus each side of every key step.

    Args:
        schedule: the schedule (its ``key_steps()`` is used when present).
        steps: the last step to show.
        points: number of evenly spaced intervals.

    Returns:
        Sorted, distinct steps in ``[0, steps]``.
    """
    points = max(1, points)
    chosen = {round(i * steps / points) for i in range(points + 1)}
    for key in _key_steps(schedule):
        chosen.update({key - 1, key})
    return sorted(step for step in chosen if 0 <= step <= steps)


def _key_steps(schedule: Any) -> dict[int, str]:
    key_steps = getattr(schedule, "key_steps", None)
    return dict(key_steps()) if callable(key_steps) else {}


def _table(schedule: Any, steps: Sequence[int]) -> str:
    values = [schedule(step) for step in steps]
    top = max([1.0, *values])
    notes = _key_steps(schedule)
    rows = [
        [step, f"{value:.6g}", "#" * round(_BAR_WIDTH * value / top), notes.get(step, "")]
        for step, value in zip(steps, values, strict=True)
    ]
    return format_table(["step", "multiplier", "", "note"], rows)


def plot_schedule(schedule: Any, steps: int, path: str | Path, *, title: str = "") -> Path:
    """Plot ``schedule`` over steps ``0..steps`` into an image file.

    Args:
        schedule: the schedule.
        steps: the last step to plot.
        path: output file; the format follows its suffix (``.png``).
        title: the figure title; defaults to the schedule's repr.

    Returns:
        The path written.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from matplotlib.figure import Figure  # deferred: optional dependency

    count = min(steps + 1, _PLOT_POINTS)
    xs = sorted({round(i * steps / max(1, count - 1)) for i in range(count)} | {steps})
    xs = sorted(set(xs) | {k for k in _key_steps(schedule) if 0 <= k <= steps})
    figure = Figure(figsize=(6.4, 3.2), layout="constrained")
    axes = figure.subplots()
    axes.plot(xs, [schedule(x) for x in xs], linewidth=1.8)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("lr multiplier")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.set_title(title or _title(schedule), fontsize=9)
    figure.savefig(path, dpi=110)
    return Path(path)


_FALLBACK_FORMATS = (
    "eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff",
    "webp",
)  # fmt: skip
"""Image formats matplotlib writes, when matplotlib cannot be asked."""


def plot_formats() -> tuple[str, ...]:
    """The image file extensions a plot can be written as, without the dot, sorted.

    Returns:
        What ``matplotlib.backend_bases.FigureCanvasBase.get_supported_filetypes()``
        says, or a fixed list (png, pdf, svg...) when matplotlib is not installed.
    """
    try:
        from matplotlib.backend_bases import FigureCanvasBase  # deferred: optional dependency
    except ImportError:
        return _FALLBACK_FORMATS
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def check_plot_path(path: str | os.PathLike[str], option: str = "--plot") -> None:
    """Refuse, before any work, an image path that could not be written.

    Args:
        path: the image file to write.
        option: the option that named it, for the message.

    Raises:
        OptiplugError: the extension is not an image format matplotlib writes
            (or there is none), the path is a directory, or its directory does
            not exist, is not a directory, or is not writable.
    """
    target = Path(path)
    if target.is_dir():
        raise OptiplugError(f"{option} {str(path)!r}: is a directory; give an image file's path")
    formats = plot_formats()
    suffix = target.suffix.lower().lstrip(".")
    if suffix not in formats:
        what = f"unsupported image format {target.suffix!r}" if suffix else "no file extension"
        raise OptiplugError(
            f"{option} {str(path)!r}: {what}; name the file with one of: "
            f"{', '.join('.' + name for name in formats)}"
        )
    parent = target.parent
    if not parent.exists():
        raise OptiplugError(
            f"{option} {str(path)!r}: the directory {str(parent)!r} does not exist; create it first"
        )
    if not parent.is_dir():
        raise OptiplugError(f"{option} {str(path)!r}: {str(parent)!r} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OptiplugError(
            f"{option} {str(path)!r}: the directory {str(parent)!r} is not writable"
        )


def _title(schedule: Any) -> str:
    """The schedule's name and parameters, wrapped to fit above the plot."""
    to_dict = getattr(schedule, "to_dict", None)
    if not callable(to_dict):
        return repr(schedule)
    params = {k: v for k, v in to_dict().items() if k != "name"}
    text = f"{getattr(schedule, 'name', '')}: " + ", ".join(f"{k}={v!r}" for k, v in params.items())
    return textwrap.fill(text, width=90)


def _matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def run(args: argparse.Namespace) -> int:
    """Print the schedule's table and, with ``--plot``, write the image.

    Args:
        args: parsed arguments (``name``, ``steps``, ``param``, ``plot``, ``points``,
            ``registry``).

    Returns:
        0 on success; 2 when matplotlib is missing.

    Raises:
        UnknownScheduleError: no such schedule.
        HyperparameterError: a missing or invalid schedule parameter.
        OptiplugError: ``--steps`` below 1, or a ``--plot`` path that could
            not be written (checked before anything is computed).
    """
    if args.steps < 1:
        raise OptiplugError(
            f"--steps {args.steps} must be an integer >= 1 (the table shows steps 0 to N)"
        )
    if args.plot and not _matplotlib_available():
        print(f"optiplug: error: {_MATPLOTLIB_MISSING}", file=sys.stderr)
        return 2
    if args.plot:
        check_plot_path(args.plot)
    schedule = _build(args.registry, args.name, dict(args.param), args.steps)
    print(repr(schedule))
    print(_table(schedule, table_steps(schedule, args.steps, args.points)))
    if args.plot:
        print(f"wrote {plot_schedule(schedule, args.steps, args.plot)}")
    return 0


def _build(registry: Registry, name: str, kwargs: dict[str, Any], steps: int) -> Any:
    """Schedule ``name`` of ``registry``; ``total_steps`` defaults to ``steps`` when it takes one."""
    factory = registry.schedule_spec(name).factory
    if "total_steps" not in kwargs and _accepts(factory, "total_steps"):
        kwargs["total_steps"] = steps
    return registry.schedule(name, **kwargs)


def _accepts(factory: Any, keyword: str) -> bool:
    try:
        return keyword in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False

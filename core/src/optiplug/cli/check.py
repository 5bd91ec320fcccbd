"""``optiplug check PATH``: verify a checkpoint directory and say what it holds.

Exit status 0 when the checkpoint is intact and its state valid, 1 when it
is missing, truncated, tampered with or holds invalid state (the reason is
printed: on one line for a damaged checkpoint, naming the file). Given a run
directory written by ``optiplug train --save`` (``train.json`` beside a
``checkpoint/`` directory), it checks that checkpoint and says so. Importing
this module does not import torch.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._text import format_table
from ..errors import CheckpointError

if TYPE_CHECKING:
    from ..checkpoint import CheckpointInfo

__all__ = ["checkpoint_path", "configure", "describe_checkpoint", "run"]

_RUN_FILE = "train.json"
_RUN_CHECKPOINT = "checkpoint"
"""What ``optiplug train --save DIR`` writes in ``DIR`` (``optiplug_train.config.RUN_FILE``
and ``optiplug_train.checkpoints.CHECKPOINT_NAME``; ``cli`` sits below ``_train``)."""
_HIDDEN_KEYS = frozenset({"foreach", "fused", "capturable", "differentiable"})
_ROWS = 20


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``check``'s arguments."""
    parser.add_argument(
        "path",
        help="a checkpoint directory written by optiplug.checkpoint.save, or a run "
        "directory written by `optiplug train --save` (its checkpoint/ is checked)",
    )
    parser.add_argument(
        "--all", action="store_true", help=f"list every parameter (default: the first {_ROWS})"
    )


def run(args: argparse.Namespace) -> int:
    """Verify ``args.path`` against ``args.registry``; print the verdict and contents.

    Args:
        args: the parsed arguments (``path``, ``all``, ``registry``).

    Returns:
        0 when the checkpoint is intact and its state valid, else 1.
    """
    from ..checkpoint import verify  # deferred: imports torch

    path = checkpoint_path(args.path)
    if path != Path(args.path):
        print(f"{args.path}: a run directory (`optiplug train --save`); checking {path}")
    try:
        info = verify(path, registry=args.registry)
    except CheckpointError as error:
        print(f"{path}: INVALID checkpoint: {_one_line(error)}")
        return 1
    verdict = "OK" if not info.problems else f"INVALID state ({len(info.problems)} problem(s))"
    print(f"{path}: {verdict}")
    print(describe_checkpoint(info, rows=None if args.all else _ROWS))
    if info.problems:
        print("\nproblems:")
        print("\n".join(f"  - {problem}" for problem in info.problems))
        return 1
    return 0


def checkpoint_path(path: str | os.PathLike[str]) -> Path:
    """The checkpoint to check for ``path``: its ``checkpoint/`` when it is a run directory.

    A run directory is what ``optiplug train --save DIR`` writes: ``DIR/train.json``
    (the run's options) beside the Graph's checkpoint in ``DIR/checkpoint/``.

    Args:
        path: what the user named.

    Returns:
        ``path/checkpoint`` for a run directory (even when that is missing, so
        the verdict names it), else ``path`` itself.
    """
    given = Path(path)
    if (given / _RUN_FILE).is_file():  # a checkpoint has no train.json
        return given / _RUN_CHECKPOINT
    return given


def _one_line(error: Exception) -> str:
    """The error's message on one line (a crafted file may put line breaks in it)."""
    return " ".join(str(error).split())


def describe_checkpoint(info: CheckpointInfo, rows: int | None = _ROWS) -> str:
    """A human summary of a verified checkpoint.

    Args:
        info: what :func:`optiplug.checkpoint.verify` returned.
        rows: how many parameters to list (None: all).

    Returns:
        Indented lines: id, algorithm, plugin, versions, sizes, steps,
        hyperparameters, extra data, then a table of parameters.
    """
    lines = [
        f"checkpoint   {info.checkpoint_id} (saved {info.created})",
        f"algorithm    {info.algorithm} ({_implementation(info)}; {info.optimizer_class})",
        f"plugin       {info.plugin or '-'}",
        f"saved with   {', '.join(f'{k} {v}' for k, v in sorted(info.versions.items()))}",
        f"parameters   {_parameters(info)}",
        f"steps        {_steps(info.steps)}",
        f"tensors      {info.tensor_count}, {_size(info.tensor_bytes)} (sha256 {info.sha256[:16]}...)",
    ]
    lines += [f"group {i:<6} {_hyperparameters(g)}" for i, g in enumerate(info.hyperparameters)]
    if info.extra:
        lines.append(f"extra        {', '.join(sorted(info.extra))}")
    return "\n".join("  " + line for line in lines) + "\n\n" + _table(info, rows)


def _implementation(info: CheckpointInfo) -> str:
    return f"implementation {info.implementation}" if info.implementation else "implementation -"


def _parameters(info: CheckpointInfo) -> str:
    elements = sum(math.prod(p.shape) for p in info.parameters)
    groups = len(info.hyperparameters)
    return f"{len(info.parameters)} in {groups} group(s), {elements:,} elements"


def _steps(steps: Sequence[float]) -> str:
    if not steps:
        return "- (no step slot saved)"
    text = [f"{s:g}" for s in (steps[0], steps[-1])]
    return text[0] if len(steps) == 1 else f"{text[0]}..{text[1]} ({len(steps)} distinct)"


def _size(count: int) -> str:
    size, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"


def _hyperparameters(group: dict[str, Any]) -> str:
    shown = [f"{k}={_value(v)}" for k, v in group.items() if k not in _HIDDEN_KEYS]
    return ", ".join(shown) or "-"


def _value(value: Any) -> str:
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return f"tensor({item()!r})"
    return repr(value)


def _table(info: CheckpointInfo, rows: int | None) -> str:
    shown = info.parameters if rows is None else info.parameters[:rows]
    body = [
        [p.index, p.name or "-", p.group, list(p.shape), p.dtype, ", ".join(p.slots) or "-"]
        for p in shown
    ]
    table = format_table(["index", "name", "group", "shape", "dtype", "state"], body)
    hidden = len(info.parameters) - len(shown)
    more = f"\n... {hidden} more (use --all)" if hidden else ""
    return "\n".join("  " + line for line in table.splitlines()) + more

"""Saving a run (``--save``, ``--save-every``) and resuming it (``--resume``).

A saved run is a directory holding the Graph's ``checkpoint/`` and the run's
options in ``train.json`` (see :mod:`optiplug_train.config`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from optiplug import Graph, Registry
from optiplug.errors import OptiplugError

from .config import RUN_FILE, TrainConfig, read_run_file, run_file_payload
from .data import Corpus
from .optim import make_schedule

__all__ = ["CHECKPOINT_NAME", "require_checkpoints", "resume_run", "save_run"]

CHECKPOINT_NAME = "checkpoint"


def require_checkpoints(graph: Graph, option: str) -> None:
    """Refuse ``option`` (``--save``, ``--resume``) when the Graph cannot save and load.

    Raises:
        OptiplugError: this version's Graph lacks ``save``/``load``.
    """
    if not (hasattr(graph, "save") and hasattr(graph, "load")):
        raise OptiplugError(
            f"{option} needs Graph.save/Graph.load, which this version of optiplug lacks"
        )


def save_run(graph: Graph, config: TrainConfig, corpus: Corpus) -> Path:
    """Save the Graph to ``save/checkpoint`` and the run's options to ``save/train.json``.

    Every process calls it (the Graph coordinates its own checkpoint); rank 0
    writes ``train.json``, atomically. When a write fails (a full disk...),
    the directories this call created are removed again; an earlier
    checkpoint there is untouched.

    Args:
        graph: the run's Graph.
        config: the run (``config.save`` is the directory).
        corpus: its corpus (its vocabulary is saved).

    Returns:
        The save directory.

    Raises:
        OptiplugError: the save failed (for a full disk: "no space left"),
            or the Graph refused to save.
    """
    if config.save is None:
        raise ValueError("save_run needs config.save")
    directory = Path(config.save)
    created = _first_missing(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        graph.save(directory / CHECKPOINT_NAME)
        if graph.rank == 0:
            _write_run_file(directory, run_file_payload(config, corpus.vocab, graph.training_step))
    except (OSError, OptiplugError) as error:
        _remove(created)
        cause = error if isinstance(error, OSError) else error.__cause__
        if not isinstance(cause, OSError):
            raise  # the Graph refused (a non-finite state...): its own message
        raise OptiplugError(
            _save_failure(directory, graph.training_step, cause, created)
        ) from error
    return directory


def _first_missing(directory: Path) -> Path | None:
    """The outermost of ``directory`` and its parents that does not exist yet, if any."""
    missing = None
    for path in (directory, *directory.parents):
        if os.path.lexists(path):
            return missing
        missing = path
    return missing


def _remove(created: Path | None) -> None:
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


def _write_run_file(directory: Path, payload: dict[str, object]) -> None:
    temporary = directory / f".{RUN_FILE}.tmp"
    try:
        temporary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, directory / RUN_FILE)
    finally:
        temporary.unlink(missing_ok=True)


_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _save_failure(directory: Path, step: int, error: OSError, created: Path | None) -> str:
    reason = error.strerror or str(error)
    what = "no space left" if error.errno in _NO_SPACE else "cannot write"
    undone = (
        f"removed {created}, which this run had created"
        if created is not None
        else "an earlier checkpoint there is untouched"
    )
    return f"--save {directory}: {what} to save step {step} ({reason}); {undone}"


def resume_run(graph: Graph, config: TrainConfig, corpus: Corpus, registry: Registry) -> None:
    """Load the run saved in ``config.resume`` into ``graph``.

    Args:
        graph: the freshly built Graph of the same run.
        config: the run (``config.resume`` is the directory).
        corpus: its corpus (its vocabulary must be the saved one).
        registry: where the schedule is looked up when ``--steps`` changed.

    Raises:
        OptiplugError: not a saved run, or one of different characters.
    """
    if config.resume is None:
        raise ValueError("resume_run needs config.resume")
    require_checkpoints(graph, "--resume")
    saved = read_run_file(config.resume)
    if saved["vocab"] != corpus.vocab:
        raise OptiplugError(
            f"--resume {config.resume!r}: the corpus's characters differ from the saved run's"
        )
    graph.load(Path(config.resume) / CHECKPOINT_NAME)
    if saved["steps"] != config.steps:  # a longer (or shorter) run: stretch the schedule
        graph.set_scheduler(make_schedule(config, registry))

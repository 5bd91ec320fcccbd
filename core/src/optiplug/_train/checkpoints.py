"""Saving a run (``--save``, ``--save-every``) and resuming it (``--resume``).

A saved run is a directory holding the Graph's ``checkpoint/`` and the run's
options in ``train.json`` (see :mod:`optiplug._train.config`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .._core import ranks as _ranks
from .._core.registry import Registry
from .._graph.graph import Graph
from ..errors import OptiplugError
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
    writes ``train.json``, atomically.

    Args:
        graph: the run's Graph.
        config: the run (``config.save`` is the directory).
        corpus: its corpus (its vocabulary is saved).

    Returns:
        The save directory.
    """
    if config.save is None:
        raise ValueError("save_run needs config.save")
    directory = Path(config.save)
    directory.mkdir(parents=True, exist_ok=True)
    graph.save(directory / CHECKPOINT_NAME)
    if _ranks.rank() == 0:
        payload = run_file_payload(config, corpus.vocab, graph.training_step)
        temporary = directory / f".{RUN_FILE}.tmp"
        temporary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, directory / RUN_FILE)
    return directory


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

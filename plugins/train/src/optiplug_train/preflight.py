"""Checks ``optiplug train`` makes before it reads the corpus or trains anything.

A mistake that would only show up when the run ends (a ``--save`` directory
that cannot be created, a ``--plot`` path in a missing directory, an
``--impl`` the optimizer lacks, an lr for the third optimizer of a
``--compare``) is refused here, in one line, while nothing has been spent.

Importing this module does not import torch.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from optiplug import ImplementationSpec, Registry
from optiplug.cli import check_plot_path
from optiplug.errors import OptiplugError, closest_name

from .config import OptionError, TrainConfig
from .optim import make_schedule
from .variants import split_variant

__all__ = ["check_data_path", "check_implementation", "check_output_dir", "preflight"]


def check_output_dir(path: str | os.PathLike[str], option: str = "--save") -> None:
    """Refuse a directory that could not be created or written to.

    The directory itself, or else its nearest existing ancestor, must be a
    writable directory: no component of the path may be a file, and
    creating a directory there (removed at once) must succeed.

    Args:
        path: the directory a run will save to (it need not exist yet).
        option: the option that named it, for the message.

    Raises:
        OptiplugError: a component of the path is a file, or the directory
            (or the ancestor it would be created in) is not writable or
            nothing can be created in it (``/proc``, a read-only mount).
    """
    shown = str(path)
    target = Path(os.path.abspath(path))
    existing = next((p for p in (target, *target.parents) if os.path.lexists(p)), None)
    if existing is None:  # not even the root: nothing sensible to check
        return
    if not existing.is_dir():
        what = "is a file" if existing == target else f"{str(existing)!r} is a file"
        raise OptiplugError(
            f"{option} {shown!r}: {what}, not a directory; give a directory to save the run in"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == target else f" ({str(existing)!r}, where it would be created)"
        raise OptiplugError(f"{option} {shown!r}: the directory{where} is not writable")
    _probe(existing, f"{option} {shown!r}")


def _probe(directory: Path, named: str) -> None:
    """Create and remove a directory in ``directory``: what saving does first.

    Permission bits do not tell it all (``/proc`` looks writable to root, a
    read-only mount to everyone), so the check is the operation itself.

    Raises:
        OptiplugError: nothing can be created there (with the system's reason).
    """
    try:
        probe = tempfile.mkdtemp(prefix=".optiplug-write-check-", dir=directory)
    except OSError as error:
        reason = error.strerror or str(error)
        raise OptiplugError(
            f"{named}: cannot create a directory in {str(directory)!r} ({reason})"
        ) from None
    os.rmdir(probe)


def check_data_path(path: str | None) -> None:
    """Refuse a ``--data`` path that does not exist.

    Args:
        path: the ``--data`` path, or None for the standard library.

    Raises:
        OptiplugError: there is nothing at ``path``.
    """
    if path is not None and not os.path.exists(path):
        raise OptiplugError(f"--data {path!r}: no such file or directory")


def _unavailable_reason(impl: ImplementationSpec) -> str | None:
    """Why ``impl`` cannot run on this machine (a check that raises is a reason too), or None."""
    try:
        reason = impl.unavailable_reason()
    except Exception as error:  # a plugin's check: its failure is the reason, never a crash
        return f"availability check raised {type(error).__name__}: {error}"
    return None if reason is None else str(reason)


def check_implementation(registry: Registry, name: str, impl: str | None) -> None:
    """Refuse an ``--impl`` that optimizer ``name`` does not have, or that cannot run here.

    Args:
        registry: where the optimizer is registered.
        name: the optimizer.
        impl: the forced implementation, or None (measured: nothing to check).

    Raises:
        OptionError: ``impl`` names none of its implementations (the message
            suggests the closest one that can run here, and lists those that
            can and those that cannot, with why), or one that cannot run here.
    """
    if impl is None:
        return
    reasons = {found.name: _unavailable_reason(found) for found in registry.implementations(name)}
    if impl in reasons:
        if reasons[impl] is not None:
            raise OptionError("impl", impl, f"is unavailable here for {name}: {reasons[impl]}")
        return
    if not reasons:
        raise OptionError(
            "impl", impl, f"is not an implementation of {name}, which has only one: drop --impl"
        )
    runnable = sorted(found for found, reason in reasons.items() if reason is None)
    suggestion = closest_name(impl, runnable)
    hint = f" did you mean {suggestion!r}?" if suggestion else ""
    listed = f"{'A' if hint else 'a'}vailable here: {', '.join(runnable) or 'none'}"
    others = [f"{found} ({reason})" for found, reason in sorted(reasons.items()) if reason]
    if others:
        listed += f"; unavailable here: {', '.join(others)}"
    raise OptionError("impl", impl, f"is not an implementation of {name};{hint} {listed}")


def _check_optimizer(config: TrainConfig, registry: Registry, name: str, lr: float | None) -> None:
    algorithm, own = split_variant(name)  # a variant's hyperparameters are checked with it
    run = attrs.evolve(config, optimizer=algorithm, lr=config.lr if lr is None else lr)  # checks lr
    if algorithm == "auto":
        return  # chosen once the model is built; checked then, before the first step
    check_implementation(registry, algorithm, run.impl)
    overrides: dict[str, Any] = dict(own) if run.lr is None else {**dict(own), "lr": run.lr}
    registry.factory(algorithm, impl=run.impl, **overrides)


def preflight(
    config: TrainConfig,
    registry: Registry,
    *,
    optimizers: Sequence[tuple[str, float | None]] = (),
    plot: str | None = None,
) -> None:
    """Check everything that can be checked before the corpus is read or a step is taken.

    Args:
        config: the run.
        registry: where optimizers and schedules are looked up.
        optimizers: ``(name, lr)`` of each optimizer to train (``--compare``);
            empty for one run of ``config.optimizer``.
        plot: the image ``--compare`` will write, or None.

    Raises:
        OptiplugError: an unknown optimizer or schedule, a bad hyperparameter,
            lr or ``--impl``, ``--save-every`` without a save directory, a save
            directory or plot path that could not be written, or a missing
            ``--data``.
    """
    make_schedule(config, registry)
    for name, lr in optimizers or [(config.optimizer, None)]:
        _check_optimizer(config, registry, name, lr)
    if config.save_every is not None and config.save is None:
        raise OptiplugError("--save-every needs --save DIR (or --resume DIR) to save into")
    if config.save is not None:
        option = "--resume" if config.save == config.resume else "--save"
        check_output_dir(config.save, option)
    if plot is not None:
        check_plot_path(plot)
    check_data_path(config.data)

"""Variants in ``--compare``: an optimizer with hyperparameters of its own, ``NAME[KEY=VALUE;...]``."""

from __future__ import annotations

import argparse
from typing import Any

from optiplug import Candidate
from optiplug.cli import parse_param

from .config import OptionError

__all__ = ["as_candidate", "split_variant"]


def split_variant(label: str, item: str | None = None) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """``("muon", (("ns_coefficients", "polar_express"),))`` for ``muon[ns_coefficients=polar_express]``.

    A variant is an optimizer with hyperparameters of its own, raced beside
    the same optimizer at its defaults; ``;`` separates its ``KEY=VALUE``
    pairs, each value a Python literal or else a string.

    Args:
        label: ``NAME`` or ``NAME[KEY=VALUE;...]``.
        item: the ``--compare`` item it came from, for errors.

    Returns:
        ``(algorithm name, ((key, value), ...))``.

    Raises:
        OptionError: a malformed bracket or pair.
    """
    name, bracket, rest = label.partition("[")
    if not bracket:
        return label.strip(), ()
    body = rest.removesuffix("]")
    pairs = [pair.strip() for pair in body.split(";") if pair.strip()]
    if not rest.endswith("]") or not name.strip() or not pairs:
        raise OptionError("compare", item or label, ": expected NAME[KEY=VALUE;KEY=VALUE]")
    params = []
    for pair in pairs:
        try:
            params.append(parse_param(pair))
        except argparse.ArgumentTypeError as error:
            raise OptionError("compare", item or label, f": {error}") from None
    return name.strip(), tuple(params)


def as_candidate(label: str) -> str | Candidate:
    """What ``AutoOptimizer.tune`` takes for ``label``: the name, or a variant's :class:`Candidate`.

    Args:
        label: ``NAME`` or ``NAME[KEY=VALUE;...]``.

    Returns:
        ``label`` itself for a plain name; else the algorithm with the
        variant's hyperparameters, whose lr the tune then finds.
    """
    algorithm, params = split_variant(label)
    return Candidate(algorithm, dict(params)) if params else label

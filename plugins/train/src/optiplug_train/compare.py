"""``--compare``: several optimizers trained on identical data, seed and schedule.

With ``--seeds N`` (a race) each optimizer trains once per seed: seeds
``s, s+1, ...`` after ``--seed s``, every optimizer on every seed, one seed
after the other so that a slow spell of a shared machine falls on all of
them alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import attrs

from optiplug import Registry
from optiplug.errors import (
    OptimizerUnavailableError,
    OptiplugError,
    UnknownOptimizerError,
    closest_name,
)

from .config import OptionError, TrainConfig
from .data import Corpus, load_corpus
from .loop import train
from .options import check_seeds
from .race import summarize
from .report import echo
from .results import RaceResult, Skipped, TrainResult
from .tune import run_hyperparameters
from .variants import split_variant

__all__ = [
    "availability",
    "check_installed",
    "compare",
    "installed",
    "parse_compare",
    "race",
    "unavailable",
]


_EXPECTED_NAMES = "expected distinct names separated by commas, e.g. adamw,lion,muon"


def _parse_item(item: str) -> tuple[str, float | None]:
    """One ``NAME``, ``NAME=LR``, ``NAME[KEY=VALUE;...]`` or ``NAME[...]=LR`` of ``--compare``.

    The lr must be a positive finite number; a variant's bracket is checked
    by :func:`split_variant`.
    """
    label, lr = item, ""
    if "[" in item:
        close = item.rfind("]")
        label, tail = item[: close + 1], item[close + 1 :]
        if close < 0 or (tail and not tail.startswith("=")):
            raise OptionError("compare", item, ": expected NAME[KEY=VALUE;...] or NAME[...]=LR")
        split_variant(label, item)
        lr = tail[1:]
    elif "=" in item:
        label, _, lr = item.partition("=")
    if not lr:
        return label.strip(), None
    try:
        value = float(lr)
    except ValueError:
        raise OptionError("compare", item, ": expected NAME or NAME=LR") from None
    if not math.isfinite(value):
        raise OptionError("compare", item, f": lr must be finite, got {value!r}")
    if value <= 0:
        raise OptionError("compare", item, f": lr must be positive, got {value!r}")
    return label.strip(), value


def _items(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and parentheses (a variant's values may hold some)."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += (char in "[(") - (char in "])")
        if char == "," and depth <= 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    return [*items, "".join(current)]


def parse_compare(text: str) -> list[tuple[str, float | None]]:
    """Parse ``--compare adamw,lion=3e-4,sgd=0.1`` into ``(name, lr or None)`` pairs.

    Args:
        text: comma-separated ``NAME`` or ``NAME=LR`` items; a ``NAME`` may be
            a variant, ``NAME[KEY=VALUE;...]`` (see :func:`split_variant`).

    Returns:
        The pairs, in order.

    Raises:
        OptionError: an empty name (``--compare ''``, ``adamw,,sgd``, a
            comma at an end, ``=0.1``), a repeated name, or an lr that is
            not a positive finite number (naming the value as typed).
    """
    entries = [_parse_item(item.strip()) for item in _items(text)]
    names = [name for name, _ in entries]
    if not any(names):
        raise OptionError("compare", text, f": names no optimizer; {_EXPECTED_NAMES}")
    if "" in names:
        raise OptionError("compare", text, f": an empty name; {_EXPECTED_NAMES}")
    if len(set(names)) != len(names):
        raise OptionError("compare", text, f": a repeated name; {_EXPECTED_NAMES}")
    return entries


def check_installed(
    text: str, entries: Sequence[tuple[str, float | None]], registry: Registry
) -> None:
    """Refuse, before anything is trained, an optimizer of ``--compare`` that is not installed.

    Args:
        text: ``--compare``'s value, as typed.
        entries: its ``(name, lr)`` pairs, as :func:`parse_compare` returns them.
        registry: where they are looked up.

    Raises:
        OptiplugError: naming each unknown optimizer, the closest installed
            name (did you mean) and what is installed.
    """
    unknown = [
        split_variant(name)[0]
        for name, _ in entries
        if unavailable(name, registry) == "not installed"
    ]
    if not unknown:
        return
    shown = []
    for name in unknown:
        suggestion = closest_name(name, registry.optimizers())
        shown.append(f"{name!r}" + (f" (did you mean {suggestion!r}?)" if suggestion else ""))
    what = "optimizer" if len(unknown) == 1 else "optimizers"
    raise OptiplugError(
        f"--compare {text}: unknown {what} {', '.join(shown)}; {installed(registry)}"
    )


def unavailable(name: str, registry: Registry) -> str | None:
    """Why optimizer ``name`` cannot be used here (``"not installed"``...), or None when it can.

    Args:
        name: ``"auto"`` or an optimizer name.
        registry: where it is looked up.

    Returns:
        The reason, or None.
    """
    if name == "auto":
        return None
    try:
        registry.spec(split_variant(name)[0])
    except UnknownOptimizerError:
        return "not installed"
    except (OptimizerUnavailableError, OptiplugError) as error:
        return str(error)
    return None


def installed(registry: Registry) -> str:
    """``"installed: adam, adamw, ..."``: what a skipped optimizer's message suggests."""
    return f"installed: {', '.join(registry.optimizers())}"


def availability(
    entries: Sequence[tuple[str, float | None]], registry: Registry
) -> dict[str, str | None]:
    """Why each optimizer of ``entries`` cannot run (None for those that can).

    Args:
        entries: ``(name, lr)`` pairs, as :func:`parse_compare` returns them.
        registry: where they are looked up.

    Returns:
        ``{name: reason or None}``.

    Raises:
        OptiplugError: none of them can run.
    """
    reasons = {name: unavailable(name, registry) for name, _ in entries}
    if all(reasons.values()):
        details = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
        raise OptiplugError(f"--compare: no optimizer to run ({details}); {installed(registry)}")
    return reasons


def compare(
    config: TrainConfig,
    entries: Sequence[tuple[str, float | None]],
    registry: Registry,
    corpus: Corpus | None = None,
    *,
    log: Callable[[str], None] | None = echo,
    stream: IO[str] | None = None,
    quiet: bool = False,
    tuned: Mapping[str, Mapping[str, Any]] | None = None,
    label: str = "",
) -> list[TrainResult | Skipped]:
    """Train each optimizer of ``entries`` on identical data, seed and schedule.

    Args:
        config: the run every optimizer gets (its ``optimizer`` and ``lr`` are replaced).
        entries: ``(name, lr)``; a None lr keeps ``config.lr`` or the optimizer's default.
        registry: where the optimizers and the schedule are looked up.
        corpus: the corpus, if already loaded.
        log: where log lines go; None drops them.
        stream: where the progress bars go.
        quiet: log lines instead of progress bars.
        tuned: ``{name: hyperparameters}`` found by ``--tune-lr`` (``lr`` and
            the recipe's others); they replace ``config.lr`` for that optimizer.
        label: what follows the optimizer's name in its log lines (`` seed 1``).

    Returns:
        A :class:`TrainResult` per trained optimizer, a :class:`Skipped` per missing one.

    Raises:
        OptiplugError: none of the optimizers is installed.
    """
    reasons = availability(entries, registry)
    corpus = corpus if corpus is not None else load_corpus(config.data, config.max_chars)
    results: list[TrainResult | Skipped] = []
    for name, lr in entries:
        reason = reasons[name]
        if reason is not None:
            if log is not None:
                log(f"{name}: skipped, {reason} ({installed(registry)})")
            results.append(Skipped(name, reason))
            continue
        algorithm, own = split_variant(name)
        run = attrs.evolve(
            config,
            optimizer=algorithm,
            lr=config.lr if lr is None else lr,
            optimizer_params=config.optimizer_params + own,
        )
        if tuned is not None and name in tuned:
            lr, params = run_hyperparameters(dict(tuned[name]))
            run = attrs.evolve(run, lr=lr, optimizer_params=params)
        prefix = f"{name}{label}: "
        result = train(run, registry, corpus, log=log, stream=stream, quiet=quiet, label=prefix)
        if result is not None:
            results.append(result if name == algorithm else attrs.evolve(result, optimizer=name))
    return results


def race(
    config: TrainConfig,
    entries: Sequence[tuple[str, float | None]],
    registry: Registry,
    corpus: Corpus | None = None,
    *,
    seeds: int,
    target: float | None,
    log: Callable[[str], None] | None = echo,
    stream: IO[str] | None = None,
    quiet: bool = False,
    tuned: Mapping[str, Mapping[str, Any]] | None = None,
) -> RaceResult:
    """Train each optimizer of ``entries`` once per seed, and measure the race.

    Seeds ``config.seed``, ``config.seed + 1``, ... in turn; within a seed,
    each optimizer on identical data, initial weights and schedule (as
    :func:`compare`). A seed gives the same run every time.

    Args:
        config: the run every optimizer gets (its ``seed`` is the first seed).
        entries: ``(name, lr)``, as :func:`compare` takes them.
        registry: where the optimizers and the schedule are looked up.
        corpus: the corpus, if already loaded.
        seeds: how many seeds, 1 to :data:`~optiplug_train.options.MAX_SEEDS`.
        target: the validation loss to reach, or None (final losses only).
        log: where log lines go; None drops them.
        stream: where the progress bars go.
        quiet: log lines instead of progress bars.
        tuned: ``{name: hyperparameters}`` found by ``--tune-lr``, used with every seed.

    Returns:
        The :class:`RaceResult`.

    Raises:
        OptionError: ``seeds`` below 1 or above :data:`~optiplug_train.options.MAX_SEEDS`.
        OptiplugError: none of the optimizers is installed.
    """
    check_seeds(seeds)
    reasons = availability(entries, registry)
    skipped = [Skipped(name, reason) for name, reason in reasons.items() if reason is not None]
    for gone in skipped:
        if log is not None:
            log(f"{gone.name}: skipped, {gone.reason} ({installed(registry)})")
    runnable = [(name, lr) for name, lr in entries if reasons[name] is None]
    corpus = corpus if corpus is not None else load_corpus(config.data, config.max_chars)
    chosen = [config.seed + index for index in range(seeds)]
    runs: dict[str, list[TrainResult]] = {name: [] for name, _ in runnable}
    for seed in chosen:
        found = compare(
            attrs.evolve(config, seed=seed),
            runnable,
            registry,
            corpus,
            log=log,
            stream=stream,
            quiet=quiet,
            tuned=tuned,
            label=f" seed {seed}",
        )
        for (name, _), result in zip(runnable, found, strict=True):
            if isinstance(result, TrainResult):
                runs[name].append(result)
    return summarize(
        runs, seeds=chosen, target=target, skipped=skipped, eval_every=config.eval_interval
    )

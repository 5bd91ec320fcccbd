"""``AutoOptimizer.tune``: choose the optimizer and its lr by measuring them on the user's model.

For each candidate (a rule's recipe or a name the caller gives):

1. an LR range test: ``range_steps`` steps on a copy of the model, the
   learning rates (every ``lr`` and ``*_lr`` together) growing exponentially
   from :data:`LR_SPAN` ``[0]`` to ``[1]`` times the recipe's; the training
   loss is smoothed (EMA, :data:`SMOOTHING`) and the test stops once it
   exceeds :data:`DIVERGENCE` times its minimum;
2. three lrs from that test: where the smoothed loss falls fastest per unit
   of log lr (before its minimum; fastai's ``steep`` suggestion), the
   minimum's lr, where "the minimum" is where the loss first comes within
   :data:`PLATEAU` of its lowest value (adaptive methods reach a long noisy
   plateau rather than a sharp minimum, and its argmin lands anywhere on
   it), and their geometric mean;
3. a short run at each of those lrs: ``run_steps`` steps on a fresh copy,
   the lr warmed up over 5% of them and decayed by a cosine (a constant lr
   rewarded the smallest lr, measured on the training job: the loss at a
   constant high lr stays noisy, while a decayed run collects the gain),
   then the mean loss over the held-out batches; the candidate's lr is the
   smallest whose loss is within 1% of the best of the three (short runs
   favour large lrs: :func:`conservative_best`), its score that loss.

The candidate with the lowest held-out loss wins. Every trial starts from the
same weights and the same seed; the caller's model, its gradients and every
random number generator are left exactly as they were.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch

from .._core import ranks as _ranks
from .._core.lifecycle import set_training, step_needs
from .._core.registry import Registry
from .._core.selection import (
    RANGE_SHARE,
    SHORT_RUNS,
    CandidateReport,
    Selection,
    TuneReport,
    TuneTrial,
)
from .._core.specs import Candidate
from ..errors import OptiplugError, TuneError

__all__ = [
    "DEFAULT_CANDIDATE_STEPS",
    "DIVERGENCE",
    "LR_DIVISOR",
    "LR_RULE",
    "LR_SPAN",
    "PLATEAU",
    "RANGE_SHARE",
    "SHORT_RUNS",
    "SLOPE_WINDOW",
    "SMOOTHING",
    "SEEDS",
    "TunePlan",
    "batches_needed",
    "conservative_best",
    "default_candidates",
    "proposed_lrs",
    "warmup_cosine",
    "plan_tune",
    "plateau_start",
    "run_tune",
    "split_batches",
    "steepest_lr",
]

LR_SPAN = (1e-2, 1e3)
"""The range test sweeps the recipe's learning rates times 1e-2 up to 1e3."""

SMOOTHING = 0.9
"""EMA factor of the range test's loss (debiased, as in fastai's ``lr_find``)."""

DIVERGENCE = 4.0
"""The range test stops once the smoothed loss exceeds this many times its minimum."""

LR_DIVISOR = 10.0
"""The low end of the short runs' lrs is the minimum's lr / this when no steepest lr precedes it."""

LR_RULE = (
    "short runs at the steepest-descent lr, the minimum's lr and their geometric mean; "
    "the smallest within 1% of the best held-out loss"
)

PLATEAU = 0.05
"""The range test's minimum is where the loss first comes within 5% of its total drop of it."""

SLOPE_WINDOW = 20
"""The slope at a point spans +-(points // SLOPE_WINDOW) points (at least one) each side."""

CLOSE_ENOUGH = 0.01
"""Held-out losses within 1% of the best count as a tie, which the smallest lr wins."""

WARMUP_DIVISOR = 20
"""Short runs warm up over their first 1/20 of steps, then decay by a cosine: how models train."""

DEFAULT_CANDIDATE_STEPS = 750
"""Without a candidate list, each candidate gets at least this many steps (a
300-step range test and three 150-step short runs), so the budget decides how
many of the rules' candidates are measured (at most three). On the training
job, 1500 steps shared by three candidates (100-step short runs) chose muon
at 3.3x its recipe's lr (validation 2.1870); shared by two (150-step runs),
at 2.7x (1.8272)."""

MIN_RANGE_STEPS = 10
MIN_RUN_STEPS = 5

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


@attrs.frozen
class TunePlan:
    """What a tune runs: the batches split, and each candidate's step counts.

    Attributes:
        train: the batches trials train on (cycled).
        held_out: the batches the held-out loss averages.
        range_steps: steps of each candidate's range test.
        run_steps: steps of each of a candidate's short runs.
        budget_steps: the whole budget.
        seed: the seed every trial starts from.
    """

    train: tuple[Any, ...]
    held_out: tuple[Any, ...]
    range_steps: int
    run_steps: int
    budget_steps: int
    seed: int


def split_batches(
    batches: Iterable[Any], held_out: int | float, train_needed: int | None = None
) -> tuple[list[Any], list[Any]]:
    """Split ``batches`` into the training part and the held-out tail.

    A sequence (a list, a tuple) is sliced: its last batches are held out.
    Any other iterable (a generator, a data loader, ``itertools.repeat``) is
    read only as far as :func:`batches_needed` says, never to its end, and
    the batches read last are held out.

    Args:
        batches: every batch the tune may use.
        held_out: how many of the last batches to hold out (an int >= 1), or
            which fraction of them (a float in (0, 1)); at least one is held out.
        train_needed: the most batches a trial trains on (those beyond are
            never used); None keeps and reads them all.

    Returns:
        ``(train, held_out)`` lists; both non-empty.

    Raises:
        TuneError: ``held_out`` out of range, ``batches`` not iterable, or
            too few batches to split.
    """
    _check_held_out(held_out)
    if isinstance(batches, Sequence):
        found: Sequence[Any] = batches
    else:
        wanted = None if train_needed is None else batches_needed(train_needed, held_out)
        found = list(itertools.islice(_iterated(batches), wanted))
    count = held_out if isinstance(held_out, int) else max(1, round(held_out * len(found)))
    if len(found) - count < 1:
        raise TuneError(
            f"batches: {len(found)} given, held_out={held_out!r} holds out {count}; "
            "at least one more is needed to train on"
        )
    kept = len(found) - count if train_needed is None else min(len(found) - count, train_needed)
    return list(found[:kept]), list(found[len(found) - count :])


def _check_held_out(held_out: int | float) -> None:
    if isinstance(held_out, bool) or not isinstance(held_out, (int, float)):
        raise TuneError(f"held_out={held_out!r}: expected an int >= 1 or a float in (0, 1)")
    if isinstance(held_out, float) and not 0.0 < held_out < 1.0:
        raise TuneError(f"held_out={held_out!r}: a fraction must lie in (0, 1)")
    if isinstance(held_out, int) and held_out < 1:
        raise TuneError(f"held_out={held_out!r}: at least one batch must be held out")


def _iterated(batches: Iterable[Any]) -> Iterator[Any]:
    try:
        return iter(batches)
    except TypeError:
        raise TuneError(
            f"batches={batches!r}: expected an iterable of batches "
            "(a list, a generator, a data loader...)"
        ) from None


def batches_needed(train_needed: int, held_out: int | float) -> int:
    """How many batches of an iterable a tune reads: the ones it trains on, then the held-out ones.

    Args:
        train_needed: the most batches a trial trains on.
        held_out: held-out batches (an int), or their fraction of those read (a float in (0, 1)).

    Returns:
        ``train_needed + held_out`` for an int; for a fraction, the fewest
        batches whose part left after holding that fraction out (at least
        one) is ``train_needed`` or more.
    """
    if isinstance(held_out, int):
        return train_needed + held_out

    def trained(total: int) -> int:
        return total - max(1, round(held_out * total))

    # trained() never falls as total grows, and the high end is always enough
    low = train_needed + 1
    high = max(low, math.ceil(train_needed / (1.0 - held_out)) + 1)
    while low < high:
        middle = (low + high) // 2
        if trained(middle) >= train_needed:
            high = middle
        else:
            low = middle + 1
    return low


SEEDS = (-(2**63), 2**64 - 1)
"""The seeds ``torch.manual_seed`` accepts, inclusive."""


def _check_seed(seed: int) -> None:
    low, high = SEEDS
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        raise TuneError(f"seed={seed!r}: expected an integer from {low} to {high}")


def plan_tune(
    batches: Iterable[Any], held_out: int | float, candidates: int, budget_steps: int, seed: int
) -> TunePlan:
    """Share ``budget_steps`` among ``candidates``, and take the batches that needs.

    Raises:
        TuneError: bad ``held_out``, ``seed`` or batches, or a budget below
            ``MIN_RANGE_STEPS + SHORT_RUNS * MIN_RUN_STEPS`` steps per candidate.
    """
    if isinstance(budget_steps, bool) or not isinstance(budget_steps, int):
        raise TuneError(f"budget_steps={budget_steps!r}: expected an integer")
    _check_seed(seed)
    per_candidate = budget_steps // max(candidates, 1)
    least = MIN_RANGE_STEPS + SHORT_RUNS * MIN_RUN_STEPS
    if per_candidate < least:
        raise TuneError(
            f"budget_steps={budget_steps}: {candidates} candidate(s) need at least "
            f"{least * candidates} ({least} each: a range test and {SHORT_RUNS} short runs)"
        )
    range_steps = max(MIN_RANGE_STEPS, round(per_candidate * RANGE_SHARE))
    run_steps = (per_candidate - range_steps) // SHORT_RUNS
    train, held = split_batches(batches, held_out, max(range_steps, run_steps))
    return TunePlan(tuple(train), tuple(held), range_steps, run_steps, budget_steps, seed)


# ------------------------------------------------------------------ one trial
def lr_keys(hparams: Mapping[str, Any]) -> list[str]:
    """The learning-rate hyperparameters: ``lr`` and every float ``*_lr``."""
    return [
        key
        for key, value in hparams.items()
        if (key == "lr" or key.endswith("_lr"))
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    ]


def scaled(hparams: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """``hparams`` with every learning rate multiplied by ``factor``."""
    keys = lr_keys(hparams)
    return {key: value * factor if key in keys else value for key, value in hparams.items()}


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore torch's (CPU and every CUDA device's), Python's and NumPy's RNG afterwards."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []  # type: ignore[no-untyped-call]
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)


def _fresh_copy(model: torch.nn.Module) -> torch.nn.Module:
    trial = copy.deepcopy(model)
    for parameter in trial.parameters():
        parameter.grad = None
    return trial.train()


def _scalar_loss(loss_fn: LossFn, model: torch.nn.Module, batch: Any) -> torch.Tensor:
    loss = loss_fn(model, batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        kind = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else loss
        raise TuneError(f"loss_fn(model, batch) must return a scalar tensor; it returned {kind!r}")
    if not loss.is_floating_point():
        raise TuneError(
            "loss_fn(model, batch) must return a real floating-point scalar tensor; "
            f"it returned one of dtype {loss.dtype}"
        )
    return loss.reshape(())


def _train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, batch: Any
) -> float:
    """One step; returns the loss before it (a non-finite loss is not stepped on).

    The step is taken as the optimizer's spec asks: gradients that keep
    their graph, or a closure recomputing the loss on the same batch.
    """
    set_training(optimizer, True)  # schedule-free optimizers step in their training mode
    closure_needed, create_graph = step_needs(optimizer)

    def closure() -> Any:  # a tensor; torch annotates the closure as returning a float
        optimizer.zero_grad(set_to_none=True)
        loss = _scalar_loss(loss_fn, model, batch)
        if not loss.requires_grad:
            raise TuneError(
                "loss_fn(model, batch) returned a loss that does not require grad, so there is "
                "nothing to step on: it was computed under torch.no_grad(), detached, or from "
                "parameters that do not require grad"
            )
        loss.backward(create_graph=create_graph)  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        return loss

    value = float(closure().detach())
    if math.isfinite(value):
        if closure_needed:
            optimizer.step(closure)
        else:
            optimizer.step()
    return value


def _held_out_loss(
    model: torch.nn.Module,
    loss_fn: LossFn,
    held_out: Sequence[Any],
    optimizer: torch.optim.Optimizer | None = None,
) -> float:
    """The mean loss on ``held_out``, model and optimizer in evaluation mode (then back)."""
    model.eval()
    if optimizer is not None:
        set_training(optimizer, False)  # schedule-free: evaluate at the averaged weights
    with torch.no_grad():
        losses = [float(_scalar_loss(loss_fn, model, batch)) for batch in held_out]
    model.train()
    if optimizer is not None:
        set_training(optimizer, True)
    return math.fsum(losses) / len(losses)


def _optimizer(
    model: torch.nn.Module, algorithm: str, hparams: Mapping[str, Any], registry: Registry
) -> torch.optim.Optimizer:
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer = registry.factory(algorithm, **hparams)(named)
    return optimizer


@attrs.frozen
class _RangeTest:
    points: tuple[tuple[float, float], ...]
    lr_at_min: float | None
    steps: int
    note: str

    @property
    def lr_steepest(self) -> float | None:
        """The lr of the most negative slope of loss over log lr, before the minimum."""
        return steepest_lr(self.points)


def plateau_start(points: Sequence[tuple[float, float]]) -> float | None:
    """The smallest lr whose loss is within :data:`PLATEAU` of the minimum (of the drop to it).

    Adaptive methods often reach a long, noisy plateau instead of a sharp
    minimum: its argmin lands anywhere on it. Where the plateau starts is
    what the "minimum" of the lr rule means.

    Args:
        points: a range test's ``(lr, smoothed loss)``, lr increasing.

    Returns:
        That lr, or None when there are no points.
    """
    if not points:
        return None
    lowest = min(loss for _, loss in points)
    tolerance = PLATEAU * (points[0][1] - lowest)
    return next(lr for lr, loss in points if loss <= lowest + tolerance)


def steepest_lr(points: Sequence[tuple[float, float]]) -> float | None:
    """The lr where ``(lr, loss)`` points fall fastest per unit of log lr, before their minimum.

    Args:
        points: a range test's ``(lr, smoothed loss)``, lr increasing.

    Returns:
        That lr, or None when fewer than ``2 * window + 1`` points precede the minimum.
    """
    if not points:
        return None
    window = max(1, len(points) // SLOPE_WINDOW)
    lowest = min(range(len(points)), key=lambda i: points[i][1])
    slopes = [
        (
            (points[i + window][1] - points[i - window][1])
            / (math.log(points[i + window][0]) - math.log(points[i - window][0])),
            points[i][0],
        )
        for i in range(window, min(lowest, len(points) - window))
    ]
    return min(slopes)[1] if slopes else None


def proposed_lrs(tested: _RangeTest, base_lr: float) -> list[float]:
    """The lrs the short runs try: the steepest lr, the minimum's lr and their geometric mean.

    Without a steepest lr below the minimum's, the low end is the minimum's
    lr / :data:`LR_DIVISOR`; without any point (the first step diverged),
    only the smallest lr swept.
    """
    if tested.lr_at_min is None:
        return [base_lr * LR_SPAN[0]]
    high = tested.lr_at_min
    steepest = tested.lr_steepest
    low = steepest if steepest is not None and steepest < high else high / LR_DIVISOR
    return [low, math.sqrt(low * high), high]


def range_test(
    model: torch.nn.Module,
    loss_fn: LossFn,
    algorithm: str,
    hparams: Mapping[str, Any],
    registry: Registry,
    plan: TunePlan,
) -> _RangeTest:
    """Sweep the learning rates exponentially over ``plan.range_steps`` steps on a copy."""
    _seed(plan.seed)
    trial = _fresh_copy(model)
    optimizer = _optimizer(trial, algorithm, hparams, registry)
    base_lrs = [float(group["lr"]) for group in optimizer.param_groups]
    low, high = LR_SPAN
    points: list[tuple[float, float]] = []
    average, best, note, step = 0.0, math.inf, "", 0
    for step in range(1, plan.range_steps + 1):
        factor = low * (high / low) ** ((step - 1) / max(plan.range_steps - 1, 1))
        for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = base * factor
        lr = float(hparams["lr"]) * factor
        loss = _train_step(trial, optimizer, loss_fn, plan.train[(step - 1) % len(plan.train)])
        if not math.isfinite(loss):
            note = f"range test stopped at lr {lr:.3g}: non-finite loss"
            break
        average = SMOOTHING * average + (1 - SMOOTHING) * loss
        smoothed = average / (1 - SMOOTHING**step)
        points.append((lr, smoothed))
        if smoothed < best:
            best = smoothed
        elif smoothed > DIVERGENCE * best:
            note = f"range test stopped at lr {lr:.3g}: loss {smoothed:.3g} > {DIVERGENCE:g}x min"
            break
    return _RangeTest(tuple(points), plateau_start(points), step, note)


def trial(
    model: torch.nn.Module,
    loss_fn: LossFn,
    candidate: Candidate,
    registry: Registry,
    plan: TunePlan,
) -> TuneTrial:
    """Range-test ``candidate``, run it briefly at each proposed lr, keep the best held-out loss."""
    hparams = dict(candidate.hparams)
    tested = range_test(model, loss_fn, candidate.algorithm, hparams, registry, plan)
    base_lr = float(hparams["lr"])
    runs = [
        _short_run(
            model, loss_fn, (candidate.algorithm, registry), scaled(hparams, lr / base_lr), plan
        )
        for lr in proposed_lrs(tested, base_lr)
    ]
    tuned, held, _ = runs[conservative_best([(r[0]["lr"], r[1]) for r in runs])]
    notes = [tested.note, *(f"lr {r[0]['lr']:.3g}: {r[2]}" for r in runs if r[2])]
    return TuneTrial(
        algorithm=candidate.algorithm,
        hparams=tuned,
        lr=float(tuned["lr"]),
        lr_at_min=tested.lr_at_min,
        lr_steepest=tested.lr_steepest,
        range_test=tested.points,
        held_out_loss=held,
        steps=tested.steps + plan.run_steps * len(runs),
        note="; ".join(filter(None, notes)),
        short_runs=tuple((float(r[0]["lr"]), r[1]) for r in runs),
    )


def conservative_best(runs: Sequence[tuple[float, float]]) -> int:
    """The index of the smallest lr whose held-out loss is within :data:`CLOSE_ENOUGH` of the best.

    Short runs favour larger learning rates than the long run they stand in
    for: the optimal lr falls as training gets longer (Bjorck et al. 2025,
    "Scaling Optimal LR Across Token Horizons"); among lrs that score about
    the same, the smallest is the safer choice for a longer run.

    Args:
        runs: ``(lr, held-out loss)`` per short run.

    Returns:
        The index into ``runs``.
    """
    best = min(loss for _, loss in runs)
    close = [i for i, (_, loss) in enumerate(runs) if loss <= best * (1 + CLOSE_ENOUGH)]
    return min(close, key=lambda i: runs[i][0])


def warmup_cosine(step: int, total: int) -> float:
    """The short runs' lr multiplier: linear warm-up over the first 5% of steps, then cosine to 0.

    Args:
        step: the step about to be taken (0-based).
        total: the run's steps.

    Returns:
        The multiplier in (0, 1].
    """
    warmup = max(1, total // WARMUP_DIVISOR)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.5 * (1.0 + math.cos(math.pi * progress)), 1e-3)


def _short_run(
    model: torch.nn.Module,
    loss_fn: LossFn,
    algorithm: tuple[str, Registry],
    hparams: dict[str, Any],
    plan: TunePlan,
) -> tuple[dict[str, Any], float, str]:
    """``plan.run_steps`` steps from the initial weights at ``hparams``; the held-out loss after.

    Args:
        model: the caller's model (copied).
        loss_fn: the loss.
        algorithm: ``(name, registry)`` of the optimizer to build.
        hparams: its hyperparameters, learning rates scaled.
        plan: the step count, batches and seed.

    Returns:
        ``(hparams, held-out loss or inf, what went wrong or "")``.
    """
    _seed(plan.seed)
    run_model = _fresh_copy(model)
    name, registry = algorithm
    optimizer = _optimizer(run_model, name, hparams, registry)
    peaks = [float(group["lr"]) for group in optimizer.param_groups]
    for step in range(plan.run_steps):
        factor = warmup_cosine(step, plan.run_steps)
        for group, peak in zip(optimizer.param_groups, peaks, strict=True):
            group["lr"] = peak * factor
        loss = _train_step(run_model, optimizer, loss_fn, plan.train[step % len(plan.train)])
        if not math.isfinite(loss):
            return hparams, math.inf, f"diverged at step {step + 1}"
    held = _held_out_loss(run_model, loss_fn, plan.held_out, optimizer)
    return hparams, held if math.isfinite(held) else math.inf, ""


# ------------------------------------------------------------------ the whole tune
def with_lr_defaults(candidate: Candidate, registry: Registry) -> Candidate:
    """``candidate`` with its algorithm's default learning rates filled in where it sets none.

    Raises:
        TuneError: the algorithm has no ``lr`` to tune.
    """
    spec = registry.spec(candidate.algorithm)
    defaults = {h.name: h.default for h in spec.hyperparameters if h.default is not None}
    filled = {key: defaults[key] for key in lr_keys(defaults) if key not in candidate.hparams}
    hparams = {**candidate.hparams, **filled}
    if "lr" not in lr_keys(hparams):
        raise TuneError(
            f"candidates: {candidate.algorithm!r} has no numeric 'lr' hyperparameter to tune"
        )
    return attrs.evolve(candidate, hparams=hparams)


def _measure(
    model: torch.nn.Module,
    loss_fn: LossFn,
    candidates: Sequence[Candidate],
    registry: Registry,
    plan: TunePlan,
) -> tuple[TuneTrial, ...]:
    with preserved_rng():
        trials = [trial(model, loss_fn, c, registry, plan) for c in candidates]
    return tuple(sorted(trials, key=lambda t: (t.held_out_loss, t.algorithm)))


def _agreed(measure: Callable[[], tuple[TuneTrial, ...]]) -> tuple[TuneTrial, ...]:
    """Rank 0 measures and every rank receives its trials (errors included) under DDP."""
    if not _ranks.active() or _ranks.world_size() == 1:
        return measure()
    outcome: list[Any] = [None]
    if _ranks.rank() == 0:
        try:
            outcome[0] = measure()
        except OptiplugError as error:
            outcome[0] = f"{type(error).__name__}: {error}"
    device = None
    if torch.distributed.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    torch.distributed.broadcast_object_list(outcome, src=0, device=device)
    if isinstance(outcome[0], str):
        raise TuneError(f"the tune failed on rank 0: {outcome[0]}")
    trials: tuple[TuneTrial, ...] = outcome[0]
    return trials


def run_tune(
    model: torch.nn.Module,
    loss_fn: LossFn,
    batches: Iterable[Any],
    rules: Selection,
    candidates: Sequence[str | Candidate] | None,
    *,
    budget_steps: int,
    held_out: int | float,
    seed: int,
    registry: Registry,
    max_candidates: int = 3,
) -> Selection:
    """Measure the candidates and return the best as a :class:`Selection` (see the module doc).

    Args:
        model: the user's model; never changed.
        loss_fn: ``loss_fn(model, batch)`` -> scalar loss tensor.
        batches: the batches, split by :func:`split_batches`.
        rules: the rules' selection for this model (recipes and the request).
        candidates: algorithm names or :class:`~optiplug.Candidate` records;
            None takes the installed algorithms the rules rank highest, one
            per :data:`DEFAULT_CANDIDATE_STEPS` of the budget, at least one
            and at most ``max_candidates``.
        budget_steps: optimizer steps for the whole tune.
        held_out: held-out batches (an int) or fraction (a float).
        seed: the seed every trial starts from.
        registry: where the algorithms are looked up.
        max_candidates: how many rule recipes to try when ``candidates`` is None.

    Returns:
        The winner, with every trial in ``selection.tuning``.

    Raises:
        TuneError: bad batches, seed, budget or loss, or every candidate diverged.
    """
    limit = default_candidates(budget_steps, max_candidates)
    recipes = [with_lr_defaults(c, registry) for c in _recipes(rules, candidates, limit)]
    plan = plan_tune(batches, held_out, len(recipes), budget_steps, seed)
    trials = _agreed(lambda: _measure(model, loss_fn, recipes, registry, plan))
    if not math.isfinite(trials[0].held_out_loss):
        notes = "; ".join(f"{t.algorithm}: {t.note}" for t in trials)
        raise TuneError(f"every candidate diverged ({notes})")
    report = TuneReport(trials, LR_RULE, budget_steps, seed, len(plan.held_out))
    return _selection(rules, recipes, report, plan, registry)


def default_candidates(budget_steps: int, max_candidates: int) -> int:
    """How many of the rules' candidates a tune of ``budget_steps`` measures when none are named.

    Args:
        budget_steps: the tune's budget (a non-integer is refused later, by the plan).
        max_candidates: the most to measure.

    Returns:
        ``budget_steps // DEFAULT_CANDIDATE_STEPS``, between 1 and ``max_candidates``.
    """
    if isinstance(budget_steps, bool) or not isinstance(budget_steps, int):
        return max_candidates
    return max(1, min(max_candidates, budget_steps // DEFAULT_CANDIDATE_STEPS))


def _recipes(
    rules: Selection, candidates: Sequence[str | Candidate] | None, max_candidates: int
) -> list[Candidate]:
    """The candidates to measure: the caller's, completed from the rules' recipes, or the rules' best."""
    usable = [r.candidate for r in rules.candidates if r.status != "skipped"]
    if candidates is None:
        chosen: dict[str, Candidate] = {}
        for candidate in usable:
            chosen.setdefault(candidate.algorithm, candidate)
        return list(chosen.values())[:max_candidates]
    if isinstance(candidates, (str, Candidate)) or not candidates:
        raise TuneError(f"candidates={candidates!r}: expected a non-empty list of names")
    found: list[Candidate] = []
    for item in candidates:
        if isinstance(item, Candidate):
            found.append(item)
            continue
        recipe = next((c for c in usable if c.algorithm == item), None)
        found.append(recipe or Candidate(item, {}, rule="tune", reason="named by the caller"))
    names = [c.algorithm for c in found]
    if len(set(names)) != len(names):
        raise TuneError(f"candidates={names!r}: each algorithm may appear once")
    return found


def _selection(
    rules: Selection,
    recipes: Sequence[Candidate],
    report: TuneReport,
    plan: TunePlan,
    registry: Registry,
) -> Selection:
    by_name = {c.algorithm: c for c in recipes}
    best = report.trials[0]
    reports = []
    for index, measured in enumerate(report.trials):
        recipe = by_name[measured.algorithm]
        told = f"measured: held-out loss {measured.held_out_loss:.4f} at lr {measured.lr:.3g}"
        candidate = attrs.evolve(
            recipe, hparams=measured.hparams, reason=f"{told}; recipe: {recipe.reason or '-'}"
        )
        reports.append(CandidateReport(candidate, "chosen" if index == 0 else "outscored"))
    runner_up = report.trials[1] if len(report.trials) > 1 else None
    reason = (
        f"tuned on this model: lowest held-out loss ({best.held_out_loss:.4f}) after "
        f"{plan.run_steps} steps at lr {best.lr:.3g}, {LR_RULE}"
        + (f"; next: {runner_up.algorithm} {runner_up.held_out_loss:.4f}" if runner_up else "")
    )
    return Selection(
        name=best.algorithm,
        hparams=best.hparams,
        schedule=by_name[best.algorithm].schedule,
        reason=reason,
        candidates=tuple(reports),
        request=rules.request,
        registry=registry,
        tuning=report,
    )

"""The leaderboard's workloads: four small problems that need no download.

Each builds, from a seed, a model and its data, and measures a validation
metric where lower is better (a loss), so every workload reads the same way:
``char-lm`` is ``optiplug train``'s character transformer in a short
configuration (nats per character), ``digits`` a small CNN on scikit-learn's
bundled 8x8 digits (cross-entropy), ``diabetes`` an MLP on scikit-learn's
diabetes regression (mean squared error of the standardised target), and
``logistic`` a logistic regression on scikit-learn's breast-cancer data
(binary cross-entropy): a convex control that any optimizer should solve.

scikit-learn is the ``leaderboard`` extra; only the three scikit-learn
workloads need it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from optiplug.errors import HyperparameterError, OptiplugError

from ..data import load_corpus, spread, windows
from ..model import CharTransformer, mean_loss, next_token_loss

__all__ = ["WORKLOADS", "Problem", "Workload", "workload"]

_VAL_FRACTION = 0.2
_SPLIT_SEED = 0  # the data split is the same for every seed; the seed moves init and batches


@attrs.frozen(eq=False)
class Problem:
    """One seeded instance of a workload: its model, a batch sampler and its metric.

    Attributes:
        model: the model at its seeded initial weights.
        batch: ``step -> loss`` of one training batch (differentiable), seeded.
        metric: the validation metric of the current weights (no gradient).
    """

    model: torch.nn.Module
    batch: Callable[[], torch.Tensor]
    metric: Callable[[], float]


@attrs.frozen
class Workload:
    """A workload: a fixed step budget and how to build it.

    Attributes:
        name: its name on the board (``char-lm``).
        kind: the kind of task (``language-model``, ``image-classification``,
            ``regression``, ``convex``), which AutoOptimizer maps requests to.
        metric: what the validation metric measures, for the docs.
        steps: the step budget.
        eval_every: steps between validation points.
        build: ``seed -> Problem``.
    """

    name: str
    kind: str
    metric: str
    steps: int
    eval_every: int
    build: Callable[[int], Problem]


def _sampler(count: int, batch_size: int, seed: int) -> Callable[[], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return lambda: torch.randint(0, count, (batch_size,), generator=generator)


def _sklearn(name: str) -> Any:
    try:
        import sklearn.datasets as datasets  # deferred: optional dependency
        import sklearn.model_selection as model_selection  # deferred: optional dependency
    except ModuleNotFoundError:
        raise OptiplugError(
            f"the {name!r} workload needs scikit-learn, which is not installed; "
            'install it with: pip install "optiplug[leaderboard]"'
        ) from None
    return datasets, model_selection


def _split(x: Any, y: Any, stratify: bool) -> tuple[torch.Tensor, ...]:
    _, model_selection = _sklearn("split")
    parts = model_selection.train_test_split(
        x, y, test_size=_VAL_FRACTION, random_state=_SPLIT_SEED, stratify=y if stratify else None
    )
    return tuple(torch.as_tensor(part) for part in parts)


def _standardise(train: torch.Tensor, val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = train.mean(0), train.std(0).clamp_min(1e-8)
    return ((train - mean) / std).float(), ((val - mean) / std).float()


# ------------------------------------------------------------------ char-lm
_LM = {"max_chars": 200_000, "block": 32, "d_model": 32, "heads": 2, "layers": 1, "batch": 16}
_LM_VAL_WINDOWS = 64


@functools.lru_cache(maxsize=1)
def _corpus() -> Any:

    return load_corpus(None, _LM["max_chars"])


def _char_lm(seed: int) -> Problem:

    corpus = _corpus()
    rows = windows(corpus.train, _LM["block"])
    val_rows = spread(windows(corpus.val, _LM["block"]), _LM_VAL_WINDOWS)
    torch.manual_seed(seed)
    model = CharTransformer(
        len(corpus.vocab),
        block_size=_LM["block"],
        n_layer=_LM["layers"],
        d_model=_LM["d_model"],
        n_head=_LM["heads"],
    )
    pick = _sampler(len(rows), _LM["batch"], seed)

    def batch() -> torch.Tensor:
        chosen = rows[pick()]
        return next_token_loss(model(chosen[:, :-1]), chosen[:, 1:])

    return Problem(model, batch, lambda: mean_loss(model, val_rows, torch.device("cpu")))


# ------------------------------------------------------------------ digits
def _digits_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 2 * 2, 10),
    )


def _supervised(
    model: torch.nn.Module,
    data: tuple[torch.Tensor, ...],
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    seed: int,
    batch_size: int,
) -> Problem:
    x_train, x_val, y_train, y_val = data
    pick = _sampler(len(x_train), batch_size, seed)

    def batch() -> torch.Tensor:
        index = pick()
        return loss(model(x_train[index]), y_train[index])

    @torch.no_grad()
    def metric() -> float:
        was_training = model.training
        model.eval()
        value = float(loss(model(x_val), y_val))
        model.train(was_training)
        return value

    return Problem(model, batch, metric)


def _digits(seed: int) -> Problem:
    datasets, _ = _sklearn("digits")
    found = datasets.load_digits()
    x_train, x_val, y_train, y_val = _split(found.data / 16.0, found.target, stratify=True)
    shape = (-1, 1, 8, 8)
    data = (x_train.float().view(shape), x_val.float().view(shape), y_train.long(), y_val.long())
    torch.manual_seed(seed)
    return _supervised(_digits_cnn(), data, F.cross_entropy, seed, 64)


def _diabetes(seed: int) -> Problem:
    datasets, _ = _sklearn("diabetes")
    found = datasets.load_diabetes()
    x_train, x_val, y_train, y_val = _split(found.data, found.target.reshape(-1, 1), False)
    data = (*_standardise(x_train, x_val), *_standardise(y_train, y_val))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 1),
    )  # fmt: skip
    return _supervised(model, data, F.mse_loss, seed, 32)


def _logistic(seed: int) -> Problem:
    datasets, _ = _sklearn("logistic")
    found = datasets.load_breast_cancer()
    x_train, x_val, y_train, y_val = _split(found.data, found.target, stratify=True)
    x_train, x_val = _standardise(x_train, x_val)
    data = (x_train, x_val, y_train.float().view(-1, 1), y_val.float().view(-1, 1))
    torch.manual_seed(seed)
    return _supervised(torch.nn.Linear(30, 1), data, F.binary_cross_entropy_with_logits, seed, 64)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("char-lm", "language-model", "validation nats per character", 150, 25, _char_lm),
        Workload("digits", "image-classification", "validation cross-entropy", 150, 25, _digits),
        Workload("diabetes", "regression", "validation MSE (standardised)", 200, 25, _diabetes),
        Workload("logistic", "convex", "validation binary cross-entropy", 150, 25, _logistic),
    )
}
"""The suite, by name, in the board's order."""


def workload(name: str) -> Workload:
    """The workload called ``name``.

    Args:
        name: one of :data:`WORKLOADS`.

    Returns:
        The workload.

    Raises:
        HyperparameterError: no such workload (naming the ones there are).
    """

    if name not in WORKLOADS:
        raise HyperparameterError(
            "workload", name, f"is not a workload; choose from {', '.join(WORKLOADS)}",
            algorithm="leaderboard",
        )  # fmt: skip
    return WORKLOADS[name]

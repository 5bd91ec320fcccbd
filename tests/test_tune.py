"""``AutoOptimizer.tune`` and ``Graph.tune_optimizer``: measured choice of optimizer and lr."""

from __future__ import annotations

import itertools
import json
import math
import pickle
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_processes import run_ranks

import optiplug
from optiplug._auto import tune as tune_module
from optiplug.errors import TuneError

TARGET = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def regression_batches(count: int = 12, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        x = torch.randn(16, 4, generator=generator)
        batches.append({"x": x, "y": x @ TARGET + 0.01 * torch.randn(16, 1, generator=generator)})
    return batches


def regression_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


def small_model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1)
    )


def tune(model: torch.nn.Module, **kwargs: object) -> optiplug.Selection:
    options: dict[str, object] = {"candidates": ["sgd", "adam"], "budget_steps": 60, "held_out": 2}
    options.update(kwargs)
    return optiplug.AutoOptimizer.tune(model, regression_loss, regression_batches(), **options)


def snapshot(model: torch.nn.Module) -> dict[str, object]:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "training": model.training,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state()[1].copy(),
    }


def test_tune_leaves_model_gradients_and_every_rng_unchanged() -> None:
    model = small_model()
    regression_loss(model, regression_batches(1)[0]).backward()  # the user has gradients
    model.eval()
    torch.manual_seed(11), random.seed(11), np.random.seed(11)
    before = snapshot(model)
    tune(model)
    after = snapshot(model)
    assert before["state"].keys() == after["state"].keys()
    for key, value in before["state"].items():
        assert torch.equal(value, after["state"][key]), key
    for old, new in zip(before["grads"], after["grads"], strict=True):
        assert old is not None and new is not None and torch.equal(old, new)
    assert after["training"] is False
    assert torch.equal(before["torch_rng"], after["torch_rng"])
    assert before["python_rng"] == after["python_rng"]
    assert np.array_equal(before["numpy_rng"], after["numpy_rng"])


def test_tune_is_deterministic_under_a_seed_and_seed_matters() -> None:
    first, second = tune(small_model(), seed=5), tune(small_model(), seed=5)
    assert first.tuning == second.tuning
    assert first.name == second.name and first.hparams == second.hparams
    other = tune(small_model(), seed=6)
    assert other.tuning is not None and first.tuning is not None
    assert other.tuning.trials != first.tuning.trials


def test_winner_has_the_lowest_held_out_loss_and_builds_at_its_tuned_lr() -> None:
    selection = tune(small_model())
    tuning = selection.tuning
    assert tuning is not None and len(tuning.trials) == 2
    losses = [t.held_out_loss for t in tuning.trials]
    assert losses == sorted(losses)
    assert selection.name == tuning.trials[0].algorithm
    assert [r.status for r in selection.candidates] == ["chosen", "outscored"]
    optimizer = selection(small_model().parameters())
    assert optimizer.param_groups[0]["lr"] == pytest.approx(tuning.trials[0].lr, rel=1e-12)
    assert "held-out loss" in selection.explain() and "steepest lr" in selection.explain()
    assert all(t.steps <= 30 for t in tuning.trials)  # 60 steps shared by two candidates
    assert all(len(t.short_runs) == 3 for t in tuning.trials)


def test_range_test_sweeps_exponentially_and_lr_follows_the_stated_rule() -> None:
    selection = tune(small_model(), candidates=["sgd"], budget_steps=50)
    (trial,) = selection.tuning.trials  # type: ignore[union-attr]
    base = 1e-3  # sgd's registered default lr, the centre of the sweep
    lrs = [lr for lr, _ in trial.range_test]
    assert lrs[0] == pytest.approx(base * tune_module.LR_SPAN[0], rel=1e-9)
    ratios = [b / a for a, b in itertools.pairwise(lrs)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-9)  # a geometric sweep
    losses = [loss for _, loss in trial.range_test]
    near = min(losses) + tune_module.PLATEAU * (losses[0] - min(losses))
    assert trial.lr_at_min == next(lr for lr, loss in trial.range_test if loss <= near)
    assert trial.lr_steepest == tune_module.steepest_lr(trial.range_test)
    low = trial.lr_steepest if trial.lr_steepest is not None else trial.lr_at_min / 10
    expected = [low, math.sqrt(low * trial.lr_at_min), trial.lr_at_min]
    tried = [lr for lr, _ in trial.short_runs]
    assert tried == pytest.approx(expected, rel=1e-12)
    best = min(loss for _, loss in trial.short_runs)
    close = [(lr, loss) for lr, loss in trial.short_runs if loss <= best * 1.01]
    chosen_lr, chosen_loss = min(close)
    assert trial.lr == pytest.approx(chosen_lr, rel=1e-12)
    assert trial.held_out_loss == chosen_loss


@settings(max_examples=40, deadline=None)
@given(
    centre=st.floats(min_value=-3.0, max_value=1.0),
    width=st.floats(min_value=0.2, max_value=0.6),
    points=st.integers(min_value=60, max_value=160),
)
def test_steepest_lr_finds_the_fastest_fall_of_a_known_curve(
    centre: float, width: float, points: int
) -> None:
    # loss = 2 - tanh((log10 lr - centre) / width) falls fastest at log10 lr = centre,
    # then rises (divergence) after centre + 2.5 decades
    logs = [-5.0 + 8.0 * i / (points - 1) for i in range(points)]
    curve = [2 - math.tanh((x - centre) / width) + max(0.0, x - centre - 2.5) ** 2 for x in logs]
    found = tune_module.steepest_lr(list(zip([10**x for x in logs], curve, strict=True)))
    assert found is not None
    step = 8.0 / (points - 1)  # one point of resolution, in decades
    assert abs(math.log10(found) - centre) <= step + 1e-9


def test_plateau_start_ignores_noise_along_a_plateau() -> None:
    # falls from 4 to 2.1 by lr 1e-2, then wanders on a plateau whose argmin is at 1e0
    points = [(1e-4, 4.0), (1e-3, 3.0), (1e-2, 2.1), (1e-1, 2.2), (1e0, 2.0), (1e1, 5.0)]
    assert tune_module.plateau_start(points) == 1e-2  # 2.1 <= 2.0 + 0.05 * (4.0 - 2.0)
    assert tune_module.plateau_start([]) is None


@pytest.mark.parametrize(
    ("runs", "index"),
    [
        ([(1e-3, 2.70), (2e-3, 2.69), (4e-3, 2.96)], 0),  # within 1%: the smaller lr
        ([(1e-3, 2.64), (2e-3, 2.48), (4e-3, 2.80)], 1),  # clearly better: kept
        ([(1e-3, math.inf), (2e-3, 2.5), (4e-3, 2.5)], 1),  # a diverged run never wins
    ],
)
def test_conservative_best_breaks_near_ties_toward_the_smaller_lr(
    runs: list[tuple[float, float]], index: int
) -> None:
    assert tune_module.conservative_best(runs) == index


def test_lr_keys_are_scaled_together() -> None:
    hparams = {"lr": 0.02, "aux_lr": 3e-4, "momentum": 0.95, "nesterov": True}
    scaled = tune_module.scaled(hparams, 10.0)
    assert scaled == {"lr": 0.2, "aux_lr": pytest.approx(3e-3), "momentum": 0.95, "nesterov": True}


def test_selection_pickles_and_plots(tmp_path: Path) -> None:
    selection = tune(small_model())
    restored = pickle.loads(pickle.dumps(selection))
    assert restored.tuning == selection.tuning and restored.name == selection.name
    image = tmp_path / "tune.png"
    selection.plot(image)
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_rules_selection_is_a_typed_error(tmp_path: Path) -> None:
    selection = optiplug.AutoOptimizer.for_task("text-classification")
    with pytest.raises(TuneError, match="chosen by rules"):
        selection.plot(tmp_path / "x.png")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"held_out": 0}, "held_out=0"),
        ({"held_out": 1.5}, "held_out=1.5"),
        ({"held_out": 12}, "at least one more"),
        ({"budget_steps": 30}, "budget_steps=30"),
        ({"candidates": "adam"}, "candidates='adam'"),
        ({"candidates": ["adam", "adam"]}, "once"),
    ],
)
def test_bad_arguments_raise_typed_errors_naming_them(
    kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(TuneError, match=match):
        tune(small_model(), **kwargs)


def test_a_loss_that_is_not_a_scalar_is_refused() -> None:
    def per_sample(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (model(batch["x"]) - batch["y"]) ** 2

    with pytest.raises(TuneError, match=r"scalar tensor.*shape \(16, 1\)"):
        optiplug.AutoOptimizer.tune(
            small_model(), per_sample, regression_batches(), candidates=["sgd"], budget_steps=30
        )


def detached(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return regression_loss(model, batch).detach()


def integer(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return regression_loss(model, batch).round().long()


def boolean(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return regression_loss(model, batch) > 0


def complex_valued(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return regression_loss(model, batch) * (1 + 1j)


@pytest.mark.parametrize(
    ("loss_fn", "match"),
    [
        (detached, "does not require grad"),
        (integer, "torch.int64"),
        (boolean, "torch.bool"),
        (complex_valued, "torch.complex64"),
    ],
)
def test_a_loss_that_cannot_be_stepped_on_is_a_tune_error(
    loss_fn: tune_module.LossFn, match: str
) -> None:
    with pytest.raises(TuneError, match=match):
        optiplug.AutoOptimizer.tune(
            small_model(), loss_fn, regression_batches(), candidates=["sgd"], budget_steps=30
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batches": None}, "batches=None: expected an iterable"),
        ({"batches": 7}, "batches=7: expected an iterable"),
        ({"seed": "x"}, "seed='x': expected an integer"),
        ({"seed": 2**70}, f"seed={2**70}: expected an integer from"),
        ({"seed": -(2**64)}, f"seed={-(2**64)}: expected an integer from"),
        ({"seed": True}, "seed=True: expected an integer"),
    ],
)
def test_bad_batches_or_seed_raise_tune_errors_naming_them(
    kwargs: dict[str, object], match: str
) -> None:
    options: dict[str, object] = {"batches": regression_batches(), "candidates": ["sgd"]}
    options.update(kwargs, budget_steps=30)
    with pytest.raises(TuneError, match=re.escape(match)):
        optiplug.AutoOptimizer.tune(small_model(), regression_loss, **options)  # type: ignore[arg-type]


def test_the_largest_seed_torch_accepts_is_accepted() -> None:
    selection = tune(small_model(), candidates=["sgd"], budget_steps=30, seed=2**64 - 1)
    assert selection.tuning is not None and selection.tuning.seed == 2**64 - 1


def test_a_generator_is_read_only_as_far_as_the_budget_needs() -> None:
    given = regression_batches(100)
    read: list[int] = []

    def counted() -> Iterator[dict[str, torch.Tensor]]:
        for index, batch in enumerate(given):
            read.append(index)
            yield batch

    selection = optiplug.AutoOptimizer.tune(
        small_model(),
        regression_loss,
        counted(),
        candidates=["sgd"],
        budget_steps=30,
        held_out=2,
    )
    # 30 steps: a 12-step range test (the most batches one trial trains on) and 2 held out
    assert len(read) == 12 + 2
    assert selection.tuning is not None and selection.tuning.held_out_batches == 2


def test_a_list_still_holds_out_its_last_batches() -> None:
    given = regression_batches(40)
    shuffled = given[:12] + given[20:] + given[12:20]  # only the tail differs
    first = optiplug.AutoOptimizer.tune(
        small_model(), regression_loss, given, candidates=["sgd"], budget_steps=30, held_out=4
    )
    second = optiplug.AutoOptimizer.tune(
        small_model(), regression_loss, shuffled, candidates=["sgd"], budget_steps=30, held_out=4
    )
    assert first.tuning is not None and second.tuning is not None
    assert first.tuning.trials[0].range_test == second.tuning.trials[0].range_test
    assert first.tuning.trials[0].held_out_loss != second.tuning.trials[0].held_out_loss


ENDLESS_TUNE = """
import itertools, resource, sys, torch, optiplug

with open("/proc/self/status") as status:
    data_kb = next(int(line.split()[1]) for line in status if line.startswith("VmData:"))
resource.setrlimit(resource.RLIMIT_DATA, ((data_kb << 10) + (1 << 30), resource.RLIM_INFINITY))
torch.manual_seed(0)
x = torch.randn(16, 4)
batch = (x, x.sum(1, keepdim=True))
selection = optiplug.AutoOptimizer.tune(
    torch.nn.Linear(4, 1),
    lambda model, b: torch.nn.functional.mse_loss(model(b[0]), b[1]),
    itertools.repeat(batch),
    candidates=["sgd"],
    budget_steps=30,
    held_out=0.25,
)
print("tuned:", selection.name, selection.tuning.held_out_batches)
"""


def test_an_endless_iterable_is_read_only_as_far_as_the_budget_needs() -> None:
    # A separate process with a 1 GiB allowance for new data: reading the
    # endless iterable to its end would run out of it (or time out) rather
    # than take the machine's memory.
    done = subprocess.run(
        [sys.executable, "-c", ENDLESS_TUNE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tuned: sgd 4" in done.stdout  # 12 batches to train on, a quarter of 16 held out


def test_every_candidate_diverging_is_reported() -> None:
    def exploding(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return regression_loss(model, batch) * math.inf

    with pytest.raises(TuneError, match="every candidate diverged"):
        optiplug.AutoOptimizer.tune(
            small_model(), exploding, regression_batches(), candidates=["sgd"], budget_steps=30
        )


@pytest.mark.parametrize(("budget", "ranked", "measured"), [(9000, 3, 3), (9000, 5, 5), (10, 3, 1)])
def test_the_default_candidate_count_is_capped_by_the_ranking(
    budget: int, ranked: int, measured: int
) -> None:
    # a larger budget measures no more candidates than the rules rank (the trainings
    # themselves are the next test's, at the budget that first reaches the cap)
    assert tune_module.default_candidates(budget, ranked) == measured


@pytest.mark.parametrize(("budget", "measured"), [(100, 1), (1500, 2), (2250, 3)])
def test_default_candidates_come_from_the_rules_ranking_one_per_750_steps(
    budget: int, measured: int
) -> None:
    model = small_model()
    rules = optiplug.AutoOptimizer.for_model(model, stage="pretraining")
    installed = [r.candidate.algorithm for r in rules.candidates if r.status != "skipped"]
    ranked = list(dict.fromkeys(installed))
    assert len(ranked) >= 3  # muon, adamw and lion are installed in the test environment
    assert tune_module.default_candidates(budget, 3) == measured
    selection = optiplug.AutoOptimizer.tune(
        model, regression_loss, regression_batches(), stage="pretraining", budget_steps=budget
    )
    assert selection.tuning is not None
    assert sorted(t.algorithm for t in selection.tuning.trials) == sorted(ranked[:measured])


def test_a_named_candidate_starts_from_its_rules_recipe() -> None:
    pytest.importorskip("optiplug_lion")
    selection = optiplug.AutoOptimizer.tune(
        small_model(),
        regression_loss,
        regression_batches(),
        candidates=["lion"],
        stage="pretraining",
        budget_steps=60,
        held_out=2,
    )
    assert selection.optimizer == "lion"
    # The pretraining:lion recipe (not lion's registered betas (0.9, 0.99), wd 0.0):
    # every hyperparameter but the lr is the recipe's.
    assert selection.hparams["betas"] == (0.9, 0.95)
    assert selection.hparams["weight_decay"] == pytest.approx(0.3)
    assert "pretraining:lion" in {r.candidate.rule for r in selection.candidates}


def test_graph_tune_optimizer_sets_the_winner_and_keeps_the_loader_rng() -> None:
    torch.manual_seed(0)
    x = torch.randn(128, 4)
    rows = [{"x": x[i], "y": x[i : i + 1] @ TARGET} for i in range(len(x))]
    graph = optiplug.Graph(torch.nn.Linear(4, 1))
    loader = torch.utils.data.DataLoader(rows, batch_size=8, shuffle=True)
    graph.set_data_loader(loader, forward_input="x")
    weights = {k: v.clone() for k, v in graph.module.state_dict().items()}
    rng = torch.get_rng_state()
    selection = graph.tune_optimizer(
        lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"].reshape(-1, 1)),
        candidates=["sgd", "adam"],
        budget_steps=60,
        held_out=2,
    )
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in graph.module.state_dict().items():
        assert torch.equal(value, weights[key])
    assert graph.optimizer is not None
    assert graph.optimizer.param_groups[0]["lr"] == pytest.approx(selection.hparams["lr"])
    assert type(graph.optimizer).__name__.lower().startswith(selection.name)


def test_graph_tune_optimizer_without_batches_needs_a_loader() -> None:
    graph = optiplug.Graph(torch.nn.Linear(4, 1))
    with pytest.raises(optiplug.errors.GraphError, match="tune_optimizer"):
        graph.tune_optimizer(regression_loss)


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_ranks_agree_on_the_tuned_choice(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("tune_worker.py")
    # two ranks, 120 s each as before (waited one after the other)
    outcome = run_ranks(worker, 2, [str(tmp_path)], timeout=240)
    assert [code for code, _ in outcome] == [0, 0], outcome
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0] == reports[1]
    assert reports[0]["group_lr"] == pytest.approx(reports[0]["lr"])


def test_tuned_selection_loads_with_weights_only(tmp_path: Path) -> None:
    selection = tune(small_model())
    torch.save({"selection": selection}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)["selection"]
    assert loaded.tuning == selection.tuning
    assert loaded.hparams == selection.hparams


FSDP_TUNE = """
import sys, torch, optiplug
torch.distributed.init_process_group(
    "gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1
)
graph = optiplug.Graph(torch.nn.Linear(4, 1), parallel="fsdp")
try:
    graph.tune_optimizer(lambda m, b: m(b).sum(), [torch.ones(2, 4)] * 4, candidates=["sgd"])
except optiplug.errors.GraphError as error:
    print("refused:", error)
torch.distributed.destroy_process_group()
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_graph_tune_optimizer_refuses_a_sharded_module(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FSDP_TUNE, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "AutoOptimizer.tune" in done.stdout


@settings(max_examples=50, deadline=None)
@given(total=st.integers(min_value=1, max_value=2000))
def test_short_runs_warm_up_then_decay_by_a_cosine(total: int) -> None:
    factors = [tune_module.warmup_cosine(step, total) for step in range(total)]
    warmup = max(1, total // tune_module.WARMUP_DIVISOR)
    assert all(0 < f <= 1 for f in factors)
    assert factors[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    decay = factors[warmup - 1 :]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(decay))  # never rises again
    if total - warmup > 1:
        middle = warmup + (total - warmup) // 2
        expected = 0.5 * (1 + math.cos(math.pi * (middle - warmup) / (total - warmup)))
        assert factors[middle] == pytest.approx(max(expected, 1e-3))

"""AutoOptimizer and tune see the whole catalogue: bridged names, qualified names, their rules."""

from __future__ import annotations

import pytest
import torch

import optiplug
from optiplug.errors import ModelConfigError

pytest.importorskip("optiplug_schedulefree")
pytest.importorskip("optiplug_pytorch_optimizer")


def _algorithms(selection: optiplug.Selection) -> list[str]:
    return [report.candidate.algorithm for report in selection.candidates]


def test_schedule_free_adamw_is_proposed_when_the_horizon_is_unknown_citing_its_source() -> None:
    unknown = optiplug.AutoOptimizer.for_task(
        "causal-lm", num_parameters=10**8, stage="pretraining"
    )
    assert "schedulefree:adamw_schedulefree" in _algorithms(unknown)
    report = next(
        r for r in unknown.candidates if r.candidate.algorithm == "schedulefree:adamw_schedulefree"
    )
    assert "arXiv 2405.15682" in report.candidate.reason
    assert report.candidate.score < 20  # below the core's pretraining AdamW: not a new default
    known = optiplug.AutoOptimizer.for_task(
        "causal-lm", num_parameters=10**8, stage="pretraining", total_steps=10_000
    )
    assert "schedulefree:adamw_schedulefree" not in _algorithms(known)
    # the proposal builds, through its qualified name
    param = torch.nn.Parameter(torch.zeros(4, 4))
    built = optiplug.create("schedulefree:adamw_schedulefree", [param], **report.candidate.hparams)
    assert type(built).__name__ == "AdamWScheduleFree"


@pytest.mark.parametrize("steps", [0, -5, 2.5, True])
def test_a_bad_total_steps_is_refused(steps: object) -> None:
    with pytest.raises(ModelConfigError, match="total_steps"):
        optiplug.AutoOptimizer.for_task("causal-lm", stage="pretraining", total_steps=steps)  # type: ignore[arg-type]


def test_tune_takes_any_registered_name_qualified_ones_included() -> None:
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(4, 1, generator=generator)
    batches = []
    for _ in range(12):
        x = torch.randn(16, 4, generator=generator)
        batches.append({"x": x, "y": x @ target})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def loss(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(module(batch["x"]), batch["y"])

    selection = optiplug.AutoOptimizer.tune(
        model,
        loss,
        batches,
        candidates=["pytorch_optimizer:adan", "sgd"],
        budget_steps=60,
        held_out=2,
    )
    measured = {trial.algorithm for trial in selection.tuning.trials}  # type: ignore[union-attr]
    assert measured == {"pytorch_optimizer:adan", "sgd"}
    assert selection.name in measured

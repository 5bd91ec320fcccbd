"""AutoOptimizer's memory budget: the arithmetic, the precision ladder, FSDP, the CLI."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import attrs
import pytest
import torch

import optiplug
from optiplug import AutoOptimizer, cli
from optiplug.errors import HyperparameterError

N = 7_000_000_000
WEIGHTS = N * 4  # float32 parameters; the gradients take as much again
TASK = {"task": "text-generation", "num_parameters": N, "stage": "pretraining"}
LLAMA2_7B_BF16 = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def gb(size: float) -> str:
    return f"{size / 1e9:.1f} GB"


def rules_choice() -> optiplug.Selection:
    return AutoOptimizer.for_task(**TASK)


def needs(algorithm: str, precision: str, num_parameters: int = N, size: int = 4) -> int:
    """Parameters + gradients + state, counted here independently of the plan."""
    state = optiplug.estimate_memory(
        algorithm,
        num_parameters,
        dtype={4: "float32", 2: "bfloat16"}[size],
        state_precision=precision,
    ).total
    return 2 * num_parameters * size + state


def test_the_rules_choice_for_a_7b_causal_lm_takes_8_bytes_of_state_per_parameter() -> None:
    # muon (when installed) or adamw: both estimated at two parameter-sized slots
    rules = rules_choice()
    assert rules.optimizer in ("muon", "adamw")
    assert optiplug.estimate_memory(rules.optimizer, N).total == pytest.approx(8 * N, rel=1e-5)
    assert rules.memory is None


def test_a_budget_that_fits_fp32_state_keeps_the_choice() -> None:
    rules = rules_choice()
    selection = AutoOptimizer.for_task(**TASK, memory_budget="120GB")
    assert (selection.optimizer, selection.hparams) == (rules.optimizer, rules.hparams)
    assert "state_precision" not in selection.hparams
    assert selection.reason == rules.reason
    plan = selection.memory
    assert plan is not None and plan.fits is True and plan.budget == 120 * 10**9
    assert plan.chosen is not None and plan.chosen.state_precision == "fp32"
    expected = WEIGHTS * 2 + optiplug.estimate_memory(rules.optimizer, N).total
    assert plan.chosen.total == expected == needs(rules.optimizer, "fp32")
    assert (plan.chosen.parameters, plan.chosen.gradients) == (WEIGHTS, WEIGHTS)
    text = selection.explain()
    assert "memory budget: 120.0 GB per device" in text
    assert (
        f"needs {gb(expected)} (parameters 28.0 GB + gradients 28.0 GB + state 56.0 GB at fp32)"
        in text
    )
    assert "8.0 GB under the budget" in text
    assert "activations and temporary buffers are not counted" in text


@pytest.mark.parametrize(("budget", "precision"), [("90GB", "bf16"), ("75GB", "int8")])
def test_a_tighter_budget_keeps_the_state_at_a_lower_precision(budget: str, precision: str) -> None:
    rules = rules_choice()
    selection = AutoOptimizer.for_task(**TASK, memory_budget=budget)
    assert selection.optimizer == rules.optimizer
    assert selection.hparams == {**rules.hparams, "state_precision": precision}
    assert f"state kept at {precision} to fit the memory budget" in selection.reason
    plan = selection.memory
    assert plan is not None and plan.fits is True and plan.chosen is not None
    assert plan.chosen.state_precision == precision
    assert plan.chosen.total == needs(rules.optimizer, precision) <= int(budget[:-2]) * 10**9
    ladder = ["fp32", "bf16", "int8"][: ["fp32", "bf16", "int8"].index(precision) + 1]
    assert [option.state_precision for option in plan.tried] == ladder
    text = selection.explain()
    state = optiplug.estimate_memory(rules.optimizer, N, state_precision=precision).total
    assert (
        f"needs {gb(plan.chosen.total)} (parameters 28.0 GB + gradients 28.0 GB + "
        f"state {gb(state)} at {precision})" in text
    )
    over = needs(rules.optimizer, "fp32") - int(budget[:-2]) * 10**9
    assert f"at fp32: 112.0 GB (state 56.0 GB): over by {gb(over)}" in text
    assert f"state_precision={precision!r}" in text.splitlines()[1]  # the chosen: line
    assert ("70.2 GB" if precision == "int8" else "84.0 GB") in text


def test_int8_state_of_the_7b_choice_is_70_2_gb() -> None:
    """The figure by hand: 2 x 28 GB + 2 slots x 7e9 x (1 + 4/256) bytes + 7000 step counters."""
    by_hand = 2 * WEIGHTS + 2 * math.ceil(N * (1 + 4 / 256)) + 7000 * 4
    plan = AutoOptimizer.for_task(**TASK, memory_budget="75GB").memory
    assert plan is not None and plan.chosen is not None and plan.chosen.total == by_hand
    assert gb(by_hand) == "70.2 GB"


def test_no_precision_of_the_choice_fits_so_another_candidate_is_chosen() -> None:
    rules = rules_choice()
    selection = AutoOptimizer.for_task(**TASK, memory_budget="62GB")
    assert selection.optimizer == "lion"  # 59.7 GB at int4; muon/adamw need 63.4 GB at int4
    lion = next(r.candidate for r in rules.candidates if r.candidate.algorithm == "lion")
    assert selection.hparams == {**lion.hparams, "state_precision": "int4"}
    assert "the rules' first choice does not fit the memory budget" in selection.reason
    plan = selection.memory
    assert plan is not None and plan.chosen is not None
    assert plan.chosen.total == needs("lion", "int4") == 2 * WEIGHTS + math.ceil(N * 0.53125)
    statuses = {(r.candidate.rule, r.status) for r in selection.candidates}
    assert ("pretraining:lion", "chosen") in statuses
    assert ("pretraining:adamw", "over budget") in statuses
    note = next(r.note for r in selection.candidates if r.candidate.rule == "pretraining:adamw")
    assert note == f"needs at least {gb(needs('adamw', 'int4'))}, over the 62.0 GB budget"
    text = selection.explain()
    assert "fits: lion (rule pretraining:lion) at int4 needs 59.7 GB" in text
    assert "at int4: 63.4 GB (state 7.4 GB): over by 1.4 GB" in text


def test_a_budget_nothing_fits_keeps_the_choice_and_says_how_many_fsdp_ranks_would() -> None:
    rules = rules_choice()
    selection = AutoOptimizer.for_task(**TASK, memory_budget="24GB")
    assert (selection.optimizer, selection.hparams) == (rules.optimizer, rules.hparams)
    assert selection.candidates == rules.candidates
    plan = selection.memory
    assert plan is not None and plan.fits is False
    assert plan.chosen is not None and plan.chosen.state_precision == "fp32"
    assert plan.chosen.total == needs(rules.optimizer, "fp32")
    # the most compact option tried: lion with int4 state, 59.7 GB; 3 ranks hold 19.9 GB each
    assert plan.compact is not None
    assert (plan.compact.algorithm, plan.compact.state_precision) == ("lion", "int4")
    assert plan.compact.total == min(option.total for option in plan.tried)
    compact = needs("lion", "int4")
    assert plan.compact.total == compact and plan.fsdp_ranks == math.ceil(compact / 24e9) == 3
    text = selection.explain()
    assert "does not fit: the rules' choice" in text and "returned unchanged" in text
    assert (
        "most compact: lion (rule pretraining:lion) at int4 needs 59.7 GB (parameters 28.0 GB "
        "+ gradients 28.0 GB + state 3.7 GB at int4)"
    ) in text
    assert (
        f"over 3 ranks with FSDP (parameters, gradients and state sharded) it needs "
        f"{gb(math.ceil(compact / 3))} per rank, which fits"
    ) in text
    assert gb(math.ceil(compact / 3)) == "19.9 GB"
    # and the choice as returned: 112 GB over 5 ranks, 22.4 GB each
    assert (
        "over 5 ranks with FSDP (parameters, gradients and state sharded) it needs 22.4 GB" in text
    )


def test_a_budget_even_1024_ranks_cannot_hold_says_so() -> None:
    selection = AutoOptimizer.for_task(**TASK, memory_budget="10MB")
    assert selection.memory is not None and selection.memory.fsdp_ranks is None
    assert "does not fit even over 1024 ranks with FSDP" in selection.explain()


def test_a_bf16_config_counts_2_bytes_per_parameter() -> None:
    selection = AutoOptimizer.for_task(
        "text-generation", LLAMA2_7B_BF16, stage="finetuning", memory_budget="40GB"
    )
    count = selection.request.num_parameters
    assert count is not None
    plan = selection.memory
    assert plan is not None and plan.dtype == "bfloat16" and plan.chosen is not None
    assert (plan.chosen.parameters, plan.chosen.gradients) == (2 * count, 2 * count)
    # fp32 state_precision keeps bf16 state (the parameters' dtype): 26.4 + 26.4 GB, over 40 GB;
    # bf16 is the same size; int8 fits
    assert [o.state_precision for o in plan.tried] == ["fp32", "bf16", "int8"]
    assert plan.chosen.total == needs(selection.optimizer, "int8", count, size=2) <= 40e9
    assert selection.hparams["state_precision"] == "int8"
    assert "keeps the state in the parameters' dtype (bfloat16)" in selection.explain()


def test_a_config_without_a_dtype_is_float32_and_says_so() -> None:
    config = {key: v for key, v in LLAMA2_7B_BF16.items() if key != "torch_dtype"}
    selection = AutoOptimizer.from_config(config, task="causal-lm", memory_budget="1TB")
    plan = selection.memory
    assert plan is not None and plan.dtype == "float32" and plan.fits is True
    assert "note: float32 parameters assumed" in selection.explain()


def test_for_model_reads_the_parameters_dtype_and_leaves_frozen_ones_out_of_the_state() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 10))
    model = model.to(torch.bfloat16)
    model[1].weight.requires_grad_(False)
    trainable = 1000 * 1000 + 1000 + 10
    selection = AutoOptimizer.for_model(model, memory_budget=6_000_000)
    plan = selection.memory
    assert plan is not None and plan.dtype == "bfloat16" and plan.num_parameters == trainable
    assert plan.chosen is not None
    assert plan.chosen.parameters == 2 * (trainable + 10_000)  # the frozen weight counts
    assert plan.chosen.gradients == 2 * trainable
    assert (
        plan.chosen.state
        == optiplug.estimate_memory(
            selection.optimizer, trainable, dtype="bfloat16", state_precision="int4"
        ).total
    )
    assert selection.hparams["state_precision"] == "int4" and plan.chosen.total <= 6_000_000
    assert "20.0 KB of frozen parameters: no gradients, no state" in selection.explain()


@pytest.mark.parametrize(
    ("budget", "size"),
    [
        ("24GB", 24 * 10**9),
        ("80 GiB", 80 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5tb", 1_500_000_000_000),
        ("2e9", 2 * 10**9),
        (24 * 10**9, 24 * 10**9),
        (24e9, 24 * 10**9),
    ],
)
def test_budgets_are_bytes_or_sizes(budget: int | str, size: int) -> None:
    plan = AutoOptimizer.for_task(**TASK, memory_budget=budget).memory
    assert plan is not None and plan.budget == size


@pytest.mark.parametrize(
    "budget", ["abc", "", "24G", "0GB", "-5GB", "24 parsecs", 0, -1, 1.5, True, float("inf")]
)
def test_a_bad_budget_names_memory_budget_and_the_value(budget: object) -> None:
    with pytest.raises(HyperparameterError) as caught:
        AutoOptimizer.for_task(**TASK, memory_budget=budget)  # type: ignore[arg-type]
    assert caught.value.field == "memory_budget" and caught.value.value == budget
    assert f"memory_budget={budget!r}" in str(caught.value)


def test_g_alone_is_refused_as_ambiguous() -> None:
    with pytest.raises(HyperparameterError, match="G alone is ambiguous: write GB or GiB"):
        AutoOptimizer.for_task(**TASK, memory_budget="24G")


def test_a_budget_needs_a_parameter_count() -> None:
    with pytest.raises(HyperparameterError, match="needs the parameter count"):
        AutoOptimizer.for_task("text-generation", memory_budget="24GB")


def test_a_selection_with_a_plan_pickles_and_evolves() -> None:
    selection = AutoOptimizer.for_task(**TASK, memory_budget="24GB")
    again = pickle.loads(pickle.dumps(selection))
    assert again.memory == selection.memory and again.explain() == selection.explain()
    assert attrs.evolve(selection, reason="x").memory == selection.memory


def unsized_plugin() -> object:
    """Algorithms without a ``state_precision``: one with a declared state, one without."""

    class Algorithms:
        @optiplug.hookimpl
        def optiplug_optimizers(self):
            slot = optiplug.StateSlot("momentum_buffer")
            return [
                optiplug.OptimizerSpec("fixed_sgd", torch.optim.SGD, state_slots=(slot,)),
                optiplug.OptimizerSpec("opaque_sgd", torch.optim.SGD),
            ]

        @optiplug.hookimpl
        def optiplug_select_optimizer(self, request):
            return [
                optiplug.Candidate(name, {"lr": 0.1}, score, rule=f"{name}-rule")
                for name, score in self.ranking
            ]

    return Algorithms()


def registry_ranking(*ranking: tuple[str, float]) -> optiplug.Registry:
    registry = optiplug.Registry(autoload=False)
    plugin = unsized_plugin()
    plugin.ranking = ranking  # type: ignore[attr-defined]
    registry.register(plugin, "unsized")
    return registry


def test_an_algorithm_without_state_precision_is_counted_once_as_it_stores_its_state() -> None:
    registry = registry_ranking(("fixed_sgd", 2))
    selection = AutoOptimizer.for_task(
        "x", num_parameters=1000, registry=registry, memory_budget=100
    )
    plan = selection.memory
    assert plan is not None and plan.fits is False and plan.chosen is not None
    assert plan.chosen.state_precision is None and plan.chosen.total == 3 * 4000
    assert len(plan.tried) == 1 and selection.hparams == {"lr": 0.1}
    assert "takes no state_precision" in selection.explain()


def test_a_choice_whose_state_cannot_be_estimated_is_left_as_it_is() -> None:
    registry = registry_ranking(("opaque_sgd", 2), ("fixed_sgd", 1))
    selection = AutoOptimizer.for_task(
        "x", num_parameters=1000, registry=registry, memory_budget="1GB"
    )
    plan = selection.memory
    assert selection.optimizer == "opaque_sgd" and plan is not None and plan.fits is None
    text = selection.explain()
    assert "not applied: the choice's state memory could not be estimated" in text
    assert "opaque_sgd (rule opaque_sgd-rule): state memory not estimated" in text


def test_the_cli_prints_the_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["auto", "--task", "causal-lm", "--params", "7B", "--stage", "pretraining"]
    assert cli.main([*args, "--memory-budget", "75GB"]) == 0
    out = capsys.readouterr().out
    assert "memory budget: 75.0 GB per device" in out
    assert "state_precision='int8'" in out and "+ state 14.2 GB at int8), 4.8 GB under" in out
    assert cli.main([*args, "--memory-budget", "24GB", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["fits"] is False and memory["fsdp_ranks"] == 3
    assert memory["compact"]["total"] == needs("lion", "int4")
    assert cli.main([*args, "--memory-budget", "lots"]) == 2
    assert "invalid memory_budget='lots'" in capsys.readouterr().err
    assert cli.main(["auto", "--task", "causal-lm", "--memory-budget", "24GB"]) == 2
    assert "needs the parameter count" in capsys.readouterr().err


def test_no_budget_leaves_the_explanation_as_it_was() -> None:
    assert "memory budget" not in rules_choice().explain()


def test_a_budgeted_selection_loads_with_weights_only(tmp_path: Path) -> None:
    selection = optiplug.AutoOptimizer.for_task(
        "text-generation", num_parameters=7_000_000_000, stage="pretraining", memory_budget="75GB"
    )
    torch.save(selection, tmp_path / "selection.pt")
    loaded = torch.load(tmp_path / "selection.pt", weights_only=True)
    assert loaded == selection and loaded.memory is not None

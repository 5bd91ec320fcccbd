"""AutoOptimizer: rules as hooks, estimates from real configs, explanations."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from conftest import run_python

import optiplug
from optiplug import AutoOptimizer, Selection
from optiplug.errors import ModelConfigError

# Public configs, as published with the models (trimmed to the fields that matter).
GPT2 = {
    "model_type": "gpt2",
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "vocab_size": 50257,
    "n_positions": 1024,
}
BERT_BASE = {
    "model_type": "bert",
    "num_hidden_layers": 12,
    "hidden_size": 768,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
LLAMA2_7B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
TOY = {"n_layer": 2, "n_embd": 64, "vocab_size": 100, "n_positions": 32}

PUBLISHED = {
    "gpt2": (GPT2, 124_439_808),
    "bert": (BERT_BASE, 109_482_240),
    "llama": (LLAMA2_7B, 6_738_415_616),
}
SMALL = ("adam", {"lr": 5e-5})
MID = ("adamw", {"lr": 2e-5, "betas": (0.9, 0.999), "weight_decay": 0.01})
LARGE = ("adamw", {"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1})


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_estimate_is_within_five_percent_of_published(name: str) -> None:
    config, published = PUBLISHED[name]
    from optiplug._auto.model_config import estimate_parameters

    estimate, exact = estimate_parameters(config)
    assert not exact
    assert abs(estimate - published) / published < 0.05, (estimate, published)


@pytest.mark.parametrize(
    ("config", "task", "expected"),
    [
        (GPT2, None, MID),
        (BERT_BASE, None, MID),
        (LLAMA2_7B, None, LARGE),
        (TOY, None, SMALL),
        (TOY, "Causal_LM", ("adamw", {"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1})),
        (
            LLAMA2_7B,
            "text-generation",
            ("adamw", {"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1}),
        ),
        (GPT2, "sentiment-analysis", ("adam", {"lr": 2e-5})),
        (LLAMA2_7B, "TEXT_CLASSIFICATION", ("adam", {"lr": 2e-5})),
        (BERT_BASE, "question-answering", ("adamw", {"lr": 3e-5, "weight_decay": 0.01})),
        (GPT2, "translation", MID),
    ],
)
def test_rules_choose_per_design(
    config: dict, task: str | None, expected: tuple[str, dict]
) -> None:
    selection = AutoOptimizer.from_config(config, task=task, stage="finetuning")
    assert (selection.optimizer, selection.hparams) == expected


def test_unknown_task_falls_back_to_size_rules_and_says_so() -> None:
    text = AutoOptimizer.explain(task="translation", config=GPT2)
    assert "no rule for task 'translation', so by size" in text
    assert "chosen: adamw" in text


def test_selection_is_a_picklable_factory() -> None:
    selection = AutoOptimizer.for_task("text-classification")
    assert isinstance(selection, optiplug.OptimizerFactory) and isinstance(selection, Selection)
    model = torch.nn.Linear(4, 2)
    optimizer = selection(model.parameters())
    assert type(optimizer).__name__ == "Adam" and optimizer.param_groups[0]["lr"] == 2e-5
    again = pickle.loads(pickle.dumps(selection))
    assert again.optimizer == "adam" and again.hparams == {"lr": 2e-5}
    assert [r.status for r in selection.candidates] == ["chosen", "outscored"]


def test_for_model_counts_trainable_parameters_exactly() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.Linear(5, 1))
    model[1].weight.requires_grad_(False)
    selection = AutoOptimizer.for_model(model)
    assert selection.request.num_parameters == 10 * 5 + 5 + 1
    assert selection.request.parameters_exact and selection.request.model_type == "Sequential"
    assert selection.optimizer == "adam"


def test_with_schedule_pairs_a_schedule() -> None:
    selection = AutoOptimizer.with_schedule(
        AutoOptimizer.for_task(None), {"name": "cosine", "total_steps": 100}
    )
    assert selection.schedule == optiplug.schedule("cosine", total_steps=100)
    assert "schedule: " in selection.explain()


def test_config_path_and_pretrained_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    assert AutoOptimizer.from_config(tmp_path / "config.json").hparams == LARGE[1]
    assert AutoOptimizer.from_pretrained(tmp_path).hparams == LARGE[1]
    assert AutoOptimizer.from_pretrained(str(tmp_path / "config.json")).optimizer == "adamw"


def test_from_pretrained_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelConfigError, match="nowhere: no such file or directory") as caught:
        AutoOptimizer.from_pretrained(missing)
    assert "pass a local directory containing config.json" in str(caught.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelConfigError, match=r"empty: directory has no config\.json"):
        AutoOptimizer.from_pretrained(empty)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"broken/config\.json: not valid JSON"):
        AutoOptimizer.from_pretrained(broken)


def test_config_without_size_keys_lists_what_it_looked_for() -> None:
    with pytest.raises(ModelConfigError) as caught:
        AutoOptimizer.from_config({"hidden_size": 8})
    message = str(caught.value)
    assert "num_hidden_layers/n_layer/num_layers" in message and "vocab_size" in message
    assert AutoOptimizer.from_config({"num_parameters": 2_000_000_000}).hparams == LARGE[1]


def rule_plugin(name: str, algorithm: str, score: float, lr: float) -> object:
    class Rule:
        @optiplug.hookimpl
        def optiplug_select_optimizer(self, request):
            return [
                optiplug.Candidate(
                    algorithm, {"lr": lr}, score, f"{name} likes {algorithm}", rule=name
                )
            ]

    return Rule()


def sgd_plugin(*names: str) -> object:
    class Algorithms:
        @optiplug.hookimpl
        def optiplug_optimizers(self):
            return [optiplug.OptimizerSpec(name=n, factory=torch.optim.SGD) for n in names]

    return Algorithms()


@pytest.mark.parametrize("order", [("zeta", "alpha"), ("alpha", "zeta")])
def test_equal_scores_pick_the_same_winner_in_any_registration_order(
    order: tuple[str, str],
) -> None:
    registry = optiplug.Registry(autoload=False)
    registry.register(sgd_plugin("x_sgd", "y_sgd"), "algorithms")
    rules = {
        "zeta": rule_plugin("zeta", "y_sgd", 99, 0.2),
        "alpha": rule_plugin("alpha", "x_sgd", 99, 0.1),
    }
    rules_same_algorithm = {
        "zeta": rule_plugin("zeta2", "x_sgd", 99, 0.3),
        "alpha": rule_plugin("alpha2", "x_sgd", 99, 0.4),
    }
    for name in order:
        registry.register(rules[name], name)
        registry.register(rules_same_algorithm[name], name + "2")
    selection = AutoOptimizer.for_task("anything", registry=registry)
    assert (selection.optimizer, selection.hparams) == (
        "x_sgd",
        {"lr": 0.1},
    )  # then plugin name: alpha


def test_candidates_for_missing_algorithms_are_skipped_and_explained() -> None:
    registry = optiplug.Registry(autoload=False)
    registry.register(sgd_plugin("x_sgd"), "algorithms")
    registry.register(rule_plugin("dreamer", "not_installed", 1000, 1.0), "dreamer")
    registry.register(rule_plugin("modest", "x_sgd", 1, 0.5), "modest")
    selection = AutoOptimizer.for_task(None, registry=registry)
    assert selection.optimizer == "x_sgd"
    text = selection.explain()
    assert "skipped: 'not_installed' is not installed" in text


THIRD_PARTY_RULE = """
import optiplug

@optiplug.hookimpl
def optiplug_select_optimizer(request):
    if request.task == "text-classification":
        return [optiplug.Candidate("sgd", {"lr": 0.5, "momentum": 0.9}, 500.0,
                                   "Acme knows classifiers", rule="acme-classifier")]
    return []
"""

SELECT = (
    "import optiplug\n"
    "s = optiplug.AutoOptimizer.for_task('text-classification')\n"
    "print(s.optimizer, s.hparams['lr'])\n"
    "print(s.explain())\n"
)


def test_installed_third_party_rule_wins_and_uninstalling_restores_default(
    make_distribution,
) -> None:
    acme = make_distribution("optiplug-acme-rules", THIRD_PARTY_RULE)
    installed = run_python(SELECT, acme)
    assert installed.returncode == 0, installed.stderr
    first, *explanation = installed.stdout.splitlines()
    assert first == "sgd 0.5"
    assert any("optiplug-acme-rules 0.1.0" in line and "chosen" in line for line in explanation)
    uninstalled = run_python(SELECT)
    assert uninstalled.stdout.splitlines()[0] == "adam 2e-05"


def test_cli_auto_prints_selection_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optiplug import cli

    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2))
    assert cli.main(["auto", "--task", "question-answering", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "chosen: adamw" in out and "task:question-answering" in out and "size" in out
    assert cli.main(["auto", "--params", "2000000000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["optimizer"] == "adamw" and data["hparams"]["weight_decay"] == 0.1
    assert data["request"]["num_parameters"] == 2_000_000_000
    assert cli.main(["auto", "--config", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such file or directory" in capsys.readouterr().err


# Stage-aware rules: (stage, N, task) -> (winner without muon, lr) and whether muon is proposed.
PRETRAIN = {"betas": (0.9, 0.95), "weight_decay": 0.1}


@pytest.mark.parametrize(
    ("stage", "n", "task", "expected"),
    [
        ("pretraining", None, "causal-lm", ("adamw", {"lr": 1e-3, **PRETRAIN})),
        ("pretraining", 10_700_000, "causal-lm", ("adamw", {"lr": 1e-3, **PRETRAIN})),
        ("pretraining", 10**8, None, ("adamw", {"lr": 1e-3, **PRETRAIN})),
        ("pretraining", 124_439_808, "causal-lm", ("adamw", {"lr": 6e-4, **PRETRAIN})),
        ("pretraining", 350 * 10**6, "causal-lm", ("adamw", {"lr": 3e-4, **PRETRAIN})),
        ("pretraining", 760 * 10**6, "causal-lm", ("adamw", {"lr": 2.5e-4, **PRETRAIN})),
        ("pretraining", 1_300 * 10**6, "causal-lm", ("adamw", {"lr": 2e-4, **PRETRAIN})),
        ("pretraining", 2_700 * 10**6, "causal-lm", ("adamw", {"lr": 1.6e-4, **PRETRAIN})),
        ("pretraining", 6_738_415_616, "causal-lm", ("adamw", {"lr": 1e-4, **PRETRAIN})),
        ("pretraining", 13 * 10**9, "causal-lm", ("adamw", {"lr": 1e-4, **PRETRAIN})),
        ("pretraining", 175 * 10**9, "causal-lm", ("adamw", {"lr": 6e-5, **PRETRAIN})),
        ("pretraining", 10**12, "causal-lm", ("adamw", {"lr": 6e-5, **PRETRAIN})),
        ("pretraining", 10**7, "text-classification", ("adamw", {"lr": 1e-3, **PRETRAIN})),
        ("finetuning", 10**7, None, SMALL),
        ("finetuning", 124_439_808, None, MID),
        ("finetuning", 7 * 10**9, None, LARGE),
        ("finetuning", 10**7, "causal-lm", ("adamw", {"lr": 2e-5, **PRETRAIN})),
        ("finetuning", 124_439_808, "text-classification", ("adam", {"lr": 2e-5})),
        ("finetuning", 124_439_808, "qa", ("adamw", {"lr": 3e-5, "weight_decay": 0.01})),
        (None, 10**7, None, SMALL),
        (None, 124_439_808, None, MID),
        (None, 7 * 10**9, "causal-lm", ("adamw", {"lr": 2e-5, **PRETRAIN})),
        (None, 10**7, "text-classification", ("adam", {"lr": 2e-5})),
    ],
)
def test_rules_by_stage_and_size(
    stage: str | None, n: int | None, task: str | None, expected: tuple[str, dict]
) -> None:
    registry = optiplug.Registry(disabled=["muon"])
    selection = AutoOptimizer.for_task(task, num_parameters=n, stage=stage, registry=registry)
    assert (selection.optimizer, selection.hparams) == expected
    assert all(r.candidate.algorithm != "muon" for r in selection.candidates)  # its plugin's rule
    with_muon = AutoOptimizer.for_task(task, num_parameters=n, stage=stage)
    proposes_muon = any(r.candidate.algorithm == "muon" for r in with_muon.candidates)
    assert proposes_muon == (stage == "pretraining" and task in (None, "causal-lm"))


SOURCES = ("GPT-3", "nanoGPT", "Moonlight", "BERT", "Llama 2")


@pytest.mark.parametrize("stage", ["pretraining", "finetuning", None])
@pytest.mark.parametrize("n", [None, 10**7, 124_439_808, 2 * 10**9, 10**12])
@pytest.mark.parametrize("task", [None, "causal-lm", "text-classification", "qa", "translation"])
def test_every_builtin_reason_names_its_source(
    stage: str | None, n: int | None, task: str | None
) -> None:
    selection = AutoOptimizer.for_task(task, num_parameters=n, stage=stage)
    builtin = [
        r.candidate
        for r in selection.candidates
        if r.candidate.provider is not None and r.candidate.provider.plugin == "rules"
    ]
    assert builtin
    for candidate in builtin:
        assert any(source in candidate.reason for source in SOURCES), candidate.reason
        assert any(
            marker in candidate.reason for marker in ("Table", "Section", "Appendix", "config/")
        ), candidate.reason


def test_explain_says_stage_unknown_only_when_it_is() -> None:
    unknown = AutoOptimizer.explain(task="causal-lm", num_parameters=10**9)
    assert "stage unknown" in unknown and "assumed fine-tuning" in unknown
    for stage in ("pretraining", "finetuning"):
        text = AutoOptimizer.explain(task="causal-lm", num_parameters=10**9, stage=stage)
        assert "stage unknown" not in text


def test_pretraining_prefers_muon_when_installed_and_adamw_when_disabled() -> None:
    pytest.importorskip("optiplug_muon")
    with_muon = AutoOptimizer.for_task("causal-lm", num_parameters=10**7, stage="pretraining")
    assert (with_muon.optimizer, with_muon.hparams) == ("muon", {})  # the plugin's recipe wins
    assert "Jordan et al. 2024" in with_muon.reason
    muon = [r for r in with_muon.candidates if r.candidate.algorithm == "muon"]
    assert [(r.candidate.rule, r.status) for r in muon] == [("muon:pretraining", "chosen")]
    registry = optiplug.Registry(disabled=["muon"])
    without = AutoOptimizer.for_task(
        "causal-lm", num_parameters=10**7, stage="pretraining", registry=registry
    )
    assert (without.optimizer, without.hparams["lr"]) == ("adamw", 1e-3)
    assert all(r.candidate.algorithm != "muon" for r in without.candidates)


@pytest.mark.parametrize(
    ("n", "betas", "betas_source"),
    [
        (None, (0.9, 0.95), "GPT-NeoX"),
        (10**7, (0.9, 0.95), "GPT-NeoX"),
        (10**8, (0.9, 0.95), "GPT-NeoX"),
        (124_439_808, (0.95, 0.98), "language-model runs"),
        (7 * 10**9, (0.95, 0.98), "language-model runs"),
    ],
)
def test_pretraining_lion_takes_adamws_lr_over_3_and_weight_decay_times_3(
    n: int | None, betas: tuple[float, float], betas_source: str
) -> None:
    registry = optiplug.Registry(disabled=["muon"])
    selection = AutoOptimizer.for_task(
        "causal-lm", num_parameters=n, stage="pretraining", registry=registry
    )
    by_rule = {r.candidate.rule: r for r in selection.candidates}
    adamw, lion = by_rule["pretraining:adamw"].candidate, by_rule["pretraining:lion"]
    assert lion.status == "outscored" and lion.candidate.score < adamw.score
    # 3 significant figures of adamw's lr / 3: relative error below 5e-3.
    assert lion.candidate.hparams["lr"] * 3 == pytest.approx(adamw.hparams["lr"], rel=5e-3)
    assert lion.candidate.hparams["weight_decay"] == pytest.approx(
        3 * adamw.hparams["weight_decay"]
    )
    assert lion.candidate.hparams["betas"] == betas
    assert "Chen et al. 2023" in lion.candidate.reason and betas_source in lion.candidate.reason
    optiplug.create("lion", [torch.nn.Parameter(torch.ones(2))], **lion.candidate.hparams)


def test_pretraining_falls_back_to_lion_only_without_muon_and_adamw() -> None:
    registry = optiplug.Registry(disabled=["muon", "adamw"])
    selection = AutoOptimizer.for_task(
        "causal-lm", num_parameters=10**7, stage="pretraining", registry=registry
    )
    assert selection.optimizer == "lion" and selection.hparams["betas"] == (0.9, 0.95)


@pytest.mark.parametrize("stage", ["finetuning", None])
@pytest.mark.parametrize("n", [None, 10**7, 124_439_808, 7 * 10**9])
@pytest.mark.parametrize("task", [None, "causal-lm", "text-classification", "qa"])
def test_finetuning_never_proposes_muon(stage: str | None, n: int | None, task: str | None) -> None:
    selection = AutoOptimizer.for_task(task, num_parameters=n, stage=stage)
    assert selection.optimizer != "muon"
    assert all(r.candidate.algorithm != "muon" for r in selection.candidates)


def test_train_job_asks_for_pretraining() -> None:
    from optiplug_train.optim import resolve_optimizer

    registry = optiplug.Registry(disabled=["muon"])
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    chosen = resolve_optimizer("auto", model, registry)
    assert chosen.request.stage == "pretraining" and chosen.request.task == "text-generation"
    assert (chosen.name, chosen.hparams["lr"]) == ("adamw", 1e-3)


def test_cli_auto_stage_pretraining_explains_the_new_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from optiplug import cli

    assert (
        cli.main(["auto", "--task", "causal-lm", "--params", "350M", "--stage", "pretraining"]) == 0
    )
    out = capsys.readouterr().out
    assert "pretraining:adamw" in out and "muon:pretraining" in out
    assert "stage unknown" not in out
    selection = AutoOptimizer.for_task("causal-lm", num_parameters=350 * 10**6, stage="pretraining")
    adamw = {r.candidate.rule: r.candidate for r in selection.candidates}["pretraining:adamw"]
    assert adamw.hparams["lr"] == 3e-4
    assert "GPT-3 (Brown et al. 2020, Table 2.1), 350M row" in adamw.reason

"""Names and inputs people type: case-insensitive algorithm names, config objects, CLI counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import BertConfig, GPT2Config

import optiplug
from optiplug import AutoOptimizer, cli
from optiplug.errors import ModelConfigError, UnknownOptimizerError


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("AdamW", "adamw"),
        ("adam_w", "adamw"),
        ("Adam-W", "adamw"),
        ("Adam", "adam"),
        ("SGD", "sgd"),
        ("Lion", "lion"),
        ("MUON", "muon"),
    ],
)
def test_common_spellings_resolve(typed: str, canonical: str) -> None:
    assert optiplug.spec(typed).name == canonical


def test_spellings_create_and_list_canonical_names() -> None:
    import torch

    optimizer = optiplug.create("AdamW", [torch.nn.Parameter(torch.ones(2))])
    assert type(optimizer).__name__ == "AdamW" and optimizer.defaults["weight_decay"] == 0.01
    assert "adamw" in optiplug.optimizers() and "AdamW" not in optiplug.optimizers()
    assert optiplug.factory("SGD", lr=0.1).name == "sgd"


def test_schedules_resolve_case_insensitively() -> None:
    assert optiplug.schedule("Cosine", total_steps=10).to_dict()["name"] == "cosine"


def test_a_real_typo_still_suggests() -> None:
    with pytest.raises(UnknownOptimizerError, match="adamw"):
        optiplug.spec("adamz_w")


def _tiny_gpt2(**extra: object) -> GPT2Config:
    return GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, **extra)


def test_from_config_takes_config_objects() -> None:
    selection = AutoOptimizer.from_config(_tiny_gpt2(), task="causal-lm")
    assert selection.request.task == "text-generation"
    assert selection.request.model_type == "gpt2"
    assert selection.optimizer == "adamw"


def test_from_config_refuses_other_objects_clearly() -> None:
    with pytest.raises(ModelConfigError, match="to_dict"):
        AutoOptimizer.from_config(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("architecture", "task"),
    [
        ("GPT2LMHeadModel", "text-generation"),
        ("LlamaForCausalLM", "text-generation"),
        ("BertForSequenceClassification", "text-classification"),
        ("BertForQuestionAnswering", "question-answering"),
        ("BertForMaskedLM", "fill-mask"),
    ],
)
def test_from_pretrained_takes_the_task_from_architectures(
    tmp_path: Path, architecture: str, task: str
) -> None:
    config = BertConfig(num_hidden_layers=2, hidden_size=32, vocab_size=100).to_dict()
    config["architectures"] = [architecture]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert AutoOptimizer.from_pretrained(tmp_path).request.task == task
    given = AutoOptimizer.from_pretrained(tmp_path, task="qa").request.task
    assert given == "question-answering"  # an explicit task wins


@pytest.mark.parametrize(
    ("typed", "count"),
    [
        ("7e9", 7_000_000_000),
        ("7B", 7_000_000_000),
        ("125M", 125_000_000),
        ("1.3b", 1_300_000_000),
        ("350k", 350_000),
        ("7,000,000", 7_000_000),
        ("42", 42),
    ],
)
def test_cli_params_accept_what_people_type(
    typed: str, count: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["auto", "--params", typed, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["request"]["num_parameters"] == count


@pytest.mark.parametrize("typed", ["0", "-5", "abc", "1e-3"])
def test_cli_params_refuse_non_positive_in_one_line(
    typed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["auto", "--params", typed]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--params" in err


def test_cli_task_typo_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["auto", "--task", "text-clasification", "--params", "1e6"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'text-classification'" in err and len(err.strip().splitlines()) == 1


def test_cli_known_task_without_a_rule_falls_back_to_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["auto", "--task", "summarization", "--params", "1e6", "--json"]) == 0
    assert "no rule for task 'summarization'" in json.loads(capsys.readouterr().out)["reason"]

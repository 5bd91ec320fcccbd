"""``TrainingArguments(optim=...)`` for GaLore, APOLLO and GrokAdamW, against transformers' own path.

Each name is built twice on the same tiny Llama (its attention and MLP
projections are ``nn.Linear``, which is what GaLore and APOLLO project):
by :func:`~optiplug_integrations.transformers.from_training_args` and by
``Trainer.get_optimizer_cls_and_kwargs`` with the param groups the Trainer
passes. The groups must hold the same parameters (by identity) with the
same keys, and the first steps must leave bit-identical parameters: both
sides run the same library class on the same values in the same order, so
no tolerance is due.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("galore_torch")
pytest.importorskip("apollo_torch")
pytest.importorskip("grokadamw")

from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from transformers.trainer_optimizer import _setup_low_rank_optimizer

from optiplug.errors import HyperparameterError
from optiplug_integrations.transformers import from_training_args, target_parameter_names

TARGETS = ["self_attn", "mlp"]
LOW_RANK = "rank=4,update_proj_gap=2"  # a projection update at the second step


def tiny_llama(hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=hidden,
        intermediate_size=48,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def arguments(tmp_path: Path, **overrides: Any) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(tmp_path), learning_rate=1e-3, use_cpu=True, report_to="none", **overrides
    )


def transformers_optimizer(args: TrainingArguments, model: torch.nn.Module) -> Any:
    """What the Trainer builds for ``args`` (``Trainer.create_optimizer``'s groups and call)."""
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    groups = kwargs.pop("params", None)
    if groups is None:  # the Trainer's two weight-decay groups
        decay = Trainer.get_decay_parameter_names(None, model)  # type: ignore[arg-type]
        named = list(model.named_parameters())
        groups = [
            {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ]
    return cls(groups, **kwargs)


def ours(args: TrainingArguments, model: torch.nn.Module) -> Any:
    cls, kwargs = from_training_args(args)
    return cls()(model, **kwargs)


def steps(optimizer: Any, model: torch.nn.Module, count: int) -> None:
    tokens = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(count):
        optimizer.zero_grad()
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()


def same_groups(mine: Any, left: torch.nn.Module, theirs: Any, right: torch.nn.Module) -> None:
    """The groups hold the same parameters (by name in their models) with the same keys."""
    assert len(mine.param_groups) == len(theirs.param_groups)
    names = {id(p): n for model in (left, right) for n, p in model.named_parameters()}
    for a, b in zip(mine.param_groups, theirs.param_groups, strict=True):
        assert [names[id(p)] for p in a["params"]] == [names[id(p)] for p in b["params"]]
        keys = {k: v for k, v in a.items() if k not in ("params", "param_names")}
        assert keys == {k: v for k, v in b.items() if k != "params"}


CASES = [
    ("galore_adamw", LOW_RANK),
    ("galore_adamw", f"{LOW_RANK},proj_type=reverse_std,scale=0.5"),
    ("galore_adafactor", LOW_RANK),
    ("apollo_adamw", LOW_RANK),
    ("apollo_adamw", f"{LOW_RANK},proj=svd,scale_type=tensor"),
    ("grokadamw", "lamb=1.5,gamma=0.2"),
]


@pytest.mark.parametrize(("optim", "optim_args"), CASES)
def test_the_groups_and_first_steps_are_transformers_own(
    optim: str, optim_args: str, tmp_path: Path
) -> None:
    targets = None if optim == "grokadamw" else TARGETS
    args = arguments(
        tmp_path, optim=optim, optim_target_modules=targets, optim_args=optim_args, adam_beta2=0.99
    )
    left, right = tiny_llama(), tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # galore-torch's deprecation note, autocast on CPU
        mine, theirs = ours(args, left), transformers_optimizer(args, right)
        same_groups(mine, left, theirs, right)
        steps(mine, left, 3)
        steps(theirs, right, 3)
    for a, b in zip(left.parameters(), right.parameters(), strict=True):
        assert torch.equal(a, b)


def test_grokadamw_keeps_the_two_decay_groups_without_weight_decay(tmp_path: Path) -> None:
    """Its per-layer beta1 counts parameters within a group: one group would step differently."""
    args = arguments(tmp_path, optim="grokadamw")  # weight_decay 0.0, transformers' default
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer = ours(args, tiny_llama())
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 0.0]


def test_galore_adamw_8bit_is_transformers_own(tmp_path: Path) -> None:
    """Where CUDA is absent transformers' GaLoreAdamW8bit steps only with the no-op
    synchronisation the bridge gives its own; a 64x64 weight gets 8-bit state."""
    from optiplug_galore.optimizers import without_cuda_synchronize

    args = arguments(
        tmp_path, optim="galore_adamw_8bit", optim_target_modules=TARGETS, optim_args=LOW_RANK
    )
    left, right = tiny_llama(hidden=64), tiny_llama(hidden=64)
    mine, theirs = ours(args, left), transformers_optimizer(args, right)
    same_groups(mine, left, theirs, right)
    steps(mine, left, 3)
    with without_cuda_synchronize():
        steps(theirs, right, 3)
    assert all(
        torch.equal(a, b) for a, b in zip(left.parameters(), right.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    "targets",
    ["all-linear", r".*\.q_proj", ["q_proj", "down"], [r"model\.layers\.0\..*_proj"], ["mlp"]],
)
def test_target_modules_match_as_transformers_matches_them(targets: Any, tmp_path: Path) -> None:
    model = tiny_llama()
    args = arguments(tmp_path, optim="galore_adamw", optim_target_modules=targets)
    mapping = {"galore_adamw": torch.optim.AdamW}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, kwargs = _setup_low_rank_optimizer(args, model, "galore_adamw", mapping, {}, {})
    names = {id(p): n for n, p in model.named_parameters()}
    expected = {names[id(p)] for p in kwargs["params"][1]["params"]}
    given = tuple(targets) if isinstance(targets, list) else targets
    assert target_parameter_names(model, given) == expected


@pytest.mark.parametrize("optim", ["galore_adamw", "galore_adafactor", "apollo_adamw"])
def test_a_missing_target_modules_is_a_typed_error_naming_the_field(
    optim: str, tmp_path: Path
) -> None:
    with pytest.raises(HyperparameterError, match="is required") as raised:
        from_training_args(arguments(tmp_path, optim=optim))
    assert raised.value.field == "optim_target_modules"
    with pytest.raises(ValueError, match="optim_target_modules"):  # transformers' own refusal
        Trainer.get_optimizer_cls_and_kwargs(arguments(tmp_path, optim=optim), tiny_llama())


def test_target_modules_matching_nothing_is_refused_when_built(tmp_path: Path) -> None:
    args = arguments(tmp_path, optim="galore_adamw", optim_target_modules=["nothing_here"])
    cls, kwargs = from_training_args(args)
    with pytest.raises(HyperparameterError, match=r"matches no nn\.Linear") as raised:
        cls()(tiny_llama(), **kwargs)
    assert raised.value.field == "optim_target_modules"


@pytest.mark.parametrize(
    ("optim", "optim_args", "match"),
    [
        ("galore_adamw", "rank=four", "rank='four' is no int"),
        ("galore_adamw", "rnak=4", "unknown key 'rnak'"),
        ("apollo_adamw", "scale=big", "scale='big' is no float"),
        ("galore_adamw", "rank", "not key=value"),
        ("grokadamw", "lamda=2", "unknown key 'lamda'"),
    ],
)
def test_bad_optim_args_are_typed_errors(
    optim: str, optim_args: str, match: str, tmp_path: Path
) -> None:
    args = arguments(tmp_path, optim=optim, optim_target_modules=TARGETS, optim_args=optim_args)
    with pytest.raises(HyperparameterError, match=match) as raised:
        from_training_args(args)
    assert raised.value.field == "optim_args"


def test_a_bad_projection_value_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    args = arguments(
        tmp_path, optim="apollo_adamw", optim_target_modules=TARGETS, optim_args="proj=dct"
    )
    cls, kwargs = from_training_args(args)
    with pytest.raises(HyperparameterError, match="proj='dct'") as raised:
        cls()(tiny_llama(), **kwargs)
    assert raised.value.field == "proj"


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """32 random sequences of 16 tokens; the labels are the inputs (causal LM)."""

    def __init__(self) -> None:
        self.data = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[index], "labels": self.data[index]}


def _train(output_dir: Path, optim: str, resume: str | None = None) -> torch.nn.Module:
    args = TrainingArguments(
        output_dir=str(output_dir),
        optim=optim,
        optim_target_modules=TARGETS,
        optim_args=LOW_RANK,
        max_steps=4,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=2,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    model = tiny_llama()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_Tokens(),
        optimizer_cls_and_kwargs=from_training_args(args),
    )
    trainer.train(resume_from_checkpoint=resume)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["galore_adamw", "apollo_adamw"])
def test_a_trainer_resume_equals_an_uninterrupted_run(optim: str, tmp_path: Path) -> None:
    """The Trainer saves the optimizer's state dict and loads it back (the projectors as plain
    slots): 2 steps, a checkpoint, 2 more equal 4 uninterrupted steps bit for bit (CPU, fp32,
    the same data order and kernels; a projection update falls in each half)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = _train(tmp_path / "whole", optim)
        resumed = _train(tmp_path / "resumed", optim, str(tmp_path / "whole" / "checkpoint-2"))
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)

"""optiplug optimizers in a real Hugging Face ``Trainer`` (tiny random GPT-2, CPU)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import optiplug
import optiplug.testing
from optiplug.errors import HyperparameterError, UnknownOptimizerError
from optiplug_integrations.transformers import (
    TrainerOptimizer,
    from_training_args,
    optimizer_cls_and_kwargs,
)

STEPS = 20


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """64 random sequences of 16 tokens; the labels are the inputs (causal LM)."""

    def __init__(self) -> None:
        self.data = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[index], "labels": self.data[index]}


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,  # a separate lm_head, so its routing is tested too
    )
    return GPT2LMHeadModel(config)


def arguments(output_dir: Path, **overrides: Any) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(output_dir),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=10,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        **overrides,
    )


def trainer(output_dir: Path, **kwargs: Any) -> Trainer:
    cls_and_kwargs = optimizer_cls_and_kwargs("muon", lr=0.02, aux_lr=1e-3, weight_decay=0.01)
    return Trainer(
        model=tiny_gpt2(),
        args=arguments(output_dir),
        train_dataset=Tokens(),
        optimizer_cls_and_kwargs=cls_and_kwargs,
        **kwargs,
    )


def test_muon_routes_embeddings_and_head_to_adamw(tmp_path: Path) -> None:
    optimizer: Any = trainer(tmp_path).create_optimizer()
    routing = optimizer.routing()
    for name in ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"):
        assert routing[name].algorithm == "adamw", routing[name]
    assert routing["transformer.h.0.attn.c_attn.weight"].algorithm == "muon"
    # the Trainer's weight-decay rule: matrices decay, biases and norms do not
    assert routing["transformer.h.0.mlp.c_fc.weight"].weight_decay == 0.01
    assert routing["transformer.h.0.mlp.c_fc.bias"].weight_decay == 0.0


def test_resume_from_checkpoint_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = trainer(tmp_path / "whole")
    whole.train()
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-10"))
    assert resumed.state.global_step == whole.state.global_step == STEPS
    expected = dict(whole.model.named_parameters())
    # CPU, fp32, same data order and the same kernels: the runs are bit-identical
    for name, value in resumed.model.named_parameters():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)
    moved = tiny_gpt2().transformer.h[0].attn.c_attn.weight
    assert not torch.equal(moved, resumed.model.transformer.h[0].attn.c_attn.weight)


def test_training_arguments_translate(tmp_path: Path) -> None:
    args = arguments(tmp_path, optim="adamw_torch_fused", weight_decay=0.1, adam_beta2=0.95)
    cls, kwargs = from_training_args(args)
    assert isinstance(cls, TrainerOptimizer) and kwargs == {}
    assert cls.factory.name == "adamw" and cls.factory.impl == "fused"
    assert cls.factory.hparams == {
        "lr": 1e-3,
        "weight_decay": 0.1,
        "betas": (0.9, 0.95),
        "eps": 1e-8,
    }
    optimizer = cls()(tiny_gpt2(), **kwargs)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.param_groups[0]["fused"] is True

    sgd, _ = from_training_args(arguments(tmp_path, optim="sgd"), momentum=0.9)
    assert sgd.factory.hparams == {"lr": 1e-3, "weight_decay": 0.0, "momentum": 0.9}
    lion, _ = from_training_args(arguments(tmp_path, optim="lion_8bit"))  # bitsandbytes' own
    bnb_lion = optiplug.default_registry().spec("bitsandbytes:lion8bit")
    assert optiplug.default_registry().spec(lion.factory.name) == bnb_lion
    assert "eps" not in lion.factory.hparams
    without_bnb = optiplug.Registry(strict=False, disabled={"bitsandbytes"})
    with pytest.warns(UserWarning, match="32 bits"):  # the first-party fallback says so
        lion, _ = from_training_args(arguments(tmp_path, optim="lion_8bit"), registry=without_bnb)
    assert lion.factory.name == "lion" and "eps" not in lion.factory.hparams


def test_every_transformers_optim_name_is_mapped_served_or_explained(tmp_path: Path) -> None:
    from transformers.training_args import OptimizerNames

    from optiplug_integrations.transformers import HF_OPTIMIZERS

    names = {str(name.value) for name in OptimizerNames}
    assert names == set(HF_OPTIMIZERS)  # every name transformers knows, no more
    registry = optiplug.default_registry()
    for optim, entry in HF_OPTIMIZERS.items():
        if not entry.routes:
            assert entry.reason, optim
            continue
        installed = [route.name for route in entry.routes if registry.has(route.name)]
        assert installed, f"{optim}: none of {[r.name for r in entry.routes]} is installed"
    served = [optim for optim, entry in HF_OPTIMIZERS.items() if entry.routes]
    assert len(served) >= 30, len(served)  # of transformers' 41 names


@pytest.mark.parametrize(
    ("optim", "algorithm"),
    [
        ("adamw_torch_8bit", "torchao:adamw8bit"),
        ("adamw_torch_4bit", "torchao:adamw4bit"),
        ("schedule_free_adamw", "schedulefree:adamw_schedulefree"),
        ("adafactor", "pytorch_optimizer:adafactor"),
        ("ademamix", "bitsandbytes:ademamix"),
        ("adamw_bnb_8bit", "bitsandbytes:adamw8bit"),
        ("paged_lion_32bit", "bitsandbytes:pagedlion32bit"),
        ("rmsprop_bnb_8bit", "bitsandbytes:rmsprop8bit"),
        ("adagrad", "torch:adagrad"),
        ("rmsprop", "torch:rmsprop"),
    ],
)
def test_bridged_optim_names_build_the_bridged_optimizer(
    optim: str, algorithm: str, tmp_path: Path
) -> None:
    cls, kwargs = from_training_args(arguments(tmp_path, optim=optim))
    registry = optiplug.default_registry()
    spec = registry.spec(algorithm)
    assert registry.spec(cls.factory.name) == spec  # by the name that reaches it
    optimizer = cls()(tiny_gpt2(), **kwargs)
    assert optimizer.param_groups[0]["lr"] == 1e-3
    assert type(optimizer).__name__ == spec.origin.target.rpartition(":")[2]  # type: ignore[union-attr]


def test_unserved_or_uninstalled_optim_names_say_what_would_serve_them(tmp_path: Path) -> None:
    without_apollo = optiplug.Registry(strict=False, disabled={"apollo"})
    with pytest.raises(
        UnknownOptimizerError,
        match=r"'apollo_adamw_layerwise' is not supported.*install optiplug-apollo",
    ):
        from_training_args(
            arguments(tmp_path, optim="apollo_adamw_layerwise"), registry=without_apollo
        )
    with pytest.raises(UnknownOptimizerError, match="XLA"):
        from_training_args(arguments(tmp_path, optim="adamw_torch_xla"))
    # a registry without the bridges: the error names the distribution to install
    bare = optiplug.Registry(
        strict=False, disabled={"torchao", "pytorch_optimizer", "bitsandbytes"}
    )
    with pytest.raises(UnknownOptimizerError, match="install optiplug-torchao"):
        from_training_args(arguments(tmp_path, optim="adamw_torch_4bit"), registry=bare)
    # ...and one with a first-party fallback takes it, saying how it differs
    with pytest.warns(UserWarning, match="32 bits"):
        cls, _ = from_training_args(arguments(tmp_path, optim="adamw_8bit"), registry=bare)
    assert cls.factory.name == "adamw"


def test_a_selection_is_accepted_as_is() -> None:
    selection = optiplug.AutoOptimizer.for_model(tiny_gpt2())
    cls, kwargs = optimizer_cls_and_kwargs(selection)
    assert cls.factory is selection
    assert cls()(tiny_gpt2(), **kwargs).param_groups
    with pytest.raises(TypeError):
        optimizer_cls_and_kwargs(selection, lr=1.0)


def _served() -> list[str]:
    from optiplug_integrations.transformers import hf_optimizers

    return [optim for optim, entry in hf_optimizers().items() if entry.routes]


@pytest.mark.slow
@pytest.mark.parametrize("optim", _served())
def test_every_served_optim_name_trains_two_steps_in_the_trainer(
    optim: str, tmp_path: Path
) -> None:
    """``TrainingArguments(optim=NAME)``, routed to optiplug, trains 2 steps of the real Trainer.

    Table-driven from what the integration serves (a bridge's new names are
    covered when it is installed); a route with a caveat warns, as it should.
    A GaLore or APOLLO name projects the model's one ``nn.Linear`` (GPT-2's
    other layers are ``Conv1D``), its head, at rank 4; a route whose entry is
    limited here (GaLore's 8-bit AdamW needs CUDA) is skipped with its reason.
    """
    import math
    import warnings

    from optiplug_integrations.transformers import hf_optimizers

    registry = optiplug.default_registry()
    route = next(r for r in hf_optimizers()[optim].routes if registry.has(r.name))
    if optiplug.testing.limitation(route.name):
        pytest.skip(f"{route.name}: {optiplug.testing.limitation(route.name)}")
    low_rank = {"optim_target_modules": ["lm_head"], "optim_args": "rank=4,update_proj_gap=1"}
    args = arguments(tmp_path, optim=optim, **(low_rank if route.target_modules else {}))
    args.max_steps, args.save_strategy = 2, "no"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a caveat route's note (32-bit state...)
        cls_and_kwargs = from_training_args(args)
    model = tiny_gpt2()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(
        model=model, args=args, train_dataset=Tokens(), optimizer_cls_and_kwargs=cls_and_kwargs
    )
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss), optim
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), start[n])]
    # schedule-free RAdam leaves the parameters where they are in its first steps
    # (its documented silent SGD phase) but keeps state; LOMO keeps none but moves them
    stepped = trainer.optimizer.optimizer.state  # accelerate wraps the optimizer
    assert moved or stepped, f"{optim}: 2 steps neither moved a parameter nor kept state"


def test_the_docs_table_is_what_the_code_serves() -> None:
    """docs/integrations.md holds the table scripts/hf_optim_table.py generates, as installed."""
    import importlib.util

    script = Path(__file__).parents[1] / "scripts" / "hf_optim_table.py"
    spec = importlib.util.spec_from_file_location("hf_optim_table", script)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    page = generator.PAGE.read_text(encoding="utf-8")
    assert generator.documented(page) == generator.table(), "run scripts/hf_optim_table.py"


@pytest.mark.parametrize(("optim", "torch_eps"), [("adagrad", 1e-10), ("rmsprop", 1e-8)])
def test_adagrad_and_rmsprop_get_the_keywords_transformers_gives_them(
    optim: str, torch_eps: float, tmp_path: Path
) -> None:
    """transformers builds torch's class with the lr (and decay groups), never ``adam_epsilon``."""
    cls, kwargs = from_training_args(arguments(tmp_path, optim=optim, adam_epsilon=0.5))
    assert "eps" not in kwargs and "betas" not in kwargs
    optimizer = cls()(tiny_gpt2(), **kwargs)
    assert {group["eps"] for group in optimizer.param_groups} == {torch_eps}
    assert type(optimizer).__name__ == {"adagrad": "Adagrad", "rmsprop": "RMSprop"}[optim]


def test_adamw_anyprecision_steps_as_torch_adamw_with_the_keywords_transformers_gives(
    tmp_path: Path,
) -> None:
    """transformers builds AnyPrecisionAdamW(lr, betas, eps) over its decay groups.

    With its default float32 moments and no Kahan summation AnyPrecisionAdamW
    is AdamW's published formula (p *= 1 - lr*wd; m, v moving averages;
    p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)), which torch.optim.AdamW
    computes; optiplug's adamw runs torch's kernel (the same foreach/fused one
    here), so 3 steps are bit-equal.
    """
    args = arguments(
        tmp_path, optim="adamw_anyprecision", weight_decay=0.1, adam_beta2=0.95, adam_epsilon=1e-7
    )
    cls, kwargs = from_training_args(args)
    assert cls.factory.name == "adamw" and kwargs == {}
    assert cls.factory.hparams == {
        "lr": 1e-3,
        "weight_decay": 0.1,
        "betas": (0.9, 0.95),
        "eps": 1e-7,
    }
    model, reference_model = tiny_gpt2().eval(), tiny_gpt2().eval()  # eval: no dropout draws
    optimizer = cls()(model)
    by_name = dict(reference_model.named_parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [
        {"params": [by_name[names[id(p)]] for p in g["params"]], "weight_decay": g["weight_decay"]}
        for g in optimizer.param_groups
    ]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]  # the Trainer's decay rule
    kernel = {key: optimizer.param_groups[0][key] for key in ("foreach", "fused")}  # as chosen
    reference = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-7, **kernel)
    for step in range(3):
        for net, opt in ((model, optimizer), (reference_model, reference)):
            opt.zero_grad()
            batch = Tokens().data[step * 8 : step * 8 + 8]
            net(input_ids=batch, labels=batch).loss.backward()
            opt.step()
    for name, value in model.named_parameters():
        torch.testing.assert_close(value, by_name[name], rtol=0, atol=0, msg=name)


def test_adamw_anyprecision_bf16_moments_are_bf16_state_precision(tmp_path: Path) -> None:
    both = "momentum_dtype=bfloat16, variance_dtype=bfloat16"
    args = arguments(tmp_path, optim="adamw_anyprecision", optim_args=both)
    with pytest.warns(UserWarning, match="rounds them back stochastically"):
        cls, kwargs = from_training_args(args)
    assert cls.factory.hparams["state_precision"] == "bf16"
    optimizer = cls()(tiny_gpt2(), **kwargs)
    assert {group["state_precision"] for group in optimizer.param_groups} == {"bf16"}
    # transformers' defaults, given explicitly, are AdamW exactly: no caveat
    fp32 = "use_kahan_summation=False,momentum_dtype=float32,compensation_buffer_dtype=bfloat16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls, _ = from_training_args(
            arguments(tmp_path, optim="adamw_anyprecision", optim_args=fp32)
        )
    assert "state_precision" not in cls.factory.hparams


@pytest.mark.parametrize(
    ("optim", "optim_args", "match"),
    [
        ("adamw_anyprecision", "use_kahan_summation=True", "Kahan"),
        ("adamw_anyprecision", "momentum_dtype=bfloat16", "one precision"),
        ("adamw_anyprecision", "variance_dtype=float64", "one precision"),
        ("adamw_anyprecision", "momentum_dtype=float99", "no torch dtype"),
        ("adamw_anyprecision", "use_kahan_summation=maybe", "not a bool"),
        ("adamw_anyprecision", "kahan=True", "unknown key 'kahan'"),
        ("adamw_anyprecision", "momentum_dtype", "not key=value"),
        ("adamw_torch", "foo=1", "not read by optiplug"),
    ],
)
def test_optim_args_optiplug_cannot_compute_are_refused(
    optim: str, optim_args: str, match: str, tmp_path: Path
) -> None:
    with pytest.raises(HyperparameterError, match=match) as raised:
        from_training_args(arguments(tmp_path, optim=optim, optim_args=optim_args))
    assert raised.value.field == "optim_args"


def test_every_low_rank_and_layer_wise_name_is_served_and_only_devices_are_not() -> None:
    from optiplug_integrations.transformers import HF_OPTIMIZERS

    unserved = sorted(optim for optim, entry in HF_OPTIMIZERS.items() if not entry.routes)
    assert unserved == ["adamw_torch_npu_fused", "adamw_torch_xla"], unserved
    for optim in ("apollo_adamw_layerwise", "galore_adafactor_layerwise", "grokadamw"):
        (first, *_) = HF_OPTIMIZERS[optim].routes
        assert first.layerwise == optim.endswith("_layerwise"), first


def test_a_layer_wise_name_whose_base_is_not_installed_says_so() -> None:
    from optiplug_integrations.transformers import hf_optimizers

    without_apollo = optiplug.Registry(strict=False, disabled={"apollo"})
    entry = hf_optimizers(without_apollo)["apollo_adamw_layerwise"]
    assert not entry.routes and entry.reason.startswith("its base apollo_adamw is not served")
    assert entry.served_by == ("optiplug-apollo",)


def test_galore_adamw_warns_that_it_does_not_project(tmp_path: Path) -> None:
    """Without the galore plugin, pytorch_optimizer's GaLore serves it: no rank, no projection."""
    without_galore = optiplug.Registry(strict=False, disabled={"galore"})
    with pytest.warns(UserWarning, match="no low-rank projection"):
        cls, kwargs = from_training_args(
            arguments(tmp_path, optim="galore_adamw"), registry=without_galore
        )
    optimizer = cls()(tiny_gpt2(), **kwargs)
    assert not any("rank" in group for group in optimizer.param_groups)

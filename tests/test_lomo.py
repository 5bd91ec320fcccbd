"""LOMO and AdaLOMO through the pytorch-optimizer bridge: they update inside the backward.

Both take the model (not parameters) and are driven by their own
``fused_backward(loss, lr)``, which runs the backward and updates each
parameter from a hook as its gradient arrives. Checked on CPU: built by
``optiplug.create`` from a module, they step bit-equal to the library's own
class driven the same way; a plain ``backward()`` then ``step()`` gives the
same parameters; copies hook their own parameters; checkpoints resume
bit-equal; and the Hugging Face ``Trainer`` trains with ``optim="lomo"`` and
``"adalomo"`` (which hand the loss to ``fused_backward``).
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytorch_optimizer")

import pytorch_optimizer
import torch

import optiplug
from optiplug import checkpoint, testing
from optiplug.base import training_step

NAMES = ("lomo", "adalomo")
LIBRARY = {"lomo": pytorch_optimizer.LOMO, "adalomo": pytorch_optimizer.AdaLOMO}
LR = 0.05


def small_model(seed: int = 0) -> torch.nn.Module:
    """A 4-8-1 tanh network (matrices and vectors: AdaLOMO factors one, not the other)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 4, generator=generator), torch.randn(16, 1, generator=generator)


def loss_of(model: torch.nn.Module) -> torch.Tensor:
    x, y = _data()
    return torch.nn.functional.mse_loss(model(x), y)


def fused_steps(optimizer: Any, model: torch.nn.Module, count: int) -> list[float]:
    """``count`` updates by ``fused_backward(loss, lr)``; the loss before each."""
    losses = []
    for _ in range(count):
        loss = loss_of(model)
        losses.append(float(loss.detach()))
        optimizer.fused_backward(loss, LR)
    return losses


def assert_same_parameters(left: torch.nn.Module, right: torch.nn.Module) -> None:
    for (name, a), (_, b) in zip(left.named_parameters(), right.named_parameters(), strict=True):
        assert torch.equal(a.detach(), b.detach()), name


# ------------------------------------------------------------------ building and stepping
@pytest.mark.parametrize("name", NAMES)
def test_create_from_the_module_steps_bit_equal_to_the_library_class(name: str) -> None:
    """The module is passed once; 3 fused steps cut the loss, as the library's own class does."""
    model, twin = small_model(), small_model()
    optimizer = optiplug.create(name, model, lr=LR)
    library = LIBRARY[name](twin, lr=LR)
    assert isinstance(optimizer, LIBRARY[name])
    held = dict(optimizer.model.named_parameters())
    assert all(held[n] is p for n, p in model.named_parameters())  # the model's own tensors

    losses = fused_steps(optimizer, model, 3)
    expected = fused_steps(library, twin, 3)
    assert losses == expected
    assert losses[2] < losses[1] < losses[0]
    assert_same_parameters(model, twin)
    assert all(p.grad is None for p in model.parameters())  # consumed inside the backward


@pytest.mark.parametrize("name", NAMES)
def test_named_parameters_with_model_keyword_build_the_same_optimizer(name: str) -> None:
    model, twin = small_model(), small_model()
    optimizer = optiplug.create(
        f"pytorch_optimizer:{name}", model.named_parameters(), model=model, lr=LR
    )
    fused_steps(optimizer, model, 3)
    fused_steps(LIBRARY[name](twin, lr=LR), twin, 3)
    assert_same_parameters(model, twin)


@pytest.mark.parametrize("name", NAMES)
def test_backward_then_step_equals_fused_backward(name: str) -> None:
    """A plain backward keeps the gradients (AdaLOMO's hooks do not run early); step() updates."""
    model, twin = small_model(), small_model()
    fused = optiplug.create(name, model, lr=LR)
    plain = optiplug.create(name, twin, lr=LR)
    fused_steps(fused, model, 3)
    for _ in range(3):
        before = [p.detach().clone() for p in twin.parameters()]
        plain.zero_grad()
        loss_of(twin).backward()
        assert all(torch.equal(p, q) for p, q in zip(twin.parameters(), before, strict=True))
        assert all(p.grad is not None for p in twin.parameters())
        plain.step()
    assert_same_parameters(model, twin)  # AdaLOMO's loss scale is a power of two: exact


@pytest.mark.parametrize("name", NAMES)
def test_step_clips_by_the_gradient_norm_as_grad_norm_does(name: str) -> None:
    """With clip_grad_norm, step() clips as grad_norm() then fused_backward() do.

    Equal to rounding: the class sums the squared norms in the order the
    backward reaches the parameters, step() in the parameters' order.
    """
    model, twin = small_model(), small_model()
    fused = optiplug.create(name, model, lr=LR, clip_grad_norm=0.1)
    plain = optiplug.create(name, twin, lr=LR, clip_grad_norm=0.1)
    for _ in range(3):
        loss = loss_of(model)
        fused.grad_norm(loss)
        fused.fused_backward(loss, LR)
        plain.zero_grad()
        loss_of(twin).backward()
        plain.step()
    assert float(fused.clip_coef) < 1.0  # it did clip
    for (_, a), (_, b) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_learning_rate_lives_in_the_param_group(name: str) -> None:
    """fused_backward(loss, lr) writes the group's lr; fused_backward(loss) uses it."""
    model, twin = small_model(), small_model()
    optimizer = optiplug.create(name, model, lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: LR)  # lr 1.0 * 0.05
    assert optimizer.param_groups[0]["lr"] == LR
    for _ in range(2):
        optimizer.fused_backward(loss_of(model))
        optimizer.step()  # nothing left to apply: the update ran in the backward
        scheduler.step()
    library = LIBRARY[name](twin, lr=1.0)
    fused_steps(library, twin, 2)
    assert_same_parameters(model, twin)
    optimizer.fused_backward(loss_of(model), 0.01)
    assert optimizer.param_groups[0]["lr"] == 0.01


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_hooks_its_own_parameters(name: str, how: str) -> None:
    """A copy steps its own parameters like the original, and leaves the original's alone."""
    model = small_model()
    optimizer = optiplug.create(name, model, lr=LR)
    fused_steps(optimizer, model, 1)
    duplicate: Any = (
        copy.deepcopy(optimizer) if how == "deepcopy" else pickle.loads(pickle.dumps(optimizer))
    )
    copied = duplicate.model  # the copy's parameters, by the same names
    assert not any(p is q for p, q in zip(copied.parameters(), model.parameters(), strict=True))
    x, y = _data()

    def loss(named: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = torch.tanh(x @ named["0.weight"].T + named["0.bias"])
        return torch.nn.functional.mse_loss(hidden @ named["2.weight"].T + named["2.bias"], y)

    mine = dict(model.named_parameters())
    theirs = dict(copied.named_parameters())
    before = {n: p.detach().clone() for n, p in mine.items()}
    duplicate.fused_backward(loss(theirs), LR)
    assert all(torch.equal(mine[n].detach(), before[n]) for n in mine)  # untouched
    optimizer.fused_backward(loss(mine), LR)
    assert all(torch.equal(mine[n].detach(), theirs[n].detach()) for n in mine)


def test_param_groups_are_refused_with_the_reason() -> None:
    model = small_model()
    groups = [{"params": list(model.parameters()), "weight_decay": 0.1}]
    with pytest.raises(TypeError, match="own param groups"):
        optiplug.create("adalomo", groups)


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_resumes_bit_equal(name: str, tmp_path: Path) -> None:
    """Save after 2 fused steps, load into a fresh optimizer: 2 more steps match, bit for bit.

    LOMO keeps no state (its lr is in the group); AdaLOMO's second-moment
    factors are per-parameter slots and its step count a running group key.
    """
    model = small_model()
    original = optiplug.create(name, model, lr=LR)
    fused_steps(original, model, 2)
    checkpoint.save(tmp_path / "ckpt", original)
    twin = small_model()
    twin.load_state_dict(model.state_dict())
    fused_steps(original, model, 2)  # the uninterrupted run

    resumed = optiplug.create(name, twin, lr=1.0)  # the checkpoint's lr wins
    checkpoint.load(tmp_path / "ckpt", resumed)
    assert resumed.param_groups[0]["lr"] == LR
    fused_steps(resumed, twin, 2)
    assert_same_parameters(model, twin)
    saved, loaded = original.state_dict(), resumed.state_dict()
    assert set(saved) == {"state", "param_groups"}  # no top-level keys of the class's own
    if name == "lomo":
        assert saved["state"] == {}
        return
    assert saved["param_groups"][0]["attr:num_steps"] == 4
    slots = {slot for entry in saved["state"].values() for slot in entry}
    assert slots == {"exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col"}
    assert testing.same_state_value(saved["state"], loaded["state"])
    assert optiplug.memory(resumed).total == sum(
        t.numel() * t.element_size() for entry in loaded["state"].values() for t in entry.values()
    )


def test_a_changed_model_is_refused_typed(tmp_path: Path) -> None:
    """AdaLOMO's factors are shaped by the parameters: another model's are a StateDictError."""
    model = small_model()
    original = optiplug.create("adalomo", model, lr=LR)
    fused_steps(original, model, 1)
    checkpoint.save(tmp_path / "ckpt", original)
    other = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    fresh = optiplug.create("adalomo", other, lr=LR)
    with pytest.raises(optiplug.errors.StateDictError):
        checkpoint.load(tmp_path / "ckpt", fresh)


@pytest.mark.parametrize("name", NAMES)
def test_training_step_runs_it(name: str) -> None:
    """optiplug's own loop helper (zero_grad, backward, step) trains it."""
    model = small_model()
    optimizer = optiplug.create(name, model, lr=LR)
    losses = [float(training_step(optimizer, lambda: loss_of(model)).detach()) for _ in range(3)]
    assert losses[2] < losses[0] and all(map(math.isfinite, losses))


# ------------------------------------------------------------------ Hugging Face Trainer
def _count_fused_calls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the lr of every ``fused_backward`` call of the bridge's wrappers."""
    from optiplug_pytorch_optimizer.optimizers import FusedBackwardOptimizer

    calls: list[float] = []
    original: Callable[..., None] = FusedBackwardOptimizer.fused_backward

    def counted(self: Any, loss: torch.Tensor, lr: Any = None) -> None:
        calls.append(lr)
        original(self, loss, lr)

    monkeypatch.setattr(FusedBackwardOptimizer, "fused_backward", counted)
    return calls


@pytest.mark.parametrize("optim", NAMES)
def test_hf_trainer_trains_with_the_optim_name(
    optim: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TrainingArguments(optim=...)`` routed to optiplug: 2 steps, each a fused backward."""
    pytest.importorskip("transformers")
    from test_integration_transformers import Tokens, arguments, tiny_gpt2
    from transformers import Trainer

    from optiplug_integrations.transformers import from_training_args

    calls = _count_fused_calls(monkeypatch)
    args = arguments(tmp_path, optim=optim)
    args.max_steps, args.save_strategy = 2, "no"
    model = tiny_gpt2()
    start = model.lm_head.weight.detach().clone()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(),
        optimizer_cls_and_kwargs=from_training_args(args),
    )
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    assert len(calls) == 2 and all(lr is not None and lr > 0 for lr in calls)
    assert isinstance(trainer.optimizer.optimizer, LIBRARY[optim])  # accelerate wraps it
    assert not torch.equal(start, model.lm_head.weight)


@pytest.mark.parametrize("name", NAMES)
def test_hf_trainer_with_another_optim_steps_it(name: str, tmp_path: Path) -> None:
    """With the default ``optim`` the Trainer calls a plain backward, then step() updates."""
    pytest.importorskip("transformers")
    from test_integration_transformers import Tokens, arguments, tiny_gpt2
    from transformers import Trainer

    from optiplug_integrations.transformers import optimizer_cls_and_kwargs

    args = arguments(tmp_path)
    args.max_steps, args.save_strategy = 2, "no"
    model = tiny_gpt2()
    start = model.lm_head.weight.detach().clone()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(),
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs(name, lr=1e-3),
    )
    assert math.isfinite(trainer.train().training_loss)
    assert not torch.equal(start, model.lm_head.weight)


@pytest.mark.parametrize("optim", NAMES)
def test_hf_trainer_resume_is_bit_equal(optim: str, tmp_path: Path) -> None:
    """A Trainer resumed from its step-10 checkpoint ends bit-equal to the uninterrupted run."""
    pytest.importorskip("transformers")
    from test_integration_transformers import STEPS, Tokens, arguments, tiny_gpt2
    from transformers import Trainer

    from optiplug_integrations.transformers import from_training_args

    def trainer(output_dir: Path) -> Trainer:
        args = arguments(output_dir, optim=optim)
        return Trainer(
            model=tiny_gpt2(),
            args=args,
            train_dataset=Tokens(),
            optimizer_cls_and_kwargs=from_training_args(args),
        )

    whole = trainer(tmp_path / "whole")
    whole.train()
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-10"))
    assert resumed.state.global_step == whole.state.global_step == STEPS
    expected = dict(whole.model.named_parameters())
    for key, value in resumed.model.named_parameters():  # CPU, fp32, same data and kernels
        assert torch.equal(value, expected[key]), key
    assert not torch.equal(tiny_gpt2().lm_head.weight, resumed.model.lm_head.weight)


def test_adalomo_refuses_parameters_it_cannot_factor() -> None:
    """A conv kernel failed at AdaLOMO's first update upstream: refused when built, named."""
    conv = torch.nn.Conv2d(2, 3, 3)
    with pytest.raises(
        optiplug.errors.HyperparameterError, match=r"weight of shape \(3, 2, 3, 3\)"
    ):
        optiplug.create("adalomo", conv, lr=LR)
    assert not conv.weight._backward_hooks  # refused before the class hooked anything
    optiplug.create("lomo", conv, lr=LR)  # LOMO's update is elementwise: any shape


def test_hf_weight_decay_cannot_be_split_for_adalomo(tmp_path: Path) -> None:
    """The Trainer's no-decay group cannot be made: AdaLOMO has one decay for every parameter."""
    pytest.importorskip("transformers")
    from test_integration_transformers import arguments, tiny_gpt2

    from optiplug_integrations.transformers import from_training_args

    cls, kwargs = from_training_args(arguments(tmp_path, optim="adalomo", weight_decay=0.1))
    with pytest.raises(TypeError, match="own param groups"):
        cls()(tiny_gpt2(), **kwargs)
    cls, kwargs = from_training_args(arguments(tmp_path, optim="adalomo"))  # weight_decay=0
    assert cls()(tiny_gpt2(), **kwargs).param_groups[0]["weight_decay"] == 0.0

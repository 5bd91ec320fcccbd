"""Hugging Face's layer-wise ``optim`` names: one optimizer per parameter, saved and resumed whole.

Every comparison here is bit-equality (``torch.equal``): the same per-parameter
kernels run on the same CPU in float32 on both sides, and a per-parameter
optimizer's step depends on its own parameter only, so the order the hooks
fire in changes nothing.
"""

from __future__ import annotations

import copy as copy_module
import gc
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from test_integration_transformers import Tokens, arguments, tiny_gpt2
from transformers import Trainer, get_scheduler

import optiplug
from optiplug.errors import HyperparameterError, StateDictError, UnknownOptimizerError
from optiplug_integrations.layerwise import LayerwiseOptimizer, layerwise
from optiplug_integrations.transformers import (
    TrainerOptimizer,
    from_training_args,
    hf_optimizers,
)

GALORE = "galore_adamw_layerwise"
PYTORCH_GALORE = optiplug.Registry(strict=False, disabled={"galore"})
"""galore_adamw's fallback route, pytorch_optimizer's GaLore (no projection): most tests
here are about the layer-wise mechanics, which its plain groups show without target modules."""
# transformers needs optim_target_modules for GaLore: nn.Linear ones (GPT-2's blocks are Conv1D)
TARGETS = ["lm_head"]


def _backward(model: torch.nn.Module, step: int) -> None:
    """One batch's forward and backward (the layer-wise hooks step every parameter)."""
    batch = Tokens().data[step * 8 : step * 8 + 8]
    model(input_ids=batch, labels=batch).loss.backward()


def _build(optim: str, tmp_path: Path, model: torch.nn.Module, **overrides: Any) -> Any:
    args = arguments(tmp_path, optim=optim, optim_target_modules=TARGETS, **overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the route's caveats, tested below
        cls, kwargs = from_training_args(args, registry=PYTORCH_GALORE)
    return cls()(model, **kwargs)


def _assert_same_parameters(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    expected = dict(reference.named_parameters())
    for name, value in model.named_parameters():
        assert torch.equal(value, expected[name]), name


def test_layerwise_names_are_served_by_their_base_names_routes() -> None:
    table = hf_optimizers(PYTORCH_GALORE)
    galore = table[GALORE]
    assert galore.routes and all(route.layerwise for route in galore.routes)
    base = table["galore_adamw"].routes
    assert [r.name for r in galore.routes] == [r.name for r in base]
    assert not any(route.layerwise for route in base)
    assert galore.served_by == table["galore_adamw"].served_by
    for optim, entry in table.items():  # an unserved base says so in its layer-wise name
        base_name = optim.removesuffix("_layerwise")
        if optim.endswith("_layerwise") and not entry.routes:
            assert entry.reason.startswith(f"its base {base_name} is not served: "), optim
            assert table[base_name].reason in entry.reason, optim


def test_a_plugin_declaring_a_base_name_serves_its_layerwise_name_too() -> None:
    """A new plugin declaring galore_adamw_8bit (unserved here) serves its layer-wise name."""
    import types

    module = types.ModuleType("declares_galore")

    @optiplug.hookimpl
    def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
        hf = ("galore_adamw_8bit", optiplug.HFName("apollo_adamw_layerwise"))
        return [optiplug.OptimizerSpec(name="lowrank", factory=torch.optim.AdamW, hf_names=hf)]

    module.optiplug_optimizers = optiplug_optimizers  # type: ignore[attr-defined]
    registry = optiplug.Registry(autoload=False)
    registry.register(module, "declares")
    table = hf_optimizers(registry)
    assert [(r.name, r.layerwise) for r in table["galore_adamw_8bit"].routes] == [
        ("lowrank", False)
    ]
    for optim in ("galore_adamw_8bit_layerwise", "apollo_adamw_layerwise"):  # declared, too
        assert [(r.name, r.layerwise) for r in table[optim].routes] == [("lowrank", True)]
    assert not table["galore_adafactor_layerwise"].routes


def test_a_registry_without_the_base_plugin_names_the_distribution(tmp_path: Path) -> None:
    bare = optiplug.Registry(strict=False, disabled={"pytorch_optimizer", "galore"})
    assert not hf_optimizers(bare)[GALORE].routes
    with pytest.raises(UnknownOptimizerError, match="optiplug-pytorch-optimizer"):
        from_training_args(arguments(tmp_path, optim=GALORE), registry=bare)


def test_the_trainer_optimizer_is_one_optimizer_per_trainable_parameter(tmp_path: Path) -> None:
    model = tiny_gpt2()
    model.transformer.wpe.weight.requires_grad_(False)  # a frozen parameter gets none
    optimizer = _build(GALORE, tmp_path, model)
    assert isinstance(optimizer, LayerwiseOptimizer) and optimizer.attached
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert list(optimizer.optimizer_dict) == trainable
    assert len(optimizer.param_groups) == len(trainable)
    for group, inner in zip(optimizer.param_groups, optimizer.optimizers, strict=True):
        assert group is inner.param_groups[0]  # the same dicts: a scheduler reaches them
        assert type(inner).__name__ == "GaLore"
    # any algorithm, layer-wise in the Trainer
    adamw = TrainerOptimizer(optiplug.factory("adamw", lr=1e-3), layerwise=True)()(tiny_gpt2())
    assert isinstance(adamw, LayerwiseOptimizer)
    assert {type(inner).__name__ for inner in adamw.optimizers} == {"AdamW"}


def test_galore_layerwise_steps_bit_equal_to_transformers_own_layerwise_path(
    tmp_path: Path,
) -> None:
    """transformers' own layer-wise builder, given pytorch_optimizer's GaLore (the route's class).

    ``_setup_low_rank_optimizer`` is what transformers runs for its
    ``*_layerwise`` names: one ``cls([{"params": [p]}], **kwargs)`` per
    parameter, stepped and zeroed in a post-accumulate-grad hook. Given no
    GaLore keywords for the target groups (the route passes no rank), both
    sides step every parameter as pytorch_optimizer's GaLore with the same
    lr, betas, eps and no weight decay.
    """
    trainer_optimizer = pytest.importorskip("transformers.trainer_optimizer")
    setup = getattr(trainer_optimizer, "_setup_low_rank_optimizer", None)
    if setup is None:
        pytest.skip("this transformers has no _setup_low_rank_optimizer")
    from pytorch_optimizer import GaLore

    model, reference = tiny_gpt2().eval(), tiny_gpt2().eval()  # eval: no dropout draws
    optimizer = _build(GALORE, tmp_path, model)
    args = arguments(tmp_path, optim=GALORE, optim_target_modules=TARGETS)
    kwargs = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    _, built = setup(args, reference, GALORE, {GALORE: GaLore}, {}, dict(kwargs))
    theirs = built["optimizer_dict"]
    assert len(theirs) == len(optimizer.optimizer_dict)
    mine = optimizer.optimizers[0].param_groups[0]
    assert {key: mine[key] for key in kwargs} == kwargs
    for step in range(3):
        _backward(model, step)
        _backward(reference, step)
    _assert_same_parameters(model, reference)
    assert not torch.equal(model.lm_head.weight, tiny_gpt2().lm_head.weight)


def test_galore_bridge_layerwise_steps_bit_equal_to_transformers_with_galore_torch(
    tmp_path: Path,
) -> None:
    """With the galore bridge: transformers' own layer-wise builder given galore_torch's class.

    The faithful route: ``optim_target_modules``' weights get an optimizer
    each whose group carries the projection keys, the rest plain groups, and
    the constructor only ``lr`` (as transformers builds it); rank 4 and a
    projection update every 2 steps, so step 3 re-projects.
    """
    from galore_torch import GaLoreAdamW
    from transformers.trainer_optimizer import _setup_low_rank_optimizer

    model, reference = tiny_gpt2().eval(), tiny_gpt2().eval()
    projection = "rank=4,update_proj_gap=2,scale=0.25,proj_type=std"
    args = arguments(tmp_path, optim=GALORE, optim_target_modules=TARGETS, optim_args=projection)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # clipping does not apply: said below
        cls, kwargs = from_training_args(args)
    optimizer = cls()(model, **kwargs)
    assert isinstance(optimizer, LayerwiseOptimizer)
    assert {type(inner).__name__ for inner in optimizer.optimizers} == {"GaLoreAdamW"}
    group = {"rank": 4, "update_proj_gap": 2, "scale": 0.25, "proj_type": "std"}
    _setup_low_rank_optimizer(args, reference, GALORE, {GALORE: GaLoreAdamW}, group, {"lr": 1e-3})
    for step in range(3):
        _backward(model, step)
        _backward(reference, step)
    _assert_same_parameters(model, reference)
    projected = [g for g in optimizer.param_groups if "rank" in g]
    assert len(projected) == 1 and projected[0]["rank"] == 4  # lm_head's weight alone


def test_layerwise_steps_bit_equal_to_its_optimizers_stepped_by_hand(tmp_path: Path) -> None:
    """The route's per-parameter optiplug optimizers, stepped by hand after each backward."""
    model, reference = tiny_gpt2().eval(), tiny_gpt2().eval()
    optimizer = _build(GALORE, tmp_path, model, weight_decay=0.1)  # the Trainer's decay rule
    by_hand = _build(GALORE, tmp_path, reference, weight_decay=0.1)
    by_hand.detach()  # the hooks off: these step only when told
    decays = [g["weight_decay"] for g in by_hand.param_groups]
    assert 0.1 in decays and 0.0 in decays
    for step in range(3):
        _backward(model, step)
        _backward(reference, step)
        for inner in by_hand.optimizers:
            inner.step()
            inner.zero_grad()
    _assert_same_parameters(model, reference)
    assert optimizer.attached


def test_any_algorithm_steps_layerwise_as_transformers_steps_torch_adamw() -> None:
    """optiplug's adamw, layer-wise, against transformers' builder given torch.optim.AdamW."""
    from transformers.trainer_optimizer import _setup_low_rank_optimizer

    model, reference = tiny_gpt2().eval(), tiny_gpt2().eval()
    optimizer = layerwise(
        lambda groups: optiplug.create("adamw", groups, lr=1e-3, weight_decay=0.01, impl="foreach"),
        model.named_parameters(),
    )
    kernels = {(g["foreach"], g["fused"]) for g in optimizer.param_groups}
    assert len(kernels) == 1  # one kernel chosen for every parameter: give torch the same
    foreach, fused = kernels.pop()
    name = "galore_adamw_layerwise"
    args = arguments(Path("unused"), optim=name, optim_target_modules=TARGETS)
    kwargs = {"lr": 1e-3, "weight_decay": 0.01, "foreach": foreach, "fused": fused}
    _setup_low_rank_optimizer(args, reference, name, {name: torch.optim.AdamW}, {}, kwargs)
    for step in range(3):
        _backward(model, step)
        _backward(reference, step)
    _assert_same_parameters(model, reference)


def test_a_scheduler_made_on_it_sets_every_parameters_lr(tmp_path: Path) -> None:
    """transformers' linear schedule with warm-up: lr = base * step/w, then base * (T-step)/(T-w)."""
    model = tiny_gpt2().eval()
    optimizer = _build(GALORE, tmp_path, model)
    warmup, total, base = 2, 6, 1e-3
    scheduler = get_scheduler(
        "linear", optimizer, num_warmup_steps=warmup, num_training_steps=total
    )
    for step in range(total):
        # LambdaLR multiplies the base lr by the factor, as written here: bit-equal
        factor = step / warmup if step < warmup else (total - step) / (total - warmup)
        for inner in optimizer.optimizers:
            assert inner.param_groups[0]["lr"] == base * factor, step
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        _backward(model, step)
        moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
        assert len(moved) == (len(before) if factor else 0), step  # each stepped with that lr
        optimizer.step()
        scheduler.step()


def test_save_then_load_restores_every_per_parameter_state(tmp_path: Path) -> None:
    model, copy = tiny_gpt2().eval(), tiny_gpt2().eval()
    optimizer = _build(GALORE, tmp_path, model)
    for step in range(2):
        _backward(model, step)
    path = tmp_path / "optimizer.pt"
    torch.save(optimizer.state_dict(), path)
    saved = torch.load(path, weights_only=True)  # what the Trainer's resume reads
    assert optiplug.validate_state_dict(optimizer, saved) == []
    with pytest.raises(TypeError, match="state_dict"):
        copy_module.deepcopy(optimizer)  # a copy would have no hooks: refused
    assert len(saved["state"]) == len(saved["param_groups"]) == len(optimizer.optimizers)
    copy.load_state_dict(model.state_dict())
    fresh = _build(GALORE, tmp_path, copy)
    fresh.load_state_dict(saved)
    for group, inner in zip(fresh.param_groups, fresh.optimizers, strict=True):
        assert group is inner.param_groups[0]  # loading replaced the dicts: shared again
    for mine, theirs in zip(fresh.optimizers, optimizer.optimizers, strict=True):
        (param,) = mine.param_groups[0]["params"]
        (original,) = theirs.param_groups[0]["params"]
        for slot, value in theirs.state[original].items():
            assert torch.equal(mine.state[param][slot], value), slot
    for step in range(2, 4):
        _backward(model, step)
        _backward(copy, step)
    _assert_same_parameters(copy, model)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=3), min_size=1, max_size=5))
def test_the_state_dict_numbers_every_parameter_and_round_trips(shapes: list[list[int]]) -> None:
    """Any parameter shapes: ids 0..n-1, one group each; loaded, a copy steps bit-equal."""
    generator = torch.Generator().manual_seed(len(shapes))
    values = [torch.randn(shape, generator=generator) for shape in shapes]
    weights = [torch.randn(shape, generator=generator) for shape in shapes]

    def made() -> tuple[list[torch.nn.Parameter], LayerwiseOptimizer]:
        params = [torch.nn.Parameter(value.clone()) for value in values]
        named = [(f"p{index}", param) for index, param in enumerate(params)]
        create = lambda groups: optiplug.create("adamw", groups, lr=1e-2)  # noqa: E731
        return params, layerwise(create, named)

    def backward(params: list[torch.nn.Parameter]) -> None:
        pairs = zip(params, weights, strict=True)
        torch.stack([(p * w).sin().sum() for p, w in pairs]).sum().backward()

    params, optimizer = made()
    backward(params)
    saved = optimizer.state_dict()
    assert sorted(saved["state"]) == list(range(len(shapes)))
    assert [group["params"] for group in saved["param_groups"]] == [[i] for i in range(len(shapes))]
    copies, loaded = made()
    for copy, param in zip(copies, params, strict=True):
        copy.data.copy_(param.data)
    loaded.load_state_dict(saved)
    backward(params)
    backward(copies)
    assert all(torch.equal(c, p) for c, p in zip(copies, params, strict=True))


def test_a_bad_state_dict_loads_nothing(tmp_path: Path) -> None:
    model = tiny_gpt2().eval()
    optimizer = _build(GALORE, tmp_path, model)
    _backward(model, 0)
    saved = optimizer.state_dict()
    before = [{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()]
    broken = {**saved, "state": dict(saved["state"])}
    last = len(saved["param_groups"]) - 1
    broken["state"][last] = {**saved["state"][last], "exp_avg": torch.zeros(3)}  # a bad shape
    broken["state"][0] = {k: v + 1 for k, v in saved["state"][0].items()}  # a good change
    with pytest.raises(StateDictError, match="nothing was changed"):
        optimizer.load_state_dict(broken)
    for slots, kept in zip(optimizer.state.values(), before, strict=True):
        assert all(torch.equal(slots[k], v) for k, v in kept.items())
    short = {**saved, "param_groups": saved["param_groups"][:-1]}
    with pytest.raises(StateDictError, match="one optimizer per parameter"):
        optimizer.load_state_dict(short)


def test_a_second_optimizer_over_the_model_takes_its_parameters_over(tmp_path: Path) -> None:
    """Two Trainers over one model: only the newest optimizer steps; a discarded one unhooks."""
    model, reference = tiny_gpt2().eval(), tiny_gpt2().eval()
    first = _build(GALORE, tmp_path, model)
    second = _build(GALORE, tmp_path, model)
    assert not first.attached and second.attached
    by_hand = _build(GALORE, tmp_path, reference)
    by_hand.detach()
    _backward(model, 0)
    _backward(reference, 0)
    for inner in by_hand.optimizers:
        inner.step()
        inner.zero_grad()
    _assert_same_parameters(model, reference)  # stepped once, not twice
    del second
    gc.collect()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _backward(model, 1)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # no hook left
    assert all(p.grad is not None for p in model.parameters())  # plain accumulation again


def test_a_second_trainer_over_one_model_takes_it_over_and_nothing_leaks(tmp_path: Path) -> None:
    """The Trainer's own linear warm-up reaches every group; a second Trainer takes over."""
    import weakref

    def trainer(output_dir: Path, model: torch.nn.Module) -> Trainer:
        args = arguments(output_dir, optim=GALORE, max_grad_norm=0.0, warmup_steps=4)
        args.max_steps, args.save_strategy = 2, "no"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the route's caveat
            recipe = from_training_args(args, registry=PYTORCH_GALORE)
        return Trainer(
            model=model, args=args, train_dataset=Tokens(), optimizer_cls_and_kwargs=recipe
        )

    model = tiny_gpt2()
    first = trainer(tmp_path / "first", model)
    first.train()
    first_optimizer = first.optimizer.optimizer  # type: ignore[union-attr]  # accelerate's wrapper
    # LambdaLR after 2 steps: the base lr times transformers' warm-up factor step/warmup
    lrs = {group["lr"] for inner in first_optimizer.optimizers for group in inner.param_groups}
    assert lrs == {1e-3 * (2 / 4)}
    second = trainer(tmp_path / "second", model)
    second.create_optimizer()
    assert not first_optimizer.attached and second.optimizer.attached  # type: ignore[union-attr]
    gone = weakref.ref(first_optimizer)
    del first, first_optimizer
    gc.collect()
    assert gone() is None  # nothing (no hook, no table) keeps a discarded one alive


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gradient_accumulation_steps", 2),
        ("fp16", True),
        ("fsdp", True),
    ],
)
def test_what_layerwise_cannot_serve_is_refused(field: str, value: Any, tmp_path: Path) -> None:
    args = arguments(tmp_path, optim=GALORE, **{field: value})
    with pytest.raises(HyperparameterError, match="layer-wise") as raised:
        from_training_args(args, registry=PYTORCH_GALORE)
    assert raised.value.field == field and raised.value.value == value


def test_clipping_is_said_not_to_apply(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"max_grad_norm=1.0 does not apply"):
        cls, _ = from_training_args(arguments(tmp_path, optim=GALORE), registry=PYTORCH_GALORE)
    assert isinstance(cls, TrainerOptimizer) and cls.layerwise
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_training_args(
            arguments(tmp_path, optim=GALORE, max_grad_norm=0.0), registry=PYTORCH_GALORE
        )
    assert not any("max_grad_norm" in str(w.message) for w in caught)


def test_bad_per_parameter_optimizers_are_refused() -> None:
    model = torch.nn.Linear(3, 2)
    both = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(HyperparameterError, match="exactly one") as raised:
        LayerwiseOptimizer([both])
    assert raised.value.field == "optimizers[0]"
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    with pytest.raises(HyperparameterError, match="does not require grad"):
        layerwise(lambda groups: torch.optim.SGD(groups, lr=0.1), [("frozen", frozen)])
    twice = [torch.optim.SGD([model.bias], lr=0.1) for _ in range(2)]
    with pytest.raises(HyperparameterError, match="same parameter"):
        LayerwiseOptimizer(twice)
    made = layerwise(lambda groups: torch.optim.SGD(groups, lr=0.1), model.parameters())
    with pytest.raises(HyperparameterError, match="fixed"):
        made.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})


def test_a_state_dict_it_could_not_load_is_never_written() -> None:
    class Tagged(torch.optim.SGD):
        def state_dict(self) -> dict[str, Any]:
            return {**super().state_dict(), "tag": 1}

    model = torch.nn.Linear(3, 2)
    optimizer = layerwise(lambda groups: Tagged(groups, lr=0.1), model.parameters())
    with pytest.raises(StateDictError, match="tag"):
        optimizer.state_dict()


@pytest.mark.slow
def test_a_resumed_layerwise_trainer_continues_bit_equal(tmp_path: Path) -> None:
    """20 Trainer steps whole, and 10 + 10 resumed from the checkpoint at step 10."""

    def run(output_dir: Path, resume: Path | None = None) -> Trainer:
        args = arguments(output_dir, optim=GALORE, optim_target_modules=TARGETS)
        args.warmup_steps = 3
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the route's caveats
            recipe = from_training_args(args)
        trainer = Trainer(
            model=tiny_gpt2(), args=args, train_dataset=Tokens(), optimizer_cls_and_kwargs=recipe
        )
        trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
        return trainer

    whole = run(tmp_path / "whole")
    checkpoint = tmp_path / "whole" / "checkpoint-10"
    saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert len(saved["state"]) == len(list(tiny_gpt2().parameters()))  # every parameter's state
    resumed = run(tmp_path / "resumed", checkpoint)
    assert resumed.state.global_step == whole.state.global_step == 20
    assert isinstance(resumed.optimizer.optimizer, LayerwiseOptimizer)
    _assert_same_parameters(resumed.model, whole.model)
    assert not torch.equal(resumed.model.lm_head.weight, tiny_gpt2().lm_head.weight)
    # the schedule reached every parameter: linear decay to 0 at step 20
    assert {g["lr"] for g in resumed.optimizer.optimizer.optimizers[0].param_groups} == {0.0}

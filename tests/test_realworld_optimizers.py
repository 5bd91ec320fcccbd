"""Third-party optimizers held by the core: pytorch_optimizer, torchao, schedule-free.

Each optimizer is the peer library's own class, wrapped with
``optiplug.base.external_optimizer`` and registered in a throwaway registry
the way a bridge plugin registers it. The checks compare against the peer
library itself (the same class run directly, an uninterrupted run) or an
independent count, never against optiplug's own earlier output.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import optiplug
from optiplug import checkpoint, testing, validators
from optiplug.base import external_optimizer, set_training, torch_backed_optimizer
from optiplug.errors import HyperparameterError, StateDictError

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
torchao_optim = pytest.importorskip("torchao.optim")
schedulefree = pytest.importorskip("schedulefree")

Adan = external_optimizer("adan", pytorch_optimizer.Adan, group_state=("step",))
Lamb = external_optimizer("lamb", pytorch_optimizer.Lamb, group_state=("step",))
SOAP = external_optimizer("soap", pytorch_optimizer.SOAP, group_state=("step",))
AdamW8bit = external_optimizer("adamw8bit", torchao_optim.AdamW8bit)
AdamW4bit = external_optimizer("adamw4bit", torchao_optim.AdamW4bit)
AdamWScheduleFree = external_optimizer("adamw_schedulefree", schedulefree.AdamWScheduleFree)

SCHEDULE_FREE_GROUP_STATE = ("train_mode", "weight_sum", "lr_max", "scheduled_lr", "k")
# 4096 float32 elements: the quantized path of torchao's 8-bit and 4-bit state
QUANTIZED: dict[str, Any] = {"example_shape": (64, 64), "example_dtype": "float32"}

SPECS = (
    optiplug.OptimizerSpec(name="adan", factory=Adan, group_state=("step",)),
    optiplug.OptimizerSpec(name="lamb", factory=Lamb, group_state=("step",)),
    optiplug.OptimizerSpec(name="soap", factory=SOAP, group_state=("step",)),
    optiplug.OptimizerSpec(name="adamw8bit", factory=AdamW8bit, **QUANTIZED),
    optiplug.OptimizerSpec(name="adamw4bit", factory=AdamW4bit, **QUANTIZED),
    optiplug.OptimizerSpec(
        name="adamw_schedulefree",
        factory=AdamWScheduleFree,
        group_state=SCHEDULE_FREE_GROUP_STATE,
        train_eval=True,
    ),
)


class _Bridge:
    """Registers the wrapped classes, as a bridge plugin's entry-point module would."""

    @optiplug.hookimpl
    def optiplug_optimizers(self) -> list[optiplug.OptimizerSpec]:
        return list(SPECS)


@pytest.fixture(scope="module")
def registry() -> optiplug.Registry:
    found = optiplug.Registry(autoload=False)
    info = found.register(_Bridge(), "realworld", distribution="tests", version="0")
    assert info.status == "active", info.error
    return found


def _param(shape: tuple[int, ...] = (8, 8), seed: int = 0) -> torch.nn.Parameter:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape, generator=generator))


def _steps(optimizer: Any, param: torch.nn.Parameter, start: int, stop: int) -> None:
    """Steps ``start..stop-1``, each with the gradient seeded by its index (in train mode)."""
    set_training(optimizer, True)
    for index in range(start, stop):
        generator = torch.Generator().manual_seed(1000 + index)
        param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()
    set_training(optimizer, False)


# ------------------------------------------------ group keys: pytorch_optimizer's `step`
@pytest.mark.parametrize("name", ["adan", "lamb"])
def test_resume_through_checkpoint_is_bit_equal_to_an_uninterrupted_run(
    registry: optiplug.Registry, name: str, tmp_path: Path
) -> None:
    # pytorch_optimizer keeps `step` in each param group; the loader refused it
    # (unexpected-key), and dropping it (strict=False) resumed with a reset bias correction.
    whole = _param()
    uninterrupted = registry.create(name, [whole], lr=0.01)
    _steps(uninterrupted, whole, 0, 4)

    first = _param()
    saving = registry.create(name, [first], lr=0.01)
    _steps(saving, first, 0, 2)
    checkpoint.save(tmp_path / "ckpt", saving)
    second = _param()
    with torch.no_grad():
        second.copy_(first)
    resumed = registry.create(name, [second], lr=0.01)
    result = checkpoint.load(tmp_path / "ckpt", resumed)
    assert result.problems == ()
    assert resumed.param_groups[0]["step"] == 2
    _steps(resumed, second, 2, 4)
    assert torch.equal(second, whole)


def test_group_state_key_is_loaded_and_dropped_when_the_saved_group_lacks_it(
    registry: optiplug.Registry,
) -> None:
    param = _param()
    stepped = registry.create("adan", [param], lr=0.01)
    _steps(stepped, param, 0, 1)
    fresh_state = registry.create("adan", [_param()], lr=0.01).state_dict()
    # pytorch_optimizer adds `step` to the groups on the first step
    assert "step" not in fresh_state["param_groups"][0]
    assert optiplug.load_state_dict(stepped, fresh_state) == []
    assert "step" not in stepped.param_groups[0]


def test_a_group_state_key_holding_no_plain_value_is_a_problem(
    registry: optiplug.Registry,
) -> None:
    param = _param()
    optimizer = registry.create("adan", [param], lr=0.01)
    _steps(optimizer, param, 0, 1)
    state = optimizer.state_dict()
    state["param_groups"][0]["step"] = object()
    problems = optiplug.validate_state_dict(optimizer, state)
    assert [(p.slot, p.kind) for p in problems] == [("step", "type")]


# ------------------------------------------------ betas of any declared arity
@attrs.frozen
class _AdanConfig:
    betas: tuple[float, ...] = validators.hyperparameter(
        (0.98, 0.92, 0.99), validators.betas, "each in [0, 1)"
    )


def test_betas_takes_the_arity_its_field_declares() -> None:
    assert _AdanConfig(betas=(0.9, 0.9, 0.9)).betas == (0.9, 0.9, 0.9)
    with pytest.raises(HyperparameterError, match="triple") as caught:
        _AdanConfig(betas=(0.9, 0.9))
    assert caught.value.field == "betas"


def test_an_external_class_declares_its_betas_arity_by_its_signature(
    registry: optiplug.Registry,
) -> None:
    param = _param()
    optimizer = registry.create("adan", [param], betas=(0.9, 0.9, 0.99))
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.9, 0.99)
    with pytest.raises(HyperparameterError) as caught:
        registry.create("adan", [param], betas=(0.9, 1.0, 0.99))
    assert caught.value.field == "betas" and "beta2" in str(caught.value)
    with pytest.raises(HyperparameterError, match="triple"):
        registry.create("adan", [param], betas=(0.9, 0.9))


@settings(max_examples=60, deadline=None)
@given(
    arity=st.integers(1, 5),
    values=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=6),
)
def test_betas_of_accepts_exactly_its_arity_of_values_in_the_unit_interval(
    arity: int, values: list[float]
) -> None:
    check = validators.betas_of(arity)
    field = attrs.fields(_AdanConfig).betas
    if len(values) == arity:
        check(None, field, tuple(values))
    else:
        with pytest.raises(HyperparameterError) as caught:
            check(None, field, tuple(values))
        assert caught.value.field == "betas"


@given(bad=st.floats(1.0, 10.0) | st.floats(-10.0, 0.0, exclude_max=True))
def test_betas_of_names_the_beta_out_of_range(bad: float) -> None:
    with pytest.raises(HyperparameterError, match="beta3"):
        validators.betas_of(3)(None, attrs.fields(_AdanConfig).betas, (0.5, 0.5, bad))


# ------------------------------------------------ tensor-subclass state (torchao)
def _inner(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """Independent of optiplug: the plain tensors a subclass is flattened into."""
    if hasattr(type(tensor), "__tensor_flatten__") and type(tensor) is not torch.Tensor:
        for attribute in tensor.__tensor_flatten__()[0]:  # type: ignore[attr-defined]
            yield from _inner(getattr(tensor, attribute))
    else:
        yield tensor


def _real_bytes(optimizer: Any) -> int:
    """Every storage the state and tensor hyperparameters hold, each once."""
    storages: dict[int, int] = {}
    values = [v for entry in optimizer.state.values() for v in entry.values()]
    values += [v for g in optimizer.param_groups for k, v in g.items() if k != "params"]
    for value in values:
        if isinstance(value, torch.Tensor):
            for inner in _inner(value):
                storage = inner.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("name", ["adamw8bit", "adamw4bit"])
def test_memory_counts_the_real_storage_of_quantized_state(
    registry: optiplug.Registry, name: str
) -> None:
    param = _param((64, 64))  # 4096 elements: blockwise-quantized state (>= 4096)
    optimizer = registry.create(name, [param])
    _steps(optimizer, param, 0, 1)
    assert type(optimizer.state[param]["exp_avg"]).__name__.startswith("OptimState")
    real = _real_bytes(optimizer)
    report = optiplug.memory(optimizer)
    assert abs(report.total - real) <= 0.01 * real
    # far below the float32 state the wrapper reports as its shape and dtype
    assert report.total < 2 * param.numel() * 4 / 3


@pytest.mark.parametrize("name", ["adamw8bit", "adamw4bit"])
def test_quantized_state_validates_and_loads_bit_equal(
    registry: optiplug.Registry, name: str
) -> None:
    param, twin = _param((64, 64)), _param((64, 64))
    original = registry.create(name, [param])
    _steps(original, param, 0, 2)
    with torch.no_grad():
        twin.copy_(param)
    restored = registry.create(name, [twin])
    assert optiplug.load_state_dict(restored, original.state_dict()) == []
    _steps(original, param, 2, 4)
    _steps(restored, twin, 2, 4)
    assert torch.equal(param, twin)


def test_a_damaged_quantized_state_is_a_problem_not_a_crash(registry: optiplug.Registry) -> None:
    # validating torchao state used to raise NotImplementedError (aten.abs on OptimState8bit)
    param = _param((64, 64))
    optimizer = registry.create("adamw8bit", [param])
    _steps(optimizer, param, 0, 1)
    state = optimizer.state_dict()
    saved = state["state"][0]["exp_avg"]
    names, context = saved.__tensor_flatten__()
    inner = {name: getattr(saved, name).clone() for name in names}
    inner["scale"][0] = math.nan
    damaged = type(saved).__tensor_unflatten__(inner, context, saved.shape, saved.stride())
    state["state"][0] = {**state["state"][0], "exp_avg": damaged}
    problems = optiplug.validate_state_dict(optimizer, state)
    assert [(p.slot, p.kind) for p in problems] == [("exp_avg", "non-finite")]
    before = optimizer.state[param]["exp_avg"].scale.clone()
    with pytest.raises(StateDictError):
        optiplug.load_state_dict(optimizer, state)
    assert torch.equal(optimizer.state[param]["exp_avg"].scale, before)


def test_declared_slots_check_a_quantized_state_as_it_reports_itself(
    registry: optiplug.Registry,
) -> None:
    slots = (
        optiplug.StateSlot("step", shape="scalar", dtype="float32"),
        optiplug.StateSlot("exp_avg", dtype="param"),
        optiplug.StateSlot("exp_avg_sq", dtype="param", constraints=("finite", "non_negative")),
    )
    spec = attrs.evolve(registry.spec("adamw8bit"), name="adamw8bit_slots", state_slots=slots)

    class Declared:
        @optiplug.hookimpl
        def optiplug_optimizers(self) -> list[optiplug.OptimizerSpec]:
            return [spec]

    declared = optiplug.Registry(autoload=False)
    declared.register(Declared(), "declared")
    param = _param((64, 64))
    optimizer = declared.create("adamw8bit_slots", [param])
    _steps(optimizer, param, 0, 1)
    state = optimizer.state_dict()
    assert optiplug.validate_state_dict(optimizer, state) == []
    state["state"][0] = {**state["state"][0], "exp_avg": torch.zeros(3)}
    problems = optiplug.validate_state_dict(optimizer, state)
    assert [(p.slot, p.kind) for p in problems] == [("exp_avg", "shape")]


# ------------------------------------------------ the external-class wrapper
def test_only_the_keywords_the_class_names_are_passed() -> None:
    # torch_backed_optimizer passed foreach/fused to AdamW8bit: TypeError
    param, twin = _param((64, 64)), _param((64, 64))
    wrapped, plain = AdamW8bit([param], lr=0.01), torchao_optim.AdamW8bit([twin], lr=0.01)
    assert wrapped.impl == "default"
    assert [r.name for r in AdamW8bit.implementation_specs()] == ["default"]
    _steps(wrapped, param, 0, 3)
    _steps(plain, twin, 0, 3)
    assert torch.equal(param, twin)


@pytest.mark.parametrize("cls", [torchao_optim.AdamW8bit, pytorch_optimizer.Adan])
def test_torch_backed_optimizer_refuses_a_class_without_torch_flags(cls: type) -> None:
    # it passed foreach/fused anyway: a TypeError at construction (AdamW8bit), or
    # flags swallowed by **kwargs and impl="fused" reported (Adan)
    with pytest.raises(TypeError, match="external_optimizer"):
        torch_backed_optimizer("x", cls, _AdanConfig)


def test_the_implementation_is_reported_honestly() -> None:
    # Adan swallows fused= in **kwargs: it must never report impl="fused"
    assert sorted(r.name for r in Adan.implementation_specs()) == ["foreach", "loop"]
    param, twin = _param(), _param()
    wrapped = Adan([param], lr=0.01, impl="loop")
    assert wrapped.impl == "loop" and wrapped.param_groups[0]["foreach"] is False
    plain = pytorch_optimizer.Adan([twin], lr=0.01, foreach=False)
    _steps(wrapped, param, 0, 3)
    _steps(plain, twin, 0, 3)
    assert torch.equal(param, twin)
    assert Adan([_param()]).impl == "foreach"
    with pytest.raises(HyperparameterError) as caught:
        Adan([_param()], impl="fused")
    assert caught.value.field == "impl"


def test_a_keyword_the_class_would_swallow_is_refused_with_a_suggestion() -> None:
    with pytest.raises(HyperparameterError) as caught:
        Adan([_param()], lrr=0.1)
    assert caught.value.field == "lrr" and caught.value.suggestion == "lr"
    with pytest.raises(HyperparameterError) as caught:
        Adan([_param()], fused=True)
    assert caught.value.field == "fused"


# ------------------------------------------------ the conformance suite
def test_list_state_passes_deepcopy_and_state_dict_checks(registry: optiplug.Registry) -> None:
    # check_deepcopy_and_pickle crashed: "Boolean value of Tensor ... is ambiguous"
    testing.check_deepcopy_and_pickle("soap", registry=registry)
    testing.check_state_dict_round_trip("soap", registry=registry)


def test_same_state_value_compares_structure_and_tensors_exactly() -> None:
    a = [torch.ones(2), (torch.zeros(1), 3)]
    assert testing.same_state_value(a, [torch.ones(2), (torch.zeros(1), 3)])
    assert not testing.same_state_value(a, [torch.ones(2), [torch.zeros(1), 3]])
    assert not testing.same_state_value(a, [torch.ones(2), (torch.full((1,), 1e-30), 3)])


@pytest.mark.parametrize("name", ["adamw8bit", "adamw4bit"])
def test_a_spec_declares_the_parameters_its_kernels_need(
    registry: optiplug.Registry, name: str
) -> None:
    # the 4x4 float64 parameter never reached torchao's quantized path
    assert testing.example_of(registry, name) == ((64, 64), torch.float32)
    testing.check_state_dict_round_trip(name, registry=registry)
    testing.check_no_grad_step_is_noop(name, registry=registry)
    testing.check_hyperparameter_errors(name, registry=registry)
    # copy.deepcopy of a tensor calls clone, which torchao's state does not implement
    testing.check_deepcopy_and_pickle(name, registry=registry)


def test_float8_state_is_checked_not_reported_uninspectable() -> None:
    # CPU has no isfinite for float8: the inner codes are checked through float32
    param = _param((64, 64))
    optimizer = external_optimizer("adamw_fp8", torchao_optim.AdamWFp8)([param])
    _steps(optimizer, param, 0, 1)
    assert optiplug.validate_state_dict(optimizer, optimizer.state_dict()) == []


@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_schedule_free_passes_every_check_with_the_lifecycle(
    registry: optiplug.Registry, check: Any
) -> None:
    # nothing called .train(): four of five checks failed
    check("adamw_schedulefree", registry=registry)


def test_the_lifecycle_is_detected_without_a_declaration() -> None:
    param = _param()
    optimizer = schedulefree.AdamWScheduleFree([param], lr=0.01)
    assert set_training(optimizer, True) and optimizer.param_groups[0]["train_mode"]
    assert not set_training(torch.optim.SGD([param], lr=0.1), True)


# ------------------------------------------------ Graph
def _graph(registry: optiplug.Registry) -> optiplug.Graph:
    torch.manual_seed(0)
    graph = optiplug.Graph(torch.nn.Linear(4, 1))
    graph.set_optimizer(registry.factory("adamw_schedulefree", lr=0.05))
    return graph


def _graph_steps(graph: optiplug.Graph, start: int, stop: int) -> None:
    for index in range(start, stop):
        generator = torch.Generator().manual_seed(index)
        inputs = torch.randn(8, 4, generator=generator)
        graph.backward(graph.model(inputs).pow(2).mean())
        graph.step()


def test_graph_checkpoints_a_schedule_free_optimizer_at_its_evaluation_point(
    registry: optiplug.Registry, tmp_path: Path
) -> None:
    graph = _graph(registry)
    _graph_steps(graph, 0, 3)
    optimizer = graph.optimizer
    assert optimizer is not None
    beta1 = optimizer.param_groups[0]["betas"][0]
    # schedule-free's evaluation point x = y + (1 - 1/beta1) (z - y), in float64
    expected = {
        name: (p.double() + (1 - 1 / beta1) * (optimizer.state[p]["z"].double() - p.double()))
        for name, p in graph.module.named_parameters()
    }
    training = {name: p.detach().clone() for name, p in graph.module.named_parameters()}
    graph.save(tmp_path / "ckpt")
    assert optimizer.param_groups[0]["train_mode"]  # back to training after the save
    stored = checkpoint.load(tmp_path / "ckpt", copy.deepcopy(optimizer))
    assert stored.info.hyperparameters[0]["train_mode"] is False
    # Tolerance: each lerp rounds once per element in float32 (|value| < 4 here,
    # ulp 2**-22 < 2.4e-7); x and the round trip y -> x -> y take at most a few roundings.
    for name, value in graph.module.named_parameters():
        torch.testing.assert_close(value.detach(), training[name], rtol=0, atol=1e-6)
        saved = stored.tensors[f"model/{name}"]
        torch.testing.assert_close(saved.double(), expected[name], rtol=0, atol=1e-6)


def test_graph_resume_of_a_schedule_free_run_is_bit_equal(
    registry: optiplug.Registry, tmp_path: Path
) -> None:
    graph = _graph(registry)
    _graph_steps(graph, 0, 3)
    graph.save(tmp_path / "ckpt")
    _graph_steps(graph, 3, 5)
    resumed = _graph(registry)
    resumed.load(tmp_path / "ckpt")
    _graph_steps(resumed, 3, 5)
    for (_, a), (_, b) in zip(
        graph.module.named_parameters(), resumed.module.named_parameters(), strict=True
    ):
        assert torch.equal(a, b)


def test_graph_refuses_a_step_taken_in_eval_mode(registry: optiplug.Registry) -> None:
    graph = _graph(registry)
    graph.eval()
    graph.backward(graph.model(torch.ones(2, 4)).sum())
    with pytest.raises(optiplug.errors.GraphError, match=r"graph\.train"):
        graph.step()


def test_a_config_class_validates_the_external_class_keywords() -> None:
    betas_only = external_optimizer("adan", pytorch_optimizer.Adan, _AdanConfig)
    optimizer = betas_only([_param()], betas=(0.9, 0.9, 0.9))
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.9, 0.9)
    assert optimizer.param_groups[0]["lr"] == 1e-3  # the class's own default: not in the config
    with pytest.raises(HyperparameterError) as caught:
        betas_only([_param()], betas=(0.9, 0.9))
    assert caught.value.field == "betas"
    with pytest.raises(HyperparameterError) as caught:
        betas_only([_param()], lr=0.1)
    assert caught.value.field == "lr"

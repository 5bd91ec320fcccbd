"""The multi optimizer: routes, one optimizer object, one validated state dict."""

from __future__ import annotations

import copy

import pytest
import torch

import optiplug
from optiplug.errors import HyperparameterError, StateDictError


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 8)
        self.hidden = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(torch.relu(self.hidden(self.embed(tokens)))))


def loss_of(model: Tiny, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, 10, (16,), generator=generator)
    labels = torch.randint(0, 3, (16,), generator=generator)
    return torch.nn.functional.cross_entropy(model(tokens), labels)


def train(model: Tiny, optimizers: list[torch.optim.Optimizer], steps: range) -> None:
    for step in steps:
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss_of(model, step).backward()
        for optimizer in optimizers:
            optimizer.step()


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    return param.ndim == 2 and name.startswith("hidden")


PAIRS = [("sgd", {"lr": 0.1, "momentum": 0.9}), ("muon", {"lr": 0.02})]


@pytest.mark.parametrize(("matrix_algorithm", "hparams"), PAIRS)
def test_multi_equals_the_two_optimizers_stepped_separately(
    matrix_algorithm: str, hparams: dict
) -> None:
    if matrix_algorithm not in optiplug.optimizers():
        pytest.skip(f"{matrix_algorithm} not installed")
    routes = [
        {"algorithm": matrix_algorithm, "match": is_hidden_matrix, **hparams},
        {"algorithm": "adamw", "match": "*", "lr": 3e-3},
    ]
    model, twin = Tiny(), Tiny()
    multi = optiplug.create("multi", model.named_parameters(), routes=routes)
    named = list(twin.named_parameters())
    matrices = [(n, p) for n, p in named if is_hidden_matrix(n, p)]
    rest = [(n, p) for n, p in named if not is_hidden_matrix(n, p)]
    separate = [
        optiplug.create(matrix_algorithm, matrices, **hparams),
        optiplug.create("adamw", rest, lr=3e-3),
    ]
    train(model, [multi], range(20))
    train(twin, separate, range(20))
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


def routes() -> list[dict]:
    return [
        {"algorithm": "sgd", "match": "hidden.*", "lr": 0.1, "momentum": 0.9},
        {"algorithm": "adamw", "match": "*", "lr": 3e-3},
    ]


def test_state_dict_round_trips_and_survives_reordered_parameters() -> None:
    model = Tiny()
    multi = optiplug.create("multi", model.named_parameters(), routes=routes())
    train(model, [multi], range(5))
    saved = copy.deepcopy(multi.state_dict())
    assert [g["route"] for g in saved["param_groups"]] == ["sgd", "adamw"]
    reference = copy.deepcopy(model)
    reference_multi = optiplug.create("multi", reference.named_parameters(), routes=routes())
    reference_multi.load_state_dict(copy.deepcopy(saved))
    twin = copy.deepcopy(model)
    reordered = list(reversed(list(twin.named_parameters())))
    twin_multi = optiplug.create("multi", reordered, routes=routes())
    twin_multi.load_state_dict(copy.deepcopy(saved))
    train(reference, [reference_multi], range(5, 10))
    train(twin, [twin_multi], range(5, 10))
    for p, q in zip(reference.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_route_that_changed_algorithm_is_named_and_nothing_loads() -> None:
    model = Tiny()
    multi = optiplug.create("multi", model.named_parameters(), routes=routes())
    train(model, [multi], range(2))
    saved = multi.state_dict()
    changed = [{**routes()[0], "algorithm": "adam", "name": "sgd"}, routes()[1]]
    changed[0].pop("momentum")
    other = optiplug.create("multi", Tiny().named_parameters(), routes=changed)
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(StateDictError) as caught:
        other.load_state_dict(saved)
    assert "route 'sgd' using adam" in str(caught.value) and "route 'sgd' using sgd" in str(
        caught.value
    )
    assert other.state_dict() == before


def test_bad_state_inside_a_route_is_reported_with_the_route() -> None:
    model = Tiny()
    multi = optiplug.create("multi", model.named_parameters(), routes=routes())
    train(model, [multi], range(2))
    saved = copy.deepcopy(multi.state_dict())
    saved["state"][0]["momentum_buffer"] = saved["state"][0]["momentum_buffer"][:1]
    problems = optiplug.validate_state_dict(multi, saved)
    assert [(p.slot, p.kind) for p in problems] == [("sgd/momentum_buffer", "shape")]
    snapshot = copy.deepcopy(multi.state_dict())
    with pytest.raises(StateDictError):
        optiplug.load_state_dict(multi, saved)
    after = multi.state_dict()
    assert all(
        torch.equal(after["state"][i][k], v)
        for i, s in snapshot["state"].items()
        for k, v in s.items()
    )


def test_routing_errors() -> None:
    named = list(Tiny().named_parameters())
    with pytest.raises(HyperparameterError, match="add a fallback route"):
        optiplug.create("multi", named, routes=[{"algorithm": "sgd", "match": "hidden.*"}])
    overlap = [
        {"algorithm": "sgd", "params": ["hidden.weight"]},
        {"algorithm": "adamw", "params": ["hidden.weight", "out.bias"]},
        {"algorithm": "adamw", "match": "*", "name": "rest"},
    ]
    with pytest.raises(HyperparameterError, match="explicit lists of routes 'sgd' and 'adamw'"):
        optiplug.create("multi", named, routes=overlap)
    with pytest.raises(HyperparameterError, match=r"routes\[0\]\.algorithm"):
        optiplug.create("multi", named, routes=[{"match": "*"}])
    with pytest.raises(HyperparameterError, match="sgd: invalid lr=-1"):
        optiplug.create("multi", named, routes=[{"algorithm": "sgd", "lr": -1}])
    with pytest.raises(optiplug.errors.UnknownOptimizerError):
        optiplug.create("multi", named, routes=[{"algorithm": "sgdd"}])


def test_first_match_wins_and_routing_explains() -> None:
    model = Tiny()
    multi = optiplug.create(
        "multi",
        model.named_parameters(),
        routes=[
            {"algorithm": "sgd", "params": [model.out.bias], "lr": 0.5},
            {"algorithm": "sgd", "match": lambda n, p: p.ndim == 2, "lr": 0.1, "name": "matrices"},
            {"algorithm": "adamw", "match": "*", "lr": 1e-3},
        ],
    )
    routing = multi.routing()
    assert routing["out.bias"].route == "sgd" and routing["out.bias"].lr == 0.5
    assert (
        routing["embed.weight"].route == "matrices"
        and "predicate <lambda>" in routing["embed.weight"].reason
    )
    assert (
        routing["norm.weight"].algorithm == "adamw"
        and "fallback '*'" in routing["norm.weight"].reason
    )
    text = str(routing)
    assert text.splitlines()[0].split()[:4] == ["parameter", "shape", "algorithm", "route"]
    assert "out.bias" in text


def test_param_groups_are_shared_with_sub_optimizers() -> None:
    model = Tiny()
    multi = optiplug.create("multi", model.named_parameters(), routes=routes())
    scheduler = torch.optim.lr_scheduler.StepLR(multi, step_size=1, gamma=0.5)
    train(model, [multi], range(1))
    scheduler.step()
    assert [g["lr"] for g in multi.optimizers["sgd"].param_groups] == [0.05]
    assert [g["lr"] for g in multi.optimizers["adamw"].param_groups] == [1.5e-3]
    graph = optiplug.Graph(model)
    graph.set_optimizer(optiplug.factory("multi", routes=routes()))
    graph.set_scheduler(optiplug.schedule("linear_warmup", warmup_steps=4))
    graph.set_lr_scale(2.0)
    assert graph.current_lrs() == pytest.approx([0.1 * 0.25 * 2, 3e-3 * 0.25 * 2])
    for step in range(6):
        loss_of(model, step).backward()
        graph.step()
        factor = graph.schedule(step) * 2
        subs = graph.optimizer.optimizers
        assert subs["sgd"].param_groups[0]["lr"] == pytest.approx(0.1 * factor)
        assert subs["adamw"].param_groups[0]["lr"] == pytest.approx(3e-3 * factor)


def test_checkpoint_round_trip(tmp_path) -> None:
    model = Tiny()
    multi = optiplug.create("multi", model.named_parameters(), routes=routes())
    train(model, [multi], range(3))
    optiplug.checkpoint.save(tmp_path / "ckpt", multi)
    twin = copy.deepcopy(model)
    restored = optiplug.create("multi", twin.named_parameters(), routes=routes())
    optiplug.checkpoint.load(tmp_path / "ckpt", restored)
    train(model, [multi], range(3, 6))
    train(twin, [restored], range(3, 6))
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)

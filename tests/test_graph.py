"""optiplug.Graph: lr arithmetic, accumulation, mixed precision, data binding."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import optiplug
from optiplug import Graph
from optiplug.errors import GraphError, HyperparameterError


class Pairs(Dataset):
    """x -> y = 3x + 1 with a mask field the model takes as a keyword."""

    def __init__(self, n: int = 32) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True) * 3 + 1

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "scale": torch.tensor(1.0), "y": self.y[index]}


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        out = self.head(torch.tanh(self.body(x)))
        return out if scale is None else out * scale.reshape(-1, 1)


def make_graph(**kwargs) -> Graph:
    torch.manual_seed(0)
    return Graph(Regressor(), **kwargs)


def two_group_sgd(named):
    named = list(named)
    body = [p for n, p in named if n.startswith("body")]
    head = [p for n, p in named if n.startswith("head")]
    return torch.optim.SGD([{"params": body, "lr": 0.1}, {"params": head, "lr": 0.01}])


def fake_gradients(graph: Graph) -> None:
    for p in graph.parameters():
        p.grad = torch.ones_like(p)


def test_lr_is_base_times_schedule_times_scale_every_step() -> None:
    graph = make_graph()
    graph.set_optimizer(two_group_sgd)
    schedule = optiplug.schedule("cosine", total_steps=20, warmup_steps=5, min_ratio=0.1)
    graph.set_scheduler(schedule)
    graph.set_lr_scale(2.0)
    for step in range(25):
        fake_gradients(graph)
        graph.step()
        used = [g["lr"] for g in graph.optimizer.param_groups]
        assert used == pytest.approx(
            [0.1 * schedule(step) * 2.0, 0.01 * schedule(step) * 2.0], rel=1e-12
        )
        assert graph.training_step == step + 1


def test_set_lr_changes_the_base_and_scale_is_validated() -> None:
    graph = make_graph()
    graph.set_optimizer("sgd", lr=0.5)
    graph.set_scheduler({"name": "step", "step_size": 1, "gamma": 0.5})
    graph.set_lr(0.2)
    assert graph.current_lrs() == [0.2]
    fake_gradients(graph)
    graph.step()
    assert graph.current_lrs() == [0.1]
    for bad in (0, -1.0, math.nan, math.inf, True):
        with pytest.raises(HyperparameterError, match="lr_scale"):
            graph.set_lr_scale(bad)


def test_accumulation_steps_once_per_k_and_averages() -> None:
    data = Pairs(8)
    batch = {"x": data.x, "y": data.y}
    whole = make_graph()
    whole.set_optimizer("sgd", lr=0.1)
    loss = torch.nn.functional.mse_loss(whole.module(batch["x"]), batch["y"])
    whole.backward(loss)
    assert whole.step()
    parts = make_graph(accumulate=4)
    parts.set_optimizer("sgd", lr=0.1)
    parts.set_scheduler("constant")
    results = []
    for i in range(4):
        chunk = slice(2 * i, 2 * i + 2)
        loss = torch.nn.functional.mse_loss(parts.module(batch["x"][chunk]), batch["y"][chunk])
        parts.backward(loss)
        results.append(parts.step())
    assert results == [False, False, False, True] and parts.training_step == 1
    for p, q in zip(whole.parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_fp16_step_skipped_for_inf_gradients_does_not_advance_schedule() -> None:
    graph = make_graph(precision="fp16")
    graph.set_optimizer("sgd", lr=0.1)
    graph.set_scheduler(optiplug.schedule("linear_warmup", warmup_steps=10))
    before = [p.detach().clone() for p in graph.parameters()]
    output = graph.module(torch.ones(2, 4))
    graph.backward((output - output.detach()).sqrt().sum())  # a loss of 0, infinite gradients
    assert graph.step() is False
    assert graph.training_step == 0
    assert all(torch.equal(p, q) for p, q in zip(graph.parameters(), before, strict=True))
    assert graph.current_lrs() == pytest.approx([0.1 * 0.1])
    graph.backward(graph.module(torch.ones(2, 4)).sum())
    assert graph.step() is True and graph.training_step == 1


def test_bf16_autocast_in_forward_batch() -> None:
    graph = make_graph(precision="bf16")
    graph.set_data_loader(DataLoader(Pairs(), batch_size=4), forward_input="x")
    seen = []
    graph.module.head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    graph.forward_batch(next(iter(graph.epoch(0))))
    assert seen == [torch.bfloat16]  # linear layers ran under bf16 autocast
    graph.module(torch.ones(1, 4))
    assert seen[-1] == torch.float32  # and only inside forward_batch


def test_data_binding_routes_fields_and_reports_sizes() -> None:
    graph = make_graph()
    graph.set_data_loader(DataLoader(Pairs(32), batch_size=8), forward_input="x")
    assert (graph.data_num_batches, graph.data_batch_size) == (4, 8)
    batch = next(iter(graph.epoch(0)))
    assert list(graph.targets(batch)) == ["y"]
    expected = graph.module(batch["x"], scale=batch["scale"])
    torch.testing.assert_close(graph.forward_batch(batch), expected)
    with pytest.raises(
        GraphError, match="forward_input 'image' is not a batch field; fields: x, scale, y"
    ):
        graph.set_data_loader(DataLoader(Pairs(), batch_size=8), forward_input="image")


def test_rebinding_during_an_epoch_is_refused() -> None:
    graph = make_graph()
    graph.set_data_loader(DataLoader(Pairs(), batch_size=8), forward_input="x")
    iterator = graph.epoch(0)
    next(iterator)
    with pytest.raises(GraphError, match="while an epoch iterator is active"):
        graph.set_data_loader(DataLoader(Pairs(), batch_size=4), forward_input="x")
    iterator.close()
    graph.set_data_loader(DataLoader(Pairs(), batch_size=4), forward_input="x")
    assert graph.data_batch_size == 4


def test_shuffling_is_seeded_per_epoch() -> None:
    orders = []
    for _ in range(2):
        graph = make_graph(seed=5)
        graph.set_data_loader(DataLoader(Pairs(16), batch_size=4, shuffle=True), forward_input="x")
        orders.append([torch.cat([b["x"] for b in graph.epoch(e)]) for e in (0, 1)])
    assert torch.equal(orders[0][0], orders[1][0]) and torch.equal(orders[0][1], orders[1][1])
    assert not torch.equal(orders[0][0], orders[0][1])


def test_set_optimizer_accepts_names_factories_and_selections() -> None:
    graph = make_graph()
    optimizer = graph.set_optimizer("adamw", lr=1e-3)
    assert type(optimizer).__name__ == "AdamW"
    assert optimizer.state_dict()["param_groups"][0]["param_names"][0] == "body.weight"
    graph.set_optimizer(optiplug.factory("sgd", lr=0.3))
    assert graph.base_lrs == [0.3]
    selection = optiplug.AutoOptimizer.with_schedule(
        optiplug.AutoOptimizer.for_model(graph.module), "constant"
    )
    assert type(graph.set_optimizer(selection)).__name__ == "Adam"
    assert graph.schedule == optiplug.schedule("constant")
    with pytest.raises(HyperparameterError):
        graph.set_optimizer(optiplug.factory("sgd"), lr=0.1)


def test_usage_errors_are_clear() -> None:
    graph = make_graph()
    with pytest.raises(GraphError, match="set_optimizer"):
        graph.step()
    with pytest.raises(GraphError, match="set_data_loader"):
        list(graph.epoch(0))
    with pytest.raises(HyperparameterError, match="accumulate"):
        make_graph(accumulate=0)
    with pytest.raises(HyperparameterError, match="precision"):
        make_graph(precision="fp8")


def test_training_reduces_loss() -> None:
    graph = make_graph()
    graph.set_optimizer("adam", lr=1e-2)
    graph.set_data_loader(DataLoader(Pairs(64), batch_size=16, shuffle=True), forward_input="x")
    losses = []
    for epoch in range(30):
        for batch in graph.epoch(epoch):
            loss = torch.nn.functional.mse_loss(
                graph.forward_batch(batch), graph.targets(batch)["y"]
            )
            graph.backward(loss)
            graph.step()
            losses.append(float(loss.detach()))
    assert losses[-1] < 0.1 * losses[0]
    assert graph.training_step == 30 * 4


class Noisy(torch.nn.Module):
    """Dropout makes the run depend on the RNG, so resume must restore it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def noisy_graph(seed: int, impl: str = "foreach") -> Graph:
    """The graph the resume tests train; ``impl`` forced: two kernels agree only to rounding."""
    torch.manual_seed(seed)
    graph = Graph(Noisy(), seed=3)
    graph.set_optimizer("adamw", lr=1e-2, impl=impl)
    graph.set_scheduler(optiplug.schedule("cosine", total_steps=40, warmup_steps=5))
    graph.set_lr_scale(1.5)
    graph.set_data_loader(DataLoader(Pairs(40), batch_size=4, shuffle=True), forward_input="x")
    return graph


def train_until(graph: Graph, steps: int) -> None:
    epoch = graph.data_position[0]
    while graph.training_step < steps:
        for batch in graph.epoch(epoch):
            loss = torch.nn.functional.mse_loss(
                graph.forward_batch(batch), graph.targets(batch)["y"]
            )
            graph.backward(loss)
            graph.step()
            if graph.training_step == steps:
                return
        epoch += 1


def test_resumed_run_equals_uninterrupted_run_bit_for_bit(tmp_path) -> None:
    straight = noisy_graph(seed=0)
    train_until(straight, 26)
    first = noisy_graph(seed=0)
    train_until(first, 13)  # stops mid-epoch (10 batches per epoch)
    first.save(tmp_path / "ckpt")
    torch.manual_seed(999)  # disturb every RNG the resumed run depends on
    resumed = noisy_graph(seed=1)  # different initial weights, too
    resumed.load(tmp_path / "ckpt")
    assert resumed.training_step == 13 and resumed.data_position == (1, 3)
    train_until(resumed, 26)
    for p, q in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q)
    assert resumed.current_lrs() == straight.current_lrs()


def test_resuming_with_another_implementation_warns_and_names_the_saved_one(tmp_path) -> None:
    first = noisy_graph(seed=0, impl="foreach")
    train_until(first, 3)
    first.save(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match=r"'foreach' implementation.*runs 'loop'.*impl='foreach'"):
        noisy_graph(seed=0, impl="loop").load(tmp_path / "ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same implementation: nothing to say
        noisy_graph(seed=0, impl="foreach").load(tmp_path / "ckpt")


def test_load_verifies_everything_before_changing_anything(tmp_path) -> None:
    graph = noisy_graph(seed=0)
    train_until(graph, 3)
    graph.save(tmp_path / "ckpt")
    other = Graph(Regressor())
    other.set_optimizer("adamw", lr=1e-2)
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(optiplug.errors.CheckpointError, match="does not fit this module"):
        other.load(tmp_path / "ckpt")
    assert all(torch.equal(p, q) for p, q in zip(other.parameters(), before, strict=True))
    assert other.training_step == 0 and not other.optimizer.state
    wrong_algorithm = noisy_graph(seed=0)
    wrong_algorithm.set_optimizer("sgd", lr=0.1, momentum=0.9)
    with pytest.raises(optiplug.errors.StateDictError):
        wrong_algorithm.load(tmp_path / "ckpt")
    assert wrong_algorithm.training_step == 0
    (tmp_path / "ckpt" / "tensors.safetensors").write_bytes(b"truncated")
    with pytest.raises(optiplug.errors.CheckpointError):
        noisy_graph(seed=0).load(tmp_path / "ckpt")

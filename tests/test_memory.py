"""optiplug.memory (measured state bytes) and optiplug.estimate_memory / `show --params`."""

from __future__ import annotations

import argparse

import pytest
import torch

import optiplug
from optiplug import estimate_memory, memory
from optiplug.cli import main
from optiplug.cli.listing import parse_count
from optiplug.errors import HyperparameterError


class Net(torch.nn.Module):
    """Embedding, two hidden matrices and a head: 5 tensors, 1,352 parameters."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.hidden = torch.nn.Linear(8, 32, bias=False)
        self.hidden2 = torch.nn.Linear(32, 24, bias=False)
        self.head = torch.nn.Linear(24, 8)
        self.to(dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden2(torch.relu(self.hidden(self.embed(tokens))))))


def stepped(optimizer: torch.optim.Optimizer, net: Net) -> torch.optim.Optimizer:
    """``optimizer`` after one step on ``net`` (so its state exists)."""
    net(torch.arange(16)).float().square().mean().backward()
    optimizer.step()
    return optimizer


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The sum of element_size * numel over every state tensor and tensor hyperparameter."""
    total = sum(
        value.element_size() * value.numel()
        for slots in optimizer.state.values()
        for value in slots.values()
        if torch.is_tensor(value)
    )
    return total + sum(
        value.element_size() * value.numel()
        for group in optimizer.param_groups
        for key, value in group.items()
        if key != "params" and torch.is_tensor(value)
    )


def multi(net: Net) -> torch.optim.Optimizer:
    routes = [
        {"algorithm": "sgd", "match": "hidden*", "lr": 0.1, "momentum": 0.9},
        {"algorithm": "adamw", "match": "*", "lr": 3e-3},
    ]
    return optiplug.create("multi", net.named_parameters(), routes=routes)


BUILDERS = {
    "adamw": lambda net: optiplug.create("adamw", net.named_parameters()),
    "adam-amsgrad": lambda net: optiplug.create("adam", net.named_parameters(), amsgrad=True),
    "sgd-momentum": lambda net: optiplug.create("sgd", net.named_parameters(), momentum=0.9),
    "lion": lambda net: optiplug.create("lion", net.named_parameters()),
    "muon": lambda net: optiplug.create("muon", net.named_parameters(), model=net),
    "multi": multi,
    "torch-adamw": lambda net: torch.optim.AdamW(net.parameters()),
}


@pytest.mark.parametrize("kind", BUILDERS)
def test_report_is_the_sum_of_the_state_tensors(kind: str) -> None:
    algorithm = kind.split("-")[0]
    if algorithm not in ("torch", *optiplug.optimizers()):
        pytest.skip(f"{algorithm} not installed")
    torch.manual_seed(0)
    net = Net()
    assert memory(BUILDERS[kind](net)).total == 0  # no state before the first step
    optimizer = stepped(BUILDERS[kind](net), net)
    report = memory(optimizer)
    assert report.total == state_bytes(optimizer) > 0
    assert sum(report.by_slot.values()) == sum(report.by_group) == report.total
    assert len(report.by_group) == len(optimizer.param_groups)
    assert report.num_parameters == 1352 and report.parameters == 4 * 1352
    slots = {slot for entry in optimizer.state.values() for slot in entry}
    assert set(report.by_slot) == slots


def test_each_slot_and_group_is_reported() -> None:
    net = Net()
    report = memory(stepped(multi(net), net))
    hidden = 4 * (8 * 32 + 32 * 24)  # sgd momentum buffers
    rest = 2 * 4 * (16 * 8 + 24 * 8 + 8) + 4 * 3  # adamw moments and 3 step scalars
    assert report.by_slot == {
        "momentum_buffer": hidden,
        "step": 12,
        "exp_avg": rest // 2 - 6,
        "exp_avg_sq": rest // 2 - 6,
    }
    assert report.by_group == (hidden, rest)


def test_shared_storage_counts_once_and_tensor_hyperparameters_count_under_their_key() -> None:
    net = Net()
    optimizer = torch.optim.AdamW(net.parameters(), lr=torch.tensor(1e-3), foreach=False)
    stepped(optimizer, net)
    plain = memory(optimizer)
    assert plain.by_slot["lr"] == 4 and plain.total == state_bytes(optimizer)
    weight, bias = net.head.weight, net.head.bias
    buffer = torch.zeros(100)
    optimizer.state[weight]["extra"] = buffer
    optimizer.state[bias]["extra"] = buffer  # the same tensor twice
    optimizer.state[bias]["view"] = buffer[10:20]  # a view of it
    optimizer.state[weight]["alias"] = weight.detach()  # the parameter itself
    report = memory(optimizer)
    assert report.total == plain.total + 400
    assert report.by_slot["extra"] == 400 and report.by_slot["view"] == report.by_slot["alias"] == 0


def test_memory_refuses_what_is_not_an_optimizer() -> None:
    with pytest.raises(TypeError, match="needs a torch optimizer"):
        memory(object())


def tensors_of(net: Net) -> tuple[int, int]:
    return sum(p.numel() for p in net.parameters()), len(list(net.parameters()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adamw_estimate_is_two_moments_plus_step_scalars_and_matches_a_real_one(
    dtype: torch.dtype,
) -> None:
    net = Net(dtype)
    n, tensors = tensors_of(net)
    size = torch.finfo(dtype).bits // 8
    exact = estimate_memory("adamw", n, dtype=str(dtype), num_tensors=tensors)
    assert exact.total == 2 * size * n + 4 * tensors  # step: one float32 scalar per tensor
    assert exact.by_slot == {"step": 4 * tensors, "exp_avg": size * n, "exp_avg_sq": size * n}
    real = memory(stepped(optiplug.create("adamw", net.named_parameters()), net))
    assert real.total == exact.total and real.parameters == exact.parameters
    assumed = estimate_memory("adamw", n, dtype=str(dtype))  # one tensor per 1e6 parameters
    assert assumed.num_tensors == 1
    assert abs(assumed.total - real.total) <= 4 * tensors  # within the scalar term


def test_estimate_follows_conditions_and_scales() -> None:
    n = 7e9
    assert estimate_memory("adamw", n).total == 8 * 7 * 10**9 + 4 * 7000
    assert "max_exp_avg_sq: amsgrad is False" in estimate_memory("adam", n).omitted
    assert estimate_memory("adam", n, amsgrad=True).by_slot["max_exp_avg_sq"] == 4 * 7 * 10**9
    assert estimate_memory("sgd", n).total == 0
    assert estimate_memory("sgd", n, momentum=0.9, dtype="bf16").total == 2 * 7 * 10**9
    assert estimate_memory("sgd", 10, num_tensors=3).num_tensors == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "fp8"}, "dtype"),
        ({"amsgrd": True}, "amsgrd"),
        ({"num_tensors": -1}, "num_tensors"),
    ],
)
def test_estimate_errors_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(HyperparameterError, match=message):
        estimate_memory("adam", 1000, **kwargs)
    with pytest.raises(HyperparameterError, match="num_parameters"):
        estimate_memory("adam", 1.5)


@pytest.mark.parametrize(
    ("text", "count"),
    [("7B", 7 * 10**9), ("125M", 125 * 10**6), ("1.3b", 13 * 10**8), ("7e9", 7 * 10**9),
     ("350k", 350_000), ("1_000", 1000), ("2T", 2 * 10**12)],
)  # fmt: skip
def test_parse_count(text: str, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["7.5", "1.2345k", "seven", "7X", "-3", ""])
def test_parse_count_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count(text)


def test_show_params_prints_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "adamw", "--params", "7B"]) == 0
    out = capsys.readouterr().out
    assert "state memory for 7,000,000,000 float32 parameters: 56.00 GB (52.15 GiB)" in out
    assert "not counted: max_exp_avg_sq: amsgrad is False" in out
    assert (
        main(["show", "adam", "--params", "1.3b", "--dtype", "bf16", "--param", "amsgrad=true"])
        == 0
    )
    out = capsys.readouterr().out
    assert "1,300,000,000 bfloat16 parameters: 7.80 GB" in out and "max_exp_avg_sq" in out
    assert "not counted" not in out
    assert main(["show", "cosine", "--params", "7B"]) == 2
    assert "cosine is a schedule" in capsys.readouterr().err
    assert main(["show", "adamw", "--params", "7B", "--param", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err


def test_show_without_params_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "adamw"]) == 0
    assert "state memory" not in capsys.readouterr().out


def test_a_tensor_subclass_counts_its_inner_storages_each_once() -> None:
    from torch.testing._internal.two_tensor import TwoTensor as Untyped  # a traceable subclass

    def TwoTensor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        made: torch.Tensor = Untyped(a, b)  # type: ignore[no-untyped-call]
        return made

    param = torch.nn.Parameter(torch.zeros(10))
    optimizer = torch.optim.SGD([param], lr=0.1)
    first, second = torch.zeros(10, dtype=torch.float64), torch.ones(10)
    optimizer.state[param]["pair"] = TwoTensor(first, second.double())
    optimizer.state[param]["again"] = TwoTensor(first, first)  # storages already counted
    nested = TwoTensor(TwoTensor(second, second), TwoTensor(second, second))
    optimizer.state[param]["nested"] = nested  # one float32 storage, four references
    report = optiplug.memory(optimizer)
    # 10 float64 (first) + 10 float64 (second.double()) + 10 float32 (second)
    assert report.by_slot == {"pair": 160, "again": 0, "nested": 40}
    assert report.total == 200


def test_state_kept_under_a_key_that_is_no_parameter_is_counted() -> None:
    # MADGRAD keeps a step counter tensor at optimizer.state["k"], not under a parameter
    param = torch.nn.Parameter(torch.zeros(4, 4))
    optimizer = torch.optim.SGD([param], lr=0.1)
    optimizer.state["k"] = torch.zeros(2, dtype=torch.float32)  # type: ignore[index]
    optimizer.state[param] = {"momentum_buffer": torch.zeros(4, 4)}
    report = optiplug.memory(optimizer)
    assert report.total == 4 * 16 + 4 * 2
    assert report.by_slot["k"] == 8

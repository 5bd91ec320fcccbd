"""Fault campaign, training half: non-finite runs, Graph.load all-or-nothing, train's tracebacks.

Defects 1, 5 and 13 (training part) of the campaign report. Every ``optiplug
train`` run here is tiny (one layer, width 32, 100,000 characters).
"""

from __future__ import annotations

import copy
import json
import math
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import optiplug
from optiplug import Graph, checkpoint
from optiplug.cli import main
from optiplug.errors import CheckpointError, GraphError, OptiplugError
from optiplug_train.model import CharTransformer, generate

TINY = [
    "--layers", "1", "--d-model", "32", "--heads", "2", "--block-size", "32",
    "--batch-size", "8", "--max-chars", "100000", "--sample-chars", "40",
    "--eval-windows", "16", "--impl", "loop", "--threads", "1", "--quiet",
]  # fmt: skip


class Pairs(Dataset[dict[str, torch.Tensor]]):
    """x -> y = 3 sum(x) + 1; the rows listed in ``poisoned`` have a NaN input."""

    def __init__(self, n: int = 32, poisoned: tuple[int, ...] = ()) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True) * 3 + 1
        self.x[list(poisoned)] = math.nan

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


def regression_graph(
    poisoned: tuple[int, ...] = (), seed: int = 0, data: Pairs | None = None
) -> Graph:
    """A small regressor on 8 batches of 4 rows per epoch, unshuffled, adamw + cosine."""
    data = data if data is not None else Pairs(32, poisoned)
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    graph = Graph(module, seed=seed)
    graph.set_optimizer("adamw", lr=1e-2)
    graph.set_scheduler(optiplug.schedule("cosine", total_steps=40, warmup_steps=4))
    graph.set_data_loader(DataLoader(data, batch_size=4), forward_input="x")
    return graph


def run_steps(
    graph: Graph, until: int, on_step: Callable[[Graph], None] | None = None, limit: int = 200
) -> None:
    """Train until ``training_step == until`` (at most ``limit`` batches), calling ``on_step``."""
    batches = 0
    while graph.training_step < until and batches < limit:
        for batch in graph.epoch(graph.data_position[0]):
            batches += 1
            out = graph.forward_batch(batch)
            graph.backward(torch.nn.functional.mse_loss(out, graph.targets(batch)["y"]))
            if graph.step() and on_step is not None:
                on_step(graph)
            if graph.training_step >= until or batches >= limit:
                return


def snapshot(graph: Graph) -> dict[str, Any]:
    """Everything Graph.load may change: tensors, counters, schedule, lrs and every RNG."""
    return {
        "parameters": [p.detach().clone() for p in graph.module.parameters()],
        "optimizer": copy.deepcopy(graph.optimizer.state_dict()),
        "counters": (graph.training_step, graph._micro_step, graph.data_position),
        "lrs": (graph.lr_scale, list(graph.base_lrs), graph.current_lrs(), graph.schedule),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "torch_rng": torch.get_rng_state(),
    }


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Bit-identical tensors and equal everything else."""
    for one, other in zip(before["parameters"], after["parameters"], strict=True):
        assert torch.equal(one, other)
    states = before["optimizer"]["state"], after["optimizer"]["state"]
    assert states[0].keys() == states[1].keys()
    for key, slots in states[0].items():
        for slot, value in slots.items():
            assert torch.equal(value, states[1][key][slot])
    assert before["counters"] == after["counters"] and before["lrs"] == after["lrs"]
    assert before["python_rng"] == after["python_rng"]
    numpy_before, numpy_after = before["numpy_rng"], after["numpy_rng"]
    assert numpy_before[0] == numpy_after[0] and np.array_equal(numpy_before[1], numpy_after[1])
    assert numpy_before[2:] == numpy_after[2:]
    assert torch.equal(before["torch_rng"], after["torch_rng"])


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["train", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    """The single ``optiplug: error:`` line of ``err`` (no traceback, nothing else)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("optiplug: error: "), err
    return lines[0]


# ---------------------------------------------------------------- defect 1
def test_graph_stops_on_a_nan_batch_and_the_last_good_checkpoint_survives(
    tmp_path: Path,
) -> None:
    data = Pairs(32)
    graph = regression_graph(data=data)
    saved = tmp_path / "ckpt"

    def save_every_five(g: Graph) -> None:
        if g.training_step % 5 == 0:
            g.save(saved)

    run_steps(graph, 10, save_every_five)  # epoch 0 (8 batches), then batches 0, 1 of epoch 1
    data.x[8] = math.nan  # batch 2 of epoch 1: step 11
    before = snapshot(graph)
    with pytest.raises(GraphError, match=r"loss is nan at step 11.*nothing was applied"):
        run_steps(graph, 15, save_every_five)
    after = snapshot(graph)
    assert after["counters"][2] == (1, 3)  # the NaN batch was consumed (data position)...
    after["counters"] = (*after["counters"][:2], before["counters"][2])
    assert_same(before, after)  # ...and changed nothing else
    graph.save(saved)  # and a save after the refusal is still a good one
    assert checkpoint.verify(saved).problems == ()
    restored = regression_graph(seed=1)
    restored.load(saved)
    assert restored.training_step == 10
    assert all(torch.isfinite(p).all() for p in restored.parameters())


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_graph_stops_when_a_step_leaves_the_state_nonfinite(tmp_path: Path, policy: str) -> None:
    graph = regression_graph()
    graph.set_nonfinite_policy(policy)
    run_steps(graph, 2)
    graph.save(tmp_path / "ckpt")
    good = checkpoint.verify(tmp_path / "ckpt").checkpoint_id
    graph.set_optimizer("sgd", lr=1e30)
    for p in graph.parameters():
        p.grad = torch.full_like(p, 1e30)  # finite gradients, an update that overflows
    assert graph.step()  # applied: the parameters are not screened after every step...
    batch = next(iter(graph.epoch(0)))
    loss = torch.nn.functional.mse_loss(graph.forward_batch(batch), graph.targets(batch)["y"])
    with pytest.raises(GraphError, match=r"not finite after step 3: parameter '0\.weight'"):
        graph.backward(loss)  # ...but the next loss shows them, and is reported as such
    with pytest.raises(GraphError, match=r"refusing to save a non-finite state.*untouched"):
        graph.save(tmp_path / "ckpt")
    assert checkpoint.verify(tmp_path / "ckpt").checkpoint_id == good


def test_graph_stops_on_nonfinite_gradients_before_stepping() -> None:
    graph = regression_graph()
    before = snapshot(graph)
    for p in graph.parameters():
        p.grad = torch.full_like(p, math.inf)
    with pytest.raises(GraphError, match=r"gradient of parameter '0\.weight' is not finite"):
        graph.step()
    assert_same(before, snapshot(graph))
    assert all(p.grad is None for p in graph.parameters())


def test_with_clipping_its_norm_stops_nonfinite_gradients_before_stepping() -> None:
    graph = regression_graph()
    graph.set_grad_clip(1.0)
    before = snapshot(graph)
    for p in graph.parameters():
        p.grad = torch.full_like(p, math.nan)
    with pytest.raises(GraphError, match=r"gradient of parameter '0\.weight' is not finite"):
        graph.step()
    assert_same(before, snapshot(graph))
    assert graph.last_grad_norm is None and all(p.grad is None for p in graph.parameters())


def test_finite_gradients_whose_clipping_norm_overflows_still_step() -> None:
    graph = regression_graph()
    graph.set_grad_clip(1.0)
    for p in graph.parameters():
        p.grad = torch.full_like(p, 1e30)  # finite, but their squares overflow float32
    assert graph.step() and graph.training_step == 1
    assert graph.last_grad_norm == math.inf
    assert all(torch.isfinite(p).all() for p in graph.parameters())


def test_skip_policy_skips_nonfinite_batches_and_keeps_training() -> None:
    graph = regression_graph(poisoned=(8,))
    graph.set_nonfinite_policy("skip")
    run_steps(graph, 20)
    assert graph.training_step == 20 and graph.skipped_steps == 3  # batch 2 of epochs 0, 1, 2
    assert all(torch.isfinite(p).all() for p in graph.parameters())
    with pytest.raises(optiplug.errors.HyperparameterError, match="'stop' or 'skip'"):
        graph.set_nonfinite_policy("ignore")


def test_skip_policy_gives_up_after_too_many_skips_in_a_row() -> None:
    graph = regression_graph(poisoned=tuple(range(32)))  # every batch is NaN
    graph.set_nonfinite_policy("skip", max_consecutive_skips=5)
    with pytest.raises(GraphError, match="5 steps in a row were skipped"):
        run_steps(graph, 3)
    assert graph.training_step == 0


def test_train_cli_stops_a_diverging_run_and_resume_uses_the_last_good_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run"
    args = ["--optimizer", "sgd", "--lr", "30", "--steps", "40", "--save-every", "2"]
    code, _, err = run_cli(capsys, *TINY, *args, "--save", str(saved))
    assert code == 2
    line = one_error_line(err)
    assert "training stopped: Graph.backward: the loss is nan at step 6" in line
    assert f"the last good checkpoint, step 4, is in {saved}" in line
    assert checkpoint.verify(saved / "checkpoint").problems == ()
    assert json.loads((saved / "train.json").read_text())["step"] == 4
    resume = ["--resume", str(saved), "--stop-at", "5", "--sample-chars", "0", "--quiet"]
    code, out, err = run_cli(capsys, *resume)
    assert code == 0, err
    assert "to step 5 (resumed at step 4)" in out


def test_train_cli_huge_lr_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--optimizer", "adamw", "--lr", "1e30", "--steps", "40", "--save-every", "10"]
    code, out, err = run_cli(capsys, *TINY, *args, "--save", str(tmp_path / "run"))
    assert code == 2 and "sample (" not in out
    assert "nothing was saved" in one_error_line(err)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- buffers
def batchnorm_graph(accumulate: int = 1, seed: int = 0) -> Graph:
    """Linear then BatchNorm1d (running statistics updated by every training forward), adamw."""
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    graph = Graph(module, accumulate=accumulate)
    graph.set_optimizer("adamw", lr=1e-2)
    return graph


def batchnorm_step(graph: Graph, x: torch.Tensor) -> bool:
    """One micro-batch through the module in training mode, its loss, backward and step."""
    graph.backward(graph.model(x).pow(2).mean())
    return graph.step()


def buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.named_buffers()}


def assert_same_buffers(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> None:
    assert one.keys() == other.keys()
    for name, value in one.items():
        assert value.dtype == other[name].dtype and torch.equal(value, other[name]), name


GOOD = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
POISONED = GOOD.clone().index_fill_(0, torch.tensor([3]), math.nan)


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_nonfinite_batch_leaves_the_running_statistics_as_they_were(
    tmp_path: Path, policy: str, accumulate: int
) -> None:
    """A failed or skipped step puts back the buffers its forward passes changed."""
    graph = batchnorm_graph(accumulate)
    graph.set_nonfinite_policy(policy)
    for _ in range(accumulate):
        batchnorm_step(graph, GOOD)
    graph.save(tmp_path / "ckpt")
    before, kept = buffers(graph.module), snapshot(graph)
    if accumulate == 2:
        assert not batchnorm_step(graph, GOOD)  # a good micro-batch, then a NaN one
    if policy == "stop":
        with pytest.raises(GraphError, match="nothing was applied"):
            batchnorm_step(graph, POISONED)
    else:
        assert not batchnorm_step(graph, POISONED) and graph.skipped_steps == 1
    assert_same_buffers(before, buffers(graph.module))
    after = snapshot(graph)
    if policy == "skip":  # a skipped accumulation still counts its micro-batches
        assert after["counters"][1] == kept["counters"][1] + accumulate
        after["counters"] = kept["counters"]
    assert_same(kept, after)
    graph.save(tmp_path / "ckpt")
    restored = batchnorm_graph(accumulate, seed=1)
    restored.load(tmp_path / "ckpt")
    assert_same_buffers(before, buffers(restored.module))
    restored.module.eval()
    assert torch.isfinite(restored.module(GOOD)).all()


def test_save_refuses_buffers_a_forward_made_nonfinite_and_keeps_the_checkpoint(
    tmp_path: Path,
) -> None:
    """A buffer that training made NaN (here by a forward outside any step) is not saved."""
    graph = batchnorm_graph()
    batchnorm_step(graph, GOOD)
    graph.save(tmp_path / "ckpt")
    good = checkpoint.verify(tmp_path / "ckpt").checkpoint_id
    with torch.no_grad():
        graph.model(POISONED)  # updates the running statistics, no step to undo it
    with pytest.raises(GraphError, match=r"buffer '1\.running_mean' holds NaN or inf.*untouched"):
        graph.save(tmp_path / "ckpt")
    assert checkpoint.verify(tmp_path / "ckpt").checkpoint_id == good


def test_load_refuses_nonfinite_buffers_before_changing_anything(tmp_path: Path) -> None:
    """A checkpoint whose running statistics hold NaN (as older saves wrote) is refused."""
    donor = batchnorm_graph()
    batchnorm_step(donor, GOOD)
    donor.save(tmp_path / "good")
    stored = json.loads((tmp_path / "good" / "metadata.json").read_text())["extra"]["graph"]
    tensors = {f"model/{k}": v for k, v in donor.module.state_dict().items()}
    tensors["model/1.running_mean"] = torch.full((4,), math.nan)
    tensors["rng/torch_cpu"] = torch.get_rng_state()
    checkpoint.save(tmp_path / "bad", donor.optimizer, tensors=tensors, graph=stored)
    graph = batchnorm_graph(seed=2)
    batchnorm_step(graph, GOOD)
    before, kept = buffers(graph.module), snapshot(graph)
    with pytest.raises(
        CheckpointError, match=r"NaN or inf in 1\.running_mean.*nothing was changed"
    ):
        graph.load(tmp_path / "bad")
    assert_same_buffers(before, buffers(graph.module))
    assert_same(kept, snapshot(graph))


class Masked(torch.nn.Module):
    """A linear layer behind a causal mask buffer that holds -inf from construction."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("mask", torch.full((4, 4), -math.inf).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.linear(x).unsqueeze(-1) + self.mask
        return torch.softmax(scores, dim=-1).sum(dim=-1)


def test_a_buffer_that_holds_inf_from_construction_saves_and_loads(tmp_path: Path) -> None:
    """Only what training made non-finite is refused: a -inf mask buffer round-trips."""
    torch.manual_seed(0)
    graph = Graph(Masked())
    graph.set_optimizer("adamw", lr=1e-2)
    graph.backward(graph.model(GOOD).pow(2).mean())
    assert graph.step()
    graph.save(tmp_path / "ckpt")
    torch.manual_seed(1)
    restored = Graph(Masked())
    restored.set_optimizer("adamw", lr=1e-2)
    restored.load(tmp_path / "ckpt")
    assert_same_buffers(buffers(graph.module), buffers(restored.module))
    assert restored.training_step == 1


# ---------------------------------------------------------------- defect 5
def _craft(
    source: Path, target: Path, edit: Callable[[dict[str, Any], dict[str, Any]], None]
) -> None:
    """Re-save ``source``'s Graph checkpoint through the public API, after ``edit(record, tensors)``."""
    metadata = json.loads((source / "metadata.json").read_text())
    record = copy.deepcopy(metadata["extra"]["graph"])
    graph = regression_graph()
    graph.load(source)
    tensors = {f"model/{k}": v for k, v in graph.module.state_dict().items()}
    tensors["rng/torch_cpu"] = torch.get_rng_state()
    edit(record, tensors)
    checkpoint.save(target, graph.optimizer, tensors=tensors, graph=record)


def _set(key: str, value: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    return lambda record, _tensors: record.__setitem__(key, value)


CRAFTED = {
    "python_rng": _set("python_rng", [3, [1, 2, 3], None]),
    "numpy_rng": _set("numpy_rng", ["MT19937", [1, 2], 0, 0, 0.0]),
    "training_step": _set("training_step", "eleven"),
    "negative training_step": _set("training_step", -1),
    "data_position": _set("data_position", [1]),
    "lr_scale": _set("lr_scale", math.inf),
    "base_lrs": _set("base_lrs", [1e-2, 1e-2]),
    "schedule": _set("schedule", {"name": "nosuch"}),
    "missing rng tensor": lambda _record, tensors: tensors.pop("rng/torch_cpu"),
    "torch rng tensor": lambda _record, tensors: tensors.__setitem__(
        "rng/torch_cpu", torch.zeros(3, dtype=torch.uint8)
    ),
}


@pytest.mark.parametrize("fault", list(CRAFTED))
def test_load_checks_every_part_before_changing_anything(tmp_path: Path, fault: str) -> None:
    donor = regression_graph(seed=3)
    run_steps(donor, 5)
    donor.save(tmp_path / "good")
    _craft(tmp_path / "good", tmp_path / "bad", CRAFTED[fault])
    graph = regression_graph()
    run_steps(graph, 2)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    before = snapshot(graph)
    with pytest.raises(CheckpointError, match=r"graph record|rng/torch_cpu"):
        graph.load(tmp_path / "bad")
    assert_same(before, snapshot(graph))


# ---------------------------------------------------------------- defect 13
def test_sampling_refuses_nonfinite_probabilities() -> None:
    torch.manual_seed(0)
    model = CharTransformer(5, block_size=4, n_layer=1, d_model=8, n_head=2)
    with torch.no_grad():
        model.head.bias.fill_(math.nan)
    with pytest.raises(OptiplugError, match=r"cannot sample.*not finite"):
        generate(model, [0, 1], 3)


def test_train_sgd_huge_lr_stops_before_sampling(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *TINY, "--optimizer", "sgd", "--lr", "1e4", "--steps", "40")
    assert code == 2 and "sample (" not in out
    assert "training stopped: Graph.backward: the loss is nan" in one_error_line(err)


def test_resume_with_a_train_json_without_options_names_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run"
    assert run_cli(capsys, *TINY, "--steps", "2", "--save", str(saved))[0] == 0
    payload = json.loads((saved / "train.json").read_text())
    del payload["options"]
    (saved / "train.json").write_text(json.dumps(payload))
    code, _, err = run_cli(capsys, "--resume", str(saved))
    assert code == 2
    line = one_error_line(err)
    assert str(saved / "train.json") in line and "'options'" in line


_FULL_DISK = """
import resource, signal, sys
from optiplug.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
sys.exit(main(["train", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_train_save_on_a_full_disk_cleans_up_and_says_so(tmp_path: Path) -> None:
    saved = tmp_path / "deep" / "run"
    args = [*TINY, "--steps", "2", "--sample-chars", "0", "--save", str(saved)]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FULL_DISK), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert "no space left" in line and str(saved) in line
    assert list(tmp_path.iterdir()) == []  # neither run/ nor deep/ is left behind


def test_a_nonfinite_optimizer_state_is_refused_where_it_matters_at_save(tmp_path: Path) -> None:
    # the state is not screened after every step (the parameters are): a save checks it
    graph = regression_graph()
    run_steps(graph, 2)
    state = next(iter(graph.optimizer.state.values()))  # type: ignore[union-attr]
    slot = next(k for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0)
    state[slot].fill_(math.nan)
    with pytest.raises(GraphError, match=r"refusing to save a non-finite state"):
        graph.save(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()

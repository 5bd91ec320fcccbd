"""How much each way of storing Muon's momentum changes its orthogonalized update.

Trains ``optiplug train``'s default job (its model, corpus, schedule and
seed) with fp32 Muon. Alongside the optimizer, every Muon matrix keeps one
shadow momentum per storage: the shadow follows the same gradients
(``m = beta * m + (1 - beta) * g``) but is written back through
:meth:`optiplug.base.QuantizedState.store` after each step, as a
low-precision Muon writes its state. After each step, for the matrices together:

- ``momentum``: ``||m_shadow - m|| / ||m||`` (Frobenius), the error the
  storage has accumulated along fp32's trajectory;
- ``update``: ``||O(u_shadow) - O(u)|| / ||O(u)||``, where ``u`` is the
  Nesterov direction ``g + beta * (m - g)`` and ``O`` is Muon's quintic
  Newton-Schulz iteration (``optiplug_muon.orthogonalize``: Jordan's
  coefficients, 5 steps) in float64, so the figure is the storage's alone,
  not the iteration's dtype.

Two reference lines: ``bf16 input`` (the exact ``u`` rounded to bfloat16 once
before ``O``, which is what Newton-Schulz in bf16 starts from) and ``step to
step`` (``O`` against the previous step's ``O``: how far the update moves by
itself). The table gives the mean over each window of steps.

Usage: ``python benchmarks/bench_muon_state_error.py [--steps 500] [--seed 0]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
from collections.abc import Generator, Mapping
from typing import Any

import torch

import optiplug
from optiplug.base import LOW_RANK, QuantizedState
from optiplug_muon import orthogonalize
from optiplug_train.config import TrainConfig
from optiplug_train.data import load_corpus
from optiplug_train.loop import build_graph
from optiplug_train.model import next_token_loss

STORAGES: dict[str, tuple[str, bool, int]] = {
    "int8 linear + rank-4 factors (shipped)": ("int8", True, LOW_RANK),
    "int8 linear": ("int8", True, 0),
    "int8 dynamic": ("int8", False, 0),
    "int4 linear + rank-4 factors (shipped)": ("int4", True, LOW_RANK),
    "int4 linear": ("int4", True, 0),
    "bf16 (stochastic rounding)": ("bf16", False, 0),
}
"""Each storage: its precision, whether it takes the linear table, and its factors' rank."""


def orthogonalized(matrix: torch.Tensor) -> torch.Tensor:
    """Muon's quintic Newton-Schulz (5 steps) of ``matrix``, plainly iterated in float64."""
    result: torch.Tensor = orthogonalize(
        matrix, steps=5, coefficients="quintic", dtype=torch.float64, method="standard"
    )
    return result


class Shadows:
    """Shadow momenta of every Muon matrix, per storage, and the errors per step."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.grads: dict[torch.Tensor, tuple[torch.Tensor, float]] = {}
        self.momenta: dict[tuple[str, torch.Tensor], QuantizedState] = {}
        self.previous: dict[torch.Tensor, torch.Tensor] = {}
        self.rows: list[dict[str, float]] = []
        optimizer.register_step_pre_hook(self._before)
        optimizer.register_step_post_hook(self._after)

    def _before(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.grads = {
            param: (param.grad.detach().clone(), group["momentum"])
            for group in optimizer.param_groups
            if group["use_muon"]
            for param in group["params"]
            if param.grad is not None
        }

    def _after(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * 4)
        for param, (grad, beta) in self.grads.items():
            exact = optimizer.state[param]["momentum_buffer"]
            direction = grad.lerp(exact, beta)
            update = orthogonalized(direction)
            for name, (precision, linear, rank) in STORAGES.items():
                if (name, param) not in self.momenta:
                    zero = torch.zeros_like(exact)
                    self.momenta[name, param] = QuantizedState.encode(
                        zero, precision, signed=True, linear=linear, rank=rank
                    )
                stored = self.momenta[name, param]
                momentum = stored.dequantize().lerp(grad, 1 - beta)
                found = orthogonalized(grad.lerp(momentum, beta))
                _add(sums[name], found, update, exact, momentum - exact)
                stored.store(momentum)  # as a low-precision Muon writes it back
            rounded = direction.bfloat16().float()
            _add(sums["bf16 input"], orthogonalized(rounded), update, exact)
            if param in self.previous:
                _add(sums["step to step"], self.previous[param], update, exact)
            self.previous[param] = update
        self.rows.append({name: (s[2] / s[3]) ** 0.5 for name, s in sums.items()})
        for name in STORAGES:
            self.rows[-1][name + " momentum"] = (sums[name][0] / sums[name][1]) ** 0.5


def _add(
    sums: list[float],
    found: torch.Tensor,
    update: torch.Tensor,
    exact: torch.Tensor,
    momentum_error: torch.Tensor | None = None,
) -> None:
    """Add squared norms to ``sums``: momentum error, momentum, update error, update."""
    if momentum_error is not None:
        sums[0] += momentum_error.norm().item() ** 2
    sums[1] += exact.norm().item() ** 2
    sums[2] += (found - update).norm().item() ** 2
    sums[3] += update.norm().item() ** 2


def _batches(graph: optiplug.Graph, epoch: int) -> Generator[Mapping[str, Any], None, None]:
    """``graph.epoch(epoch)`` as a generator, so closing it closes the Graph's epoch."""
    yield from graph.epoch(epoch)


def train(config: TrainConfig) -> Shadows:
    """The default job with fp32 Muon, its shadows recording every step."""
    corpus = load_corpus(config.data, config.max_chars)
    graph, _ = build_graph(config, corpus, optiplug.default_registry())
    if graph.optimizer is None:
        raise RuntimeError("the Graph has no optimizer")
    shadows = Shadows(graph.optimizer)
    epoch = 0
    while graph.training_step < config.steps:
        with contextlib.closing(_batches(graph, epoch)) as batches:
            for batch in batches:
                loss = next_token_loss(graph.forward_batch(batch), graph.targets(batch)["targets"])
                graph.backward(loss)
                graph.step()
                if graph.training_step >= config.steps:
                    break
        epoch += 1
    return shadows


def table(rows: list[dict[str, float]], windows: int) -> str:
    """Mean of each figure over ``windows`` equal windows of steps (markdown)."""
    size = len(rows) // windows
    spans = [(i * size, (i + 1) * size) for i in range(windows)]
    header = "| storage | " + " | ".join(f"steps {a + 1}-{b}" for a, b in spans) + " |"
    lines = [header, "|---" * (windows + 1) + "|"]
    names = [f"{n} momentum" for n in STORAGES] + [*STORAGES, "bf16 input", "step to step"]
    for name in names:
        means = [sum(r.get(name, 0.0) for r in rows[a:b]) / (b - a) for a, b in spans]
        label = name if name.endswith("momentum") else f"{name} update"
        lines.append(f"| {label} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    config = TrainConfig(optimizer="muon", steps=args.steps, seed=args.seed)
    shadows = train(config)
    print(f"muon, default job, seed {args.seed}, {args.steps} steps, torch {torch.__version__}")
    print(table(shadows.rows, args.windows))


if __name__ == "__main__":
    main()

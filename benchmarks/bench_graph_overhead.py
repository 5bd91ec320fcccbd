"""Per-step cost of ``optiplug.Graph`` against the same training loop written by hand.

Both loops train the ``optiplug train`` model (a small character transformer)
on the same batches of standard-library source, with the same optimizer
(optiplug's ``adamw``, one forced implementation) and the same cosine
schedule; the hand-written loop applies the schedule to each param group
itself. A step is: next batch, forward, loss, backward, lr update, optimizer
step, zero the gradients. The Graph loop does the same through
``graph.epoch``, ``forward_batch``, ``targets``, ``backward`` and ``step``.

The loops run in interleaved rounds (the order alternating each round), so
machine noise hits both alike. The headline is the median over rounds of the
paired ratio (the Graph's round time over the hand-written loop's in the same
round): noise that drifts more slowly than a round cancels in it, which a
ratio of two medians taken over minutes does not. The report also gives each
loop's median step time and their ratio. At the end the two models'
parameters are compared: equal parameters show the two loops did the same
computation.

Usage: ``python benchmarks/bench_graph_overhead.py [--rounds 300] [--steps-per-round 1] [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

import optiplug
from optiplug_train.data import Windows, load_corpus
from optiplug_train.model import CharTransformer, next_token_loss

HPARAMS = {"lr": 1e-3, "weight_decay": 0.01}


def endless(batches: Callable[[int], Iterable[Any]]) -> Iterator[Any]:
    """Batches of epoch 0, 1, 2... without end."""
    epoch = 0
    while True:
        yield from batches(epoch)
        epoch += 1


def make_model(vocab_size: int, args: argparse.Namespace) -> CharTransformer:
    """The model, with weights fixed by seed 0."""
    torch.manual_seed(0)
    return CharTransformer(
        vocab_size,
        block_size=args.block_size,
        n_layer=args.layers,
        d_model=args.d_model,
        n_head=4,
    )


def graph_loop(
    model: torch.nn.Module, loader: Any, schedule: Any, impl: str
) -> tuple[Callable[[], None], torch.nn.Module]:
    """A step function training ``model`` through ``optiplug.Graph``."""
    graph = optiplug.Graph(model)
    graph.set_scheduler(schedule)
    graph.set_optimizer(optiplug.factory("adamw", impl=impl, **HPARAMS))
    graph.set_data_loader(loader, forward_input="tokens")
    batches = endless(graph.epoch)

    def step() -> None:
        batch = next(batches)
        loss = next_token_loss(graph.forward_batch(batch), graph.targets(batch)["targets"])
        graph.backward(loss)
        graph.step()

    return step, graph.module


def hand_loop(
    model: torch.nn.Module, loader: Any, schedule: Any, impl: str
) -> tuple[Callable[[], None], torch.nn.Module]:
    """A step function training ``model`` with a plain torch loop (schedule applied by hand)."""
    optimizer = optiplug.create("adamw", model.named_parameters(), impl=impl, **HPARAMS)
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    batches = endless(lambda _epoch: loader)
    taken = 0

    def step() -> None:
        nonlocal taken
        for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = base * schedule(taken)
        batch = next(batches)
        loss = next_token_loss(model(batch["tokens"]), batch["targets"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        taken += 1

    return step, model


def timed(step: Callable[[], None], count: int) -> list[float]:
    """Seconds of each of ``count`` calls of ``step``."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return times


def measure(
    loops: dict[str, Callable[[], None]], rounds: int, per_round: int, warmup: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Per-step times of each loop, run in interleaved rounds after ``warmup`` steps each.

    Returns:
        The step times by loop, and each round's paired ratio (the first
        loop's round time over the second's).
    """
    for step in loops.values():
        timed(step, warmup)
    found: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    paired = []
    for index in range(rounds):
        spent = {}
        for name in names if index % 2 == 0 else reversed(names):
            times = timed(loops[name], per_round)
            found[name] += times
            spent[name] = sum(times)
        paired.append(spent[names[0]] / spent[names[1]])
    return found, paired


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--steps-per-round", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--impl", default="fused", help="adamw implementation for both loops")
    parser.add_argument("--quick", action="store_true", help="40 rounds of 1 step")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps_per_round, args.warmup = 40, 1, 3
    return args


def main() -> None:
    args = parse_args()
    corpus = load_corpus(None, 300_000)
    dataset = Windows(corpus.train, args.block_size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, drop_last=True)
    total = args.warmup + args.rounds * args.steps_per_round
    schedule = optiplug.schedule("cosine", total_steps=total, warmup_steps=total // 20)
    loops, models = {}, {}
    for name, build in (("graph", graph_loop), ("hand", hand_loop)):
        loops[name], models[name] = build(
            make_model(len(corpus.vocab), args), loader, schedule, args.impl
        )
    times, paired = measure(loops, args.rounds, args.steps_per_round, args.warmup)
    graph, hand = (statistics.median(times[name]) for name in ("graph", "hand"))
    same = all(
        torch.equal(p, q)
        for p, q in zip(models["graph"].parameters(), models["hand"].parameters(), strict=True)
    )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, adamw impl={args.impl}")
    print(f"{len(times['graph'])} timed steps each, interleaved in {args.rounds} rounds")
    print(f"hand-written loop  median {hand * 1e3:8.3f} ms/step")
    print(f"optiplug.Graph     median {graph * 1e3:8.3f} ms/step")
    print(f"ratio of the medians: {graph / hand:.4f} ({100 * (graph / hand - 1):+.2f}%)")
    ratio = statistics.median(paired)
    print(f"median paired ratio Graph / hand-written: {ratio:.4f} ({100 * (ratio - 1):+.2f}%)")
    print(f"parameters identical after training: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()

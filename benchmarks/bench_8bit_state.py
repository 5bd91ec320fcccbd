"""8-bit AdamW state on the ``optiplug train`` job: optiplug's int8, torchao's and bitsandbytes'.

Four runs of the same ``optiplug train`` job (the character-level language
model of ``optiplug_train``, same seed, data and schedule): optiplug's
``adamw`` in fp32 (the reference), optiplug's ``adamw`` with
``state_precision="int8"``, ``torchao:adamw8bit`` (through the torchao
bridge) and ``bitsandbytes:adamw8bit`` (through the bitsandbytes bridge).
For each the report gives:

* the bytes of optimizer state per model parameter, as ``optiplug.memory``
  measures them on the run's model after one step;
* the median training-step time (forward, backward and optimizer step),
  from the training seconds between evaluation points, divided by the
  reference's median measured in the same invocation (the job times its
  training apart from its evaluations);
* the validation loss at the end.

The runs go one after the other; the reference runs again last, so a
shared machine's drift between them shows. Implementation choice by
measurement is off (``OPTIPLUG_AUTOTUNE=0``, set here unless given): with it
on, ``adamw`` times its implementations in a background thread during the
first steps, which competes with the run for the cores while the bridges'
single implementations are never timed.

Usage: ``python benchmarks/bench_8bit_state.py [--steps 200] [--threads 2]``
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence
from typing import Any

import attrs
import torch

import optiplug
from optiplug_train.config import TrainConfig
from optiplug_train.data import load_corpus
from optiplug_train.loop import seeded_model, train

CONTENDERS: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw fp32 (reference)": ("adamw", {}),
    "adamw int8 (optiplug)": ("adamw", {"state_precision": "int8"}),
    "torchao:adamw8bit": ("torchao:adamw8bit", {}),
    "bitsandbytes:adamw8bit": ("bitsandbytes:adamw8bit", {}),
    "adamw fp32 (reference, again)": ("adamw", {}),
}
"""Label -> (optimizer, its extra hyperparameters)."""


def state_bytes_per_parameter(
    config: TrainConfig, corpus: Any, name: str, extra: dict[str, Any]
) -> float:
    """Bytes of optimizer state per parameter on the run's model, after one step."""
    model = seeded_model(config, corpus)
    optimizer = optiplug.create(name, model.parameters(), lr=1e-3, **extra)
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    optimizer.step()
    report = optiplug.memory(optimizer)
    return report.total / report.num_parameters


def step_seconds(val_seconds: Sequence[float], val_curve: Sequence[tuple[int, float]]) -> float:
    """Median seconds per training step over the intervals between evaluation points."""
    steps = [step for step, _ in val_curve]
    per_step = [
        (val_seconds[i] - val_seconds[i - 1]) / (steps[i] - steps[i - 1])
        for i in range(1, len(steps))
        if steps[i] > steps[i - 1]
    ]
    return statistics.median(per_step)


def main() -> None:
    """Run the four contenders and print the table (markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-chars", type=int, default=400_000)
    args = parser.parse_args()
    os.environ.setdefault("OPTIPLUG_AUTOTUNE", "0")
    base = TrainConfig(
        steps=args.steps,
        eval_every=max(1, args.steps // 10),
        eval_windows=64,
        sample_chars=0,
        max_chars=args.max_chars,
        threads=args.threads,
        lr=1e-3,
    )
    corpus = load_corpus(base.data, base.max_chars)
    registry = optiplug.default_registry()
    rows = []
    for label, (name, extra) in CONTENDERS.items():
        config = attrs.evolve(base, optimizer=name, optimizer_params=tuple(extra.items()))
        result = train(config, registry, corpus, log=None, quiet=True)
        assert result is not None
        seconds = step_seconds(result.val_seconds, result.val_curve)
        rows.append(
            (label, state_bytes_per_parameter(config, corpus, name, extra), seconds, result)
        )
    reference = rows[0][2]
    parameters = rows[0][3].parameters
    print(f"model: {parameters} parameters; {args.steps} steps, {args.threads} threads")
    print("| optimizer | state bytes / parameter | median step / fp32 adamw | final val loss |")
    print("|---|---|---|---|")
    for label, per_parameter, seconds, result in rows:
        print(
            f"| {label} | {per_parameter:.3f} | {seconds / reference:.2f} | {result.val_loss:.4f} |"
        )
    print(f"(fp32 adamw median step: {reference * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()

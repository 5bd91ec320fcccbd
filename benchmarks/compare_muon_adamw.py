"""Muon against AdamW on a small character-level transformer, each at its documented defaults.

The corpus is the Python standard library's own source (the ``*.py`` files
directly in ``sysconfig.get_paths()["stdlib"]``, read at run time, in sorted
order); the last 10% of the characters are the validation split. Both runs
start from the same initial weights and see the same batches in the same
order. Muon: ``optiplug.create("muon", model.named_parameters(), model=model)``
(lr 0.02 for the hidden matrices; embeddings, the head and the LayerNorms go
to AdamW with aux_lr 3e-4). AdamW: ``optiplug.create("adamw", ...)`` (lr 1e-3,
weight_decay 0.01). Prints the final train loss (mean of the last 20 steps)
and the validation loss (fixed 16 batches), in nats per character.

    python benchmarks/compare_muon_adamw.py            # 250 steps each (~40 s on 2 idle cores, 2.5-3.5 min on busy ones)
    python benchmarks/compare_muon_adamw.py --quick    # 30 steps each
    python benchmarks/compare_muon_adamw.py --aux-lr 1e-3   # also muon with a larger aux_lr
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import optiplug

CONTEXT = 64
BATCH = 32
WIDTH = 128
LAYERS = 4
HEADS = 4
MAX_CHARS = 1_500_000


def read_corpus(limit: int = MAX_CHARS) -> str:
    """The stdlib's top-level ``*.py`` sources, concatenated in sorted order (up to ``limit``)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= limit:
            break
    return "".join(parts)[:limit]


def encode(text: str) -> tuple[torch.Tensor, int]:
    """Character ids (vocabulary: the characters that occur) and the vocabulary size."""
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long), len(vocab)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class CharTransformer(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def batches(data: torch.Tensor, count: int, seed: int) -> list[torch.Tensor]:
    """``count`` random windows of CONTEXT+1 characters (inputs and shifted targets)."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(data) - CONTEXT - 1, (count, BATCH), generator=generator)
    return [torch.stack([data[s : s + CONTEXT + 1] for s in row.tolist()]) for row in starts]


def loss_of(model: nn.Module, window: torch.Tensor) -> torch.Tensor:
    logits = model(window[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, windows: list[torch.Tensor]) -> float:
    return sum(loss_of(model, w).item() for w in windows) / len(windows)


def train(name: str, hparams: dict, vocab: int, train_windows: list, val_windows: list) -> dict:
    torch.manual_seed(0)  # same initial weights for every run
    model = CharTransformer(vocab)
    extra = {"model": model} if name == "muon" else {}
    optimizer = optiplug.create(name, model.named_parameters(), **extra, **hparams)
    start, losses = time.perf_counter(), []
    for window in train_windows:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, window)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    train_loss = sum(losses[-20:]) / len(losses[-20:])
    return {"train": train_loss, "val": evaluate(model, val_windows), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 steps each")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--aux-lr", type=float, default=None, help="also run muon with this aux_lr")
    args = parser.parse_args()
    steps = 30 if args.quick else args.steps
    data, vocab = encode(read_corpus())
    split = int(0.9 * len(data))
    train_windows = batches(data[:split], steps, seed=1)
    val_windows = batches(data[split:], 16, seed=2)
    print(
        f"corpus: {len(data):,} characters of stdlib source, vocabulary {vocab}; "
        f"model: {LAYERS} layers, width {WIDTH}, context {CONTEXT}; {steps} steps of "
        f"{BATCH}x{CONTEXT} characters; {torch.get_num_threads()} threads"
    )
    runs = {"muon": {}, "adamw": {}}
    if args.aux_lr is not None:
        runs[f"muon, aux_lr={args.aux_lr:g}"] = {"aux_lr": args.aux_lr}
    print(f"{'optimizer':<24}{'train loss':>11}{'val loss':>10}{'seconds':>9}")
    for label, hparams in runs.items():
        result = train(label.split(",")[0], hparams, vocab, train_windows, val_windows)
        assert math.isfinite(result["val"])
        print(f"{label:<24}{result['train']:>11.3f}{result['val']:>10.3f}{result['seconds']:>9.1f}")
    print(f"(uniform guess: {math.log(vocab):.3f} nats per character)")


if __name__ == "__main__":
    main()

"""Parameters, algorithms and a deterministic training loop shared by the state and checkpoint tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as to_safetensors

SHAPES = {"w": (3, 2), "b": (3,), "v": (2,)}
ALGORITHMS = [
    ("sgd", {"lr": 0.05, "momentum": 0.9}),
    ("adam", {"lr": 0.01, "amsgrad": True}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1}),
]
IMPLEMENTATIONS = ["loop", "foreach", "fused"]

Named = list[tuple[str, torch.nn.Parameter]]


def named_params(order: tuple[str, ...] = ("w", "b", "v"), seed: int = 0) -> Named:
    """Parameters w, b, v (values fixed by ``seed``), in ``order``."""
    generator = torch.Generator().manual_seed(seed)
    values = {n: torch.randn(SHAPES[n], generator=generator) for n in sorted(SHAPES)}
    return [(n, torch.nn.Parameter(values[n].clone())) for n in order]


def clone_named(named: Named, order: tuple[str, ...] | None = None) -> Named:
    """Fresh copies of ``named``, optionally reordered."""
    found = dict(named)
    names = order or tuple(n for n, _ in named)
    return [(n, torch.nn.Parameter(found[n].detach().clone())) for n in names]


def train(optimizer: torch.optim.Optimizer, named: Named, start: int, stop: int) -> None:
    """Steps ``start..stop-1``; each step's gradients depend only on (step, name, value)."""
    for step in range(start, stop):
        generator = torch.Generator().manual_seed(1000 + step)
        noise = {n: torch.randn(SHAPES[n], generator=generator) for n in sorted(SHAPES)}
        for name, param in named:
            param.grad = 0.3 * param.detach() + noise[name]
        optimizer.step()


def forge_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Replace a checkpoint's tensor file consistently (hashes and sizes updated), as an
    attacker could: only its own checks can refuse what it holds then."""
    data = to_safetensors(tensors, metadata=safe_open_metadata(path))
    (path / "tensors.safetensors").write_bytes(data)
    metadata = json.loads((path / "metadata.json").read_text())
    metadata["tensors"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    text = json.dumps(metadata).encode()
    (path / "metadata.json").write_bytes(text)
    marker = json.loads((path / "COMMITTED").read_text())
    marker["metadata_sha256"] = hashlib.sha256(text).hexdigest()
    (path / "COMMITTED").write_text(json.dumps(marker))


def safe_open_metadata(path: Path) -> dict[str, str]:
    """The safetensors header metadata of a checkpoint's tensor file."""
    with safe_open(str(path / "tensors.safetensors"), framework="pt") as stored:
        return dict(stored.metadata() or {})


def stored_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's tensor file, by name."""
    return load_safetensors((path / "tensors.safetensors").read_bytes())

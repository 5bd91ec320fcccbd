"""The model: a small GPT-style character transformer, its loss, evaluation and sampling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from optiplug.errors import OptiplugError

__all__ = ["CharTransformer", "generate", "mean_loss", "next_token_loss"]

_EVAL_BATCH = 128


class _Block(torch.nn.Module):
    """Pre-LayerNorm causal self-attention, then a 4x GELU MLP, each with a residual."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc = torch.nn.Linear(d_model, 4 * d_model)
        self.out = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        heads = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, d // self.n_head)
        q, k, v = heads.permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        projected: torch.Tensor = self.proj(attended.transpose(1, 2).reshape(b, t, d))
        x = x + projected
        mlp: torch.Tensor = self.out(F.gelu(self.fc(self.ln2(x))))
        return x + mlp


class CharTransformer(torch.nn.Module):
    """A GPT-style decoder over characters (pre-LayerNorm, learned positions, no dropout).

    Args:
        vocab_size: number of distinct characters.
        block_size: longest context.
        n_layer: transformer blocks.
        d_model: embedding width.
        n_head: attention heads.
    """

    def __init__(
        self, vocab_size: int, *, block_size: int, n_layer: int, d_model: int, n_head: int
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.embed = torch.nn.Embedding(vocab_size, d_model)
        self.position = torch.nn.Embedding(block_size, d_model)
        self.blocks = torch.nn.ModuleList(_Block(d_model, n_head) for _ in range(n_layer))
        self.ln = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, vocab)`` of the next character at every position."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            hidden = block(hidden)
        logits: torch.Tensor = self.head(self.ln(hidden))
        return logits


def _init_weights(module: torch.nn.Module) -> None:
    if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        torch.nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, torch.nn.Linear) and module.bias is not None:
        torch.nn.init.zeros_(module.bias)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Cross-entropy (nats per character) of ``logits`` against ``targets``.

    Args:
        logits: ``(batch, time, vocab)``.
        targets: ``(batch, time)`` token ids.
        **kwargs: passed to ``torch.nn.functional.cross_entropy`` (``reduction``...).

    Returns:
        The loss.
    """
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), **kwargs)


@torch.no_grad()
def mean_loss(module: torch.nn.Module, rows: torch.Tensor, device: torch.device) -> float:
    """Mean next-character loss of ``module`` over windows ``rows`` (nats per character).

    Args:
        module: the (unwrapped) model; put back in its mode afterwards.
        rows: windows of ``block_size + 1`` ids.
        device: where the model is.

    Returns:
        The loss, averaged over every predicted character.
    """
    was_training = module.training
    module.eval()
    total, count = 0.0, 0
    for chunk in torch.split(rows, _EVAL_BATCH):
        chunk = chunk.to(device)
        logits = module(chunk[:, :-1])
        total += float(next_token_loss(logits, chunk[:, 1:], reduction="sum"))
        count += chunk[:, 1:].numel()
    module.train(was_training)
    return total / max(1, count)


@torch.no_grad()
def generate(
    module: CharTransformer,
    prompt: Sequence[int],
    length: int,
    *,
    temperature: float = 0.8,
    seed: int = 0,
) -> list[int]:
    """Continue ``prompt`` by ``length`` sampled characters.

    Args:
        module: the model.
        prompt: token ids to start from (at least one).
        length: characters to add.
        temperature: softmax temperature; 0 picks the most likely character.
        seed: seeds a private generator (the global RNG is not touched).

    Returns:
        The ids generated after the prompt.

    Raises:
        OptiplugError: the model's logits are not finite (its weights hold NaN
            or inf), so there is no distribution to sample from.
    """
    was_training = module.training
    module.eval()
    device = next(module.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(length):
        context = torch.tensor([ids[-module.block_size :]], device=device)
        logits = module(context)[0, -1].float().cpu()
        if not bool(torch.isfinite(logits).all()):
            raise OptiplugError(
                "cannot sample: the model's next-character logits are not finite "
                "(its weights hold NaN or inf)"
            )
        if temperature <= 0:
            ids.append(int(logits.argmax()))
        else:
            probabilities = torch.softmax(logits / temperature, dim=-1)
            ids.append(int(torch.multinomial(probabilities, 1, generator=generator)))
    module.train(was_training)
    return ids[len(prompt) :]

"""The corpus: characters of real text as token ids, split 90/10, cut into windows.

The corpus needs no download: by default it is the running interpreter's own
standard library (the top-level ``*.py`` files of ``sysconfig``'s ``stdlib``
directory, sorted by name, up to a character budget). Characters are the
tokens; the last 10% of the text is the fixed validation split.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import torch

from optiplug.errors import HyperparameterError, OptiplugError

__all__ = [
    "VALIDATION_FRACTION",
    "Corpus",
    "Windows",
    "load_corpus",
    "spread",
    "stdlib_files",
    "unigram_entropy",
    "windows",
]

VALIDATION_FRACTION = 0.1


@attrs.frozen(eq=False)
class Corpus:
    """A character corpus split into training and validation token ids.

    Attributes:
        description: where the text came from, for the report.
        files: how many files were read.
        vocab: the characters, sorted; token ``i`` is ``vocab[i]``.
        train: token ids of the first 90% of the text.
        val: token ids of the last 10%.
    """

    description: str
    files: int
    vocab: str
    train: torch.Tensor
    val: torch.Tensor

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``.

        Args:
            text: characters of the vocabulary.

        Returns:
            One id per character.

        Raises:
            HyperparameterError: a character outside the vocabulary.
        """
        index = {c: i for i, c in enumerate(self.vocab)}
        missing = sorted({c for c in text if c not in index})
        if missing:
            raise HyperparameterError(
                "prompt", text, f"characters not in the corpus: {missing!r}", algorithm="train"
            )
        return [index[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids ``ids``."""
        return "".join(self.vocab[i] for i in ids)


def stdlib_files(max_chars: int) -> list[Path]:
    """The standard library's top-level ``*.py`` files, sorted, until ``max_chars`` bytes.

    Args:
        max_chars: stop once the files read reach this many bytes.

    Returns:
        The files, in name order.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        if total >= max_chars:
            break
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise OptiplugError(f"--data {str(path)!r}: no such file or directory")
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def _read_texts(paths: Sequence[Path], max_chars: int) -> tuple[str, int]:
    parts: list[str] = []
    total = used = 0
    for path in paths:
        if total >= max_chars:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not text
        if "\0" in text or not text:
            continue
        parts.append(text)
        total += len(text)
        used += 1
    return "\n".join(parts)[:max_chars], used


def _read(data: str | os.PathLike[str] | None, max_chars: int) -> tuple[str, int, str]:
    """``(text, files used, description)`` of the corpus ``data`` names."""
    if data is None:
        text, used = _read_texts(stdlib_files(max_chars), max_chars)
        version = ".".join(map(str, sys.version_info[:3]))
        return text, used, f"Python {version} standard library ({sysconfig.get_paths()['stdlib']})"
    text, used = _read_texts(_text_files(Path(data)), max_chars)
    if not text:
        raise OptiplugError(f"--data {str(data)!r}: no UTF-8 text found")
    return text, used, str(data)


def load_corpus(data: str | os.PathLike[str] | None, max_chars: int = 1_500_000) -> Corpus:
    """Read the corpus and split it 90/10 into training and validation ids.

    Args:
        data: a UTF-8 text file or a directory of them (binary files and
            hidden paths are skipped); None = the standard library's sources.
        max_chars: the character budget.

    Returns:
        The :class:`Corpus`.

    Raises:
        OptiplugError: the path does not exist or holds no text.
    """
    text, used, description = _read(data, max_chars)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    points, inverse = np.unique(codes, return_inverse=True)
    ids = torch.from_numpy(inverse.astype(np.int64).reshape(-1))
    split = int(len(ids) * (1 - VALIDATION_FRACTION))
    vocab = "".join(map(chr, points.tolist()))
    return Corpus(description, used, vocab, ids[:split].clone(), ids[split:].clone())


def unigram_entropy(ids: torch.Tensor, vocab_size: int) -> float:
    """Entropy, in nats, of the character distribution of ``ids``.

    It is the loss of the best model that ignores context: a language model
    worth its name ends below it.

    Args:
        ids: token ids.
        vocab_size: the number of distinct tokens.

    Returns:
        The entropy in nats.
    """
    counts = torch.bincount(ids, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def windows(ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Consecutive windows of ``block_size + 1`` ids, one id of overlap: ``(n, block + 1)``."""
    if len(ids) < block_size + 1:
        return ids.new_empty((0, block_size + 1))
    return ids.unfold(0, block_size + 1, block_size)


def spread(rows: torch.Tensor, count: int) -> torch.Tensor:
    """At most ``count`` rows of ``rows``, evenly spaced (a fixed subset)."""
    if len(rows) <= count:
        return rows
    return rows[torch.linspace(0, len(rows) - 1, count).round().long()]


class Windows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Training windows as ``{"tokens": ids[:-1], "targets": ids[1:]}`` mappings.

    Args:
        ids: token ids.
        block_size: characters of context per window.
    """

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        self.rows = windows(ids, block_size)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.rows[index]
        return {"tokens": row[:-1], "targets": row[1:]}

"""NorMuon: Muon with neuron-wise (row-wise) normalisation of the orthogonalised update.

Li, Liu, Liang, Chen, Zhao, "NorMuon: Making Muon more efficient and
scalable" (arXiv 2510.05491). After Muon's momentum and orthogonalisation
``O`` (an ``r x c`` matrix, conv kernels flattened as Muon flattens them),
each row -- one output neuron -- is divided by the root of an EMA of its mean
square, and the result is rescaled to ``O``'s Frobenius norm, as the
authors' reference implementation does::

    v ← β₂·v + (1 - β₂)·mean_cols(O ⊙ O)          (one value per row)
    Ô ← O / (√v + ε)
    Ô ← Ô · ‖O‖_F / (‖Ô‖_F + ε)
    p ← p - lr·wd·p - lr·adjust·Ô                   (or cautious decay)

Under FSDP2 the orthogonalisation runs on owner ranks as Muon's does; the
rows come back to the ranks that hold them, which update their rows of ``v``
and sum ``‖O‖²`` and ``‖Ô‖²`` over their rows; one ``all_reduce`` per
exchange completes those sums, so every rank scales its rows alike.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .config import NORMUON_KEYS, NorMuonConfig
from .optimizer import Muon, _apply, _Job, _Sharded
from .sharded import local

__all__ = ["NorMuon"]

_SLOT = "second_momentum_buffer"

_Pending = tuple[Tensor, _Job, float]


class NorMuon(Muon):
    """NorMuon (arXiv 2510.05491) for hidden matrices, AdamW for the rest.

    Everything but the update is Muon's (:class:`~optiplug_muon.Muon`):
    routing to the auxiliary AdamW, param groups, Newton-Schulz
    (``ns_coefficients``, methods, batching, dtype), ``adjust_lr``, weight
    decay (``weight_decay_mode``), FSDP2 ``DTensor`` support and the step
    report. The orthogonalised update ``O`` of each matrix is then
    normalised per row (output neuron) by the root of an EMA (``beta2``) of
    the row's mean square, kept in the state slot ``second_momentum_buffer``,
    and rescaled to ``O``'s Frobenius norm (the reference implementation's
    rule, which keeps Muon's learning rates; with
    ``adjust_lr="match_rms_adamw"`` this is the paper's Algorithm 1 whenever
    ``‖O‖_F = √min(r, c)``, i.e. for an exactly orthogonal ``O``).

    ``second_momentum_buffer`` is parameter-shaped (each row repeats its
    neuron's value): optiplug's state schema describes slots shaped like the
    parameter or scalar, and a ``DTensor`` slot shaped like its parameter is
    sharded with it.

    Sharded (FSDP2) matrices make three collective calls per process group
    and Newton-Schulz dtype: Muon's two all-to-alls and one ``all_reduce``
    of the two sums of squares of every matrix.

    Args:
        params: as for :class:`~optiplug_muon.Muon`.
        lr: learning rate of the matrices (default 0.02).
        **hparams: Muon's (see :class:`~optiplug_muon.config.MuonConfig`)
            plus ``beta2`` (0.95) and ``neuron_eps`` (1e-10); see
            :class:`~optiplug_muon.config.NorMuonConfig`.

    Raises:
        HyperparameterError: as Muon.
        UnsupportedPlacementError: as Muon.
    """

    algorithm: ClassVar[str] = "normuon"
    config_class: ClassVar[type[NorMuonConfig]] = NorMuonConfig
    group_keys: ClassVar[tuple[str, ...]] = NORMUON_KEYS
    collectives_per_exchange: ClassVar[int] = 3
    second_moments: ClassVar[frozenset[str]] = frozenset(
        {"second_momentum_buffer", "exp_avg_sq", "max_exp_avg_sq"}
    )

    def _momentum(
        self,
        group: dict[str, Any],
        names: dict[int, str] | None,
        jobs: list[_Job],
        sharded: list[_Sharded],
    ) -> None:
        """Muon's momentum; a zero second moment for parameters stepped the first time."""
        for param in group["params"]:
            if param.grad is not None and _SLOT not in self.state[param]:
                self.state[param][_SLOT] = torch.zeros_like(
                    param, memory_format=torch.preserve_format
                )
        super()._momentum(group, names, jobs, sharded)

    def _apply_whole(self, pending: list[_Pending]) -> None:
        """Normalise each whole matrix's update per row, then apply it."""
        for update, job, scale in pending:
            work, inverse, sums = self._row_statistics(update, job)
            _apply(_normalised(work, inverse, sums, job.group), job, scale)

    def _apply_rows(self, pending: list[_Pending], process_group: Any) -> None:
        """Normalise this rank's rows, with the sums of squares completed over the ranks."""
        found = [self._row_statistics(update, job) for update, job, _ in pending]
        wide = any(work.dtype == torch.float64 for work, _, _ in found)
        dtype = torch.float64 if wide else torch.float32
        sums = torch.stack([s.to(dtype) for _, _, s in found])  # (matrices, 2)
        torch.distributed.all_reduce(sums, group=process_group)
        for (_, job, scale), (work, inverse, _), total in zip(pending, found, sums, strict=True):
            _apply(_normalised(work, inverse, total.to(work.dtype), job.group), job, scale)

    def _row_statistics(self, update: Tensor, job: _Job) -> tuple[Tensor, Tensor, Tensor]:
        """Update the rows' second moment; (update in the statistics dtype, 1/(√v+ε), sums).

        ``update`` holds whole rows (a whole matrix, or this rank's rows of
        one); ``sums`` are ``‖O‖²`` and ``‖Ô‖²`` over those rows.
        """
        group = job.group
        second = local(self.state[job.source][_SLOT])
        rows, cols = update.shape  # (rows, cols): the matrix view; rows may be 0 on a shard
        work = update.to(torch.promote_types(second.dtype, torch.float32))
        mean_square = work.square().mean(dim=1, keepdim=True)  # (rows, 1)
        broadcast = mean_square.view(rows, *([1] * (second.ndim - 1))).to(second.dtype)
        second.lerp_(broadcast.expand_as(second), 1 - group["beta2"])
        root = second.reshape(rows, cols)[:, :1].to(work.dtype).sqrt()
        inverse = 1 / (root + group["neuron_eps"])
        squares = mean_square * cols  # ‖row‖²
        sums = torch.stack([squares.sum(), (squares * inverse.square()).sum()])
        return work, inverse, sums


def _normalised(work: Tensor, inverse: Tensor, sums: Tensor, group: dict[str, Any]) -> Tensor:
    """``Ô = O / (√v + ε)``, scaled by ``‖O‖_F / (‖Ô‖_F + ε)``."""
    ratio = sums[0].sqrt() / (sums[1].sqrt() + group["neuron_eps"])
    result: Tensor = work * inverse * ratio
    return result

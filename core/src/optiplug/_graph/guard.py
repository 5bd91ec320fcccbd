"""A Graph's non-finite policy: what a NaN or inf loss or gradient does, and the skips it counts.

The checks themselves are :mod:`.finite`'s reductions (agreed across ranks by
:mod:`.parallel`); this module owns the policy (``"stop"`` or ``"skip"``), the
skip counters and the wording of the errors.
"""

from __future__ import annotations

import itertools

import torch

from ..errors import GraphError, HyperparameterError
from .finite import (
    NONFINITE_POLICIES,
    first_nonfinite,
    gradient_values,
    gradients,
    parameters,
    state_items,
    state_values,
)
from .parallel import all_ranks_finite, any_rank

__all__ = ["NonfiniteGuard"]


class NonfiniteGuard:
    """The non-finite policy of a Graph and its skip counters."""

    def __init__(self) -> None:
        self.policy = "stop"
        self.max_consecutive_skips = 16
        self.pending = False  # a non-finite loss in this accumulation (policy "skip")
        self.skipped = 0
        self.consecutive = 0

    def set_policy(self, policy: str, max_consecutive_skips: int) -> None:
        """Validate and keep the policy and its skip limit.

        Raises:
            HyperparameterError: an unknown policy or a count < 1.
        """
        if policy not in NONFINITE_POLICIES:
            raise HyperparameterError(
                "nonfinite_policy", policy, "must be 'stop' or 'skip'", algorithm="Graph"
            )
        limit = max_consecutive_skips
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise HyperparameterError(
                "max_consecutive_skips", limit, "must be an integer >= 1", algorithm="Graph"
            )
        self.policy, self.max_consecutive_skips = policy, limit

    @staticmethod
    def loss_nonfinite(loss: torch.Tensor) -> bool:
        """Whether ``loss`` holds NaN or inf here or, under ``torch.distributed``, on any rank."""
        return any_rank((~torch.isfinite(loss.detach())).any())

    @staticmethod
    def loss_error(loss: torch.Tensor, step: int) -> GraphError:
        """The error of a non-finite loss at optimizer step ``step + 1``."""
        value = "nan" if bool(torch.isnan(loss.detach()).any()) else "inf"
        return GraphError(
            f"Graph.backward: the loss is {value} at step {step + 1}; "
            f"stopped before backpropagating it, nothing was applied (the parameters "
            f"and optimizer state are those of step {step})"
        )

    @staticmethod
    def nonfinite_gradient(
        module: torch.nn.Module, parallel: str, trainable: list[torch.nn.Parameter]
    ) -> str | None:
        """The first non-finite gradient's description, or None (agreed across ranks).

        Gradients are all-reduced under DDP, so every rank decides the same;
        under FSDP each rank checks its shard and one all-reduce of the answer
        makes every rank decide alike. ``trainable`` is the module's trainable
        parameters, listed once per step by the caller; the module is walked
        again only to name a culprit.
        """
        if all_ranks_finite(gradient_values(trainable), parallel):
            return None
        return first_nonfinite(gradients(module)) or "a gradient shard of another rank"

    @staticmethod
    def gradient_error(name: str, step: int) -> GraphError:
        """The error of a non-finite gradient at optimizer step ``step + 1``."""
        return GraphError(
            f"Graph.step: {name} is not finite at step {step + 1}; "
            f"nothing was applied (the parameters and optimizer state are those of step "
            f"{step})"
        )

    @staticmethod
    def nonfinite_parameter(
        module: torch.nn.Module, parallel: str, trainable: list[torch.nn.Parameter]
    ) -> str | None:
        """The first trainable parameter holding NaN or inf, or None.

        A Graph asks when a loss is non-finite, to tell a step that
        overflowed the parameters from a bad batch (a step leaves the frozen
        ones as they were). Nothing is screened after every step: a
        non-finite parameter shows in the next loss, and a save checks
        parameters, buffers and optimizer state (:meth:`nonfinite_state`).
        Under FSDP every rank must call it.
        """
        if all_ranks_finite(trainable, parallel):
            return None
        return first_nonfinite(parameters(module)) or "a parameter shard of another rank"

    @staticmethod
    def nonfinite_state(
        module: torch.nn.Module, optimizer: torch.optim.Optimizer, parallel: str
    ) -> str | None:
        """The first parameter or optimizer state slot holding NaN or inf, or None.

        Under FSDP every rank must call it (the answer is agreed by one
        all-reduce): a rank whose own shards are finite names another rank's.
        """
        if all_ranks_finite(state_values(module, optimizer), parallel):
            return None
        found = first_nonfinite(itertools.chain(parameters(module), state_items(module, optimizer)))
        return found or "a parameter or state shard of another rank"

    @staticmethod
    def state_error(found: str, step: int) -> GraphError:
        """The error of a step ``step`` that left ``found`` non-finite (seen in the next loss)."""
        return GraphError(
            f"Graph.backward: the loss is not finite because the state is not finite after "
            f"step {step}: "
            f"{found} holds NaN or inf (the update overflowed: lower the learning rate); "
            "this Graph cannot go on: load the last checkpoint"
        )

    def count_skip(self, step: int) -> None:
        """Count a skipped step; too many in a row raise.

        Raises:
            GraphError: ``max_consecutive_skips`` skips in a row.
        """
        self.pending = False
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive_skips:
            raise GraphError(
                f"Graph.step: {self.consecutive} steps in a row were skipped for a "
                f"non-finite loss or gradient (at step {step + 1}); stopping: "
                f"the parameters and optimizer state are those of step {step}"
            )

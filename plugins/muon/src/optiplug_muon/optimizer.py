"""The Muon optimizer, with its auxiliary AdamW, as one ``torch.optim.Optimizer``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, cast

import attrs
import torch
from torch import Tensor, nn
from torch.optim.adam import adam as torch_adam

from optiplug.base import (
    GROUP_META_KEYS,
    ValidatedLoading,
    closure_loss,
    fused_supported,
    named_param_groups,
    parameter_tensors,
    validated_config,
    warn_at_caller,
)
from optiplug.errors import HyperparameterError

from .config import AUX_KEYS, MUON_KEYS, MuonConfig, ns_dtype_name
from .newton_schulz import (
    Workspace,
    allocate_buffers,
    check_method,
    default_ns_dtype,
    newton_schulz_,
    resolve_method,
)
from .routing import Decision, ModelInfo, ParameterRoute, Routing, decide, model_info

__all__ = ["Muon", "RoutingWarning", "adjust_lr_factor", "matrix_shape"]

_UNSET: Any = object()


class RoutingWarning(UserWarning):
    """Muon could not recognise embeddings and output heads (no names, no model)."""


def matrix_shape(param: Tensor) -> tuple[int, int]:
    """The 2-D shape Muon orthogonalises: (out, in * kh * kw...) for conv kernels."""
    return param.shape[0], math.prod(param.shape[1:])


def adjust_lr_factor(param: Tensor, adjust_lr: str) -> float:
    """The lr multiplier of ``adjust_lr`` for ``param``'s matrix shape.

    Args:
        param: a Muon parameter.
        adjust_lr: ``"original"`` (sqrt(max(1, rows/cols))) or
            ``"match_rms_adamw"`` (0.2 * sqrt(max(rows, cols))).

    Returns:
        The factor applied to the group's lr.
    """
    rows, cols = matrix_shape(param)
    if adjust_lr == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))


class _Job(NamedTuple):
    """One Muon parameter awaiting orthogonalisation in this step.

    A ``NamedTuple``: it is built inside ``step``, where ``torch.compile``
    cannot trace the ``object.__setattr__`` of a frozen attrs class.
    """

    param: Tensor
    grad: Tensor
    buffer: Tensor
    group: dict[str, Any]


def _group_dict(
    items: list[tuple[str | None, Tensor]], use_muon: bool, config: MuonConfig
) -> dict[str, Any]:
    named = all(name is not None for name, _ in items)
    group: dict[str, Any] = {"params": list(items) if named else [t for _, t in items]}
    if use_muon:
        group.update({key: getattr(config, key) for key in MUON_KEYS})
        group["ns_dtype"] = ns_dtype_name(config.ns_dtype)
    else:
        group.update({key: getattr(config, field) for key, field in AUX_KEYS.items()})
    group["use_muon"] = use_muon
    return group


@attrs.frozen
class _Entry:
    """One input parameter with its routing decision."""

    name: str | None
    tensor: Tensor = attrs.field(eq=False)
    decision: Decision
    label: str


def _decided(
    items: list[tuple[str | None, Tensor]], start: int, local: MuonConfig, model: ModelInfo
) -> list[_Entry]:
    entries = []
    for position, (name, tensor) in enumerate(items, start):
        name = name or model.names.get(id(tensor))
        decision = decide(name, tensor, model.roles, local, local.use_muon)
        entries.append(_Entry(name, tensor, decision, name or f"#{position}"))
    return entries


def _route(
    params: Sequence[Any], config: MuonConfig
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Split ``params`` into Muon and AdamW param groups; (groups, (label, reason) per param)."""
    model = model_info(cast("nn.Module | None", config.model))  # checked by MuonConfig
    groups: list[dict[str, Any]] = []
    labels: list[tuple[str, str]] = []
    entries: list[tuple[_Entry, MuonConfig]] = []
    for group in named_param_groups(params):
        local = attrs.evolve(config, **group.options) if group.options else config
        decided = _decided(list(group.params), len(entries), local, model)
        entries += [(e, local) for e in decided]
        for use_muon in (True, False):
            chosen = [e for e in decided if e.decision.use_muon is use_muon]
            if chosen:
                groups.append(_group_dict([(e.name, e.tensor) for e in chosen], use_muon, local))
                labels += [(e.label, e.decision.reason) for e in chosen]
    if any(e.name is None and e.decision.use_muon and c.use_muon is None for e, c in entries):
        warn_at_caller(
            "muon: parameters without names and no model= given, so embeddings and output "
            "heads cannot be recognised: every matrix goes to Muon. Pass "
            "model.named_parameters() or model=model (or use force_aux).",
            RoutingWarning,
            packages=("optiplug_muon",),
        )
    return groups, labels


class Muon(ValidatedLoading, torch.optim.Optimizer):
    """Muon (MomentUm Orthogonalized by Newton-Schulz) for hidden matrices, AdamW for the rest.

    Muon parameters (matrices; conv kernels flattened to (out, in*kh*kw)):
    ``m = momentum*m + (1-momentum)*g``; the direction ``(1-momentum)*g +
    momentum*m`` (Nesterov) or ``m`` is orthogonalised by Newton-Schulz
    (standard or Gram form, ``ns_method``; one matrix at a time on CPU,
    same-shape matrices batched elsewhere, ``ns_batch``); then ``p = p*(1 -
    lr*wd) - lr*adjust(shape)*O``. Embeddings, output heads and non-matrix
    parameters go to an auxiliary AdamW (torch's kernel). Both live in this
    one optimizer as separate param groups (``group["use_muon"]``), so LR
    schedulers and ``group["lr"]`` reach both; :meth:`routing` says who got what.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs;
            names (or ``model=``) let embeddings and heads be recognised.
        lr: Muon's learning rate (default 0.02).
        **hparams: see :class:`~optiplug_muon.config.MuonConfig` (momentum,
            nesterov, ns_steps, ns_coefficients, eps, weight_decay, adjust_lr,
            ns_dtype, ns_batch, ns_method, aux, aux_lr, aux_betas, aux_eps,
            aux_weight_decay, model, aux_patterns, force_muon, force_aux, use_muon).

    Raises:
        HyperparameterError: an unknown keyword, a bad value, a non-matrix
            forced to Muon, or a parameter for AdamW while ``aux=None``.
    """

    algorithm: ClassVar[str] = "muon"

    def __init__(self, params: Iterable[Any], lr: Any = _UNSET, **hparams: Any) -> None:
        if lr is not _UNSET:
            hparams["lr"] = lr
        params = list(params)
        config: MuonConfig = validated_config(self.algorithm, MuonConfig, params, hparams)
        groups, self._labels = _route(params, config)
        self._workspaces: dict[tuple[Any, ...], Workspace] = {}
        for device_type in {tensor.device.type for tensor in parameter_tensors(params)}:
            default_ns_dtype(device_type)  # probed now, eagerly: a compiled step only reads it
        defaults = {key: getattr(config, key) for key in MUON_KEYS}
        defaults.update({field: getattr(config, field) for field in AUX_KEYS.values()})
        defaults["ns_dtype"] = ns_dtype_name(config.ns_dtype)
        super().__init__(groups, defaults)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_labels": self._labels}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_labels", [])
        self._workspaces = {}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group for Muon or for the auxiliary AdamW.

        ``use_muon`` in the group picks the algorithm; without it, a group of
        matrices goes to Muon and a group of non-matrices to AdamW. Missing
        hyperparameters come from the constructor's (``aux_*`` for AdamW).

        Args:
            param_group: ``{"params": ..., "use_muon": bool, ...}``.

        Raises:
            HyperparameterError: mixed matrices and non-matrices without
                ``use_muon``, or a non-matrix in a Muon group.
        """
        if not isinstance(param_group["params"], Tensor):  # read twice: here and by torch
            param_group["params"] = list(param_group["params"])
        tensors = parameter_tensors([param_group])
        if param_group.get("use_muon") is None:
            param_group["use_muon"] = _all_matrices(tensors)
        use_muon = param_group["use_muon"]
        if use_muon and any(t.ndim < 2 for t in tensors):
            raise HyperparameterError(
                "use_muon", True, "Muon param groups take matrices only", algorithm="muon"
            )
        fill = (
            {key: self.defaults[key] for key in MUON_KEYS}
            if use_muon
            else {key: self.defaults[field] for key, field in AUX_KEYS.items()}
        )
        for key, value in fill.items():
            param_group.setdefault(key, value)
        explicit = set(param_group) | GROUP_META_KEYS
        super().add_param_group(param_group)
        for key in set(param_group) - explicit:  # torch filled in the other algorithm's keys
            del param_group[key]
        self._label_added(param_group)

    def _label_added(self, group: dict[str, Any]) -> None:
        labels = getattr(self, "_labels", None)
        total = sum(len(g["params"]) for g in self.param_groups)
        if labels is not None and len(labels) < total:
            reason = f"added by add_param_group (use_muon={group['use_muon']})"
            labels += [(f"#{i}", reason) for i in range(len(labels), total)]

    def routing(self) -> Routing:
        """Per parameter: algorithm, reason, and effective lr and weight decay (now).

        Returns:
            A :class:`~optiplug_muon.routing.Routing`; ``str()`` of it is a table.
        """
        rows: list[ParameterRoute] = []
        for number, group in enumerate(self.param_groups):
            names = group.get("param_names") or [None] * len(group["params"])
            for name, param in zip(names, group["params"], strict=True):
                label, reason = self._label(len(rows))
                rows.append(_route_row(name or label, reason, param, group, number))
        return Routing(tuple(rows))

    def _label(self, index: int) -> tuple[str, str]:
        labels = getattr(self, "_labels", [])
        return labels[index] if index < len(labels) else (f"#{index}", "unknown")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step (Muon groups and AdamW groups).

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        loss = closure_loss(closure)
        for group in self.param_groups:  # before anything is updated
            if group["use_muon"]:
                check_method(group["ns_method"])
        jobs: list[_Job] = []
        for group in self.param_groups:
            if group["use_muon"]:
                jobs += self._momentum(group)
            else:
                self._adamw(group)
        for bucket in _buckets(jobs):
            self._orthogonalize(bucket)
        return loss

    def _momentum(self, group: dict[str, Any]) -> list[_Job]:
        jobs = []
        for param in group["params"]:
            if param.grad is None:
                continue
            _check_grad(param)
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format
                )
            buffer = state["momentum_buffer"]
            buffer.lerp_(param.grad, 1 - group["momentum"])
            jobs.append(_Job(param, param.grad, buffer, group))
        return jobs

    def _workspace(self, job: _Job) -> Workspace:
        rows, cols = matrix_shape(job.param)
        dtype = _ns_dtype(job.group, job.param.device)
        key = (rows, cols, dtype, job.param.device)
        if key not in self._workspaces:
            self._workspaces[key] = Workspace(rows, cols, dtype, job.param.device)
        return self._workspaces[key]

    def _orthogonalize(self, jobs: list[_Job]) -> None:
        group, param = jobs[0].group, jobs[0].param
        steps = group["ns_steps"]
        rows, cols = matrix_shape(param)
        method = resolve_method(group["ns_method"], rows, cols, steps, param.device.type, len(jobs))
        if torch.compiler.is_compiling():
            dtype = _ns_dtype(group, param.device)
            buffers = allocate_buffers(rows, cols, len(jobs), method, dtype, param.device)
        else:
            buffers = self._workspace(jobs[0]).take(len(jobs), method)
        for row, job in zip(buffers.x, jobs, strict=True):
            _direction(row, job)
        result = newton_schulz_(
            buffers,
            steps=steps,
            coefficients=tuple(group["ns_coefficients"]),
            eps=group["eps"],
            method=method,
        )
        for update, job in zip(result, jobs, strict=True):
            _apply(update, job)

    def _adamw(self, group: dict[str, Any]) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for param in group["params"]:
            if param.grad is None:
                continue
            _check_grad(param)
            state = self.state[param]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            params.append(param)
            grads.append(param.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if params:
            _adamw_update(params, grads, exp_avgs, exp_avg_sqs, steps, group, self.state)


def _route_row(
    name: str, reason: str, param: Tensor, group: Mapping[str, Any], number: int
) -> ParameterRoute:
    lr = float(group["lr"])
    if group["use_muon"]:
        lr *= adjust_lr_factor(param, group["adjust_lr"])
    algorithm = "muon" if group["use_muon"] else "adamw"
    shape = tuple(param.shape)
    return ParameterRoute(name, shape, algorithm, reason, lr, float(group["weight_decay"]), number)


def _all_matrices(tensors: Sequence[Tensor]) -> bool:
    kinds = {t.ndim >= 2 for t in tensors}
    if len(kinds) > 1:
        raise HyperparameterError(
            "use_muon",
            None,
            "this group mixes matrices and non-matrices; say which "
            "algorithm it is for with use_muon=True/False",
            algorithm="muon",
        )
    return kinds == {True}


def _check_grad(param: Tensor) -> None:
    if param.grad is not None and param.grad.is_sparse:
        raise RuntimeError("Muon does not support sparse gradients")
    if torch.is_complex(param):
        raise RuntimeError("Muon does not support complex parameters")


def _ns_dtype(group: Mapping[str, Any], device: torch.device) -> torch.dtype:
    name = group["ns_dtype"]
    return getattr(torch, name) if name else default_ns_dtype(device.type)


def _batched(group: Mapping[str, Any], device: torch.device) -> bool:
    """``ns_batch``, or where it is None: batch on every device but the CPU."""
    choice = group["ns_batch"]
    return device.type != "cpu" if choice is None else choice


def _buckets(jobs: list[_Job]) -> list[list[_Job]]:
    """Jobs that can share one batched Newton-Schulz call (same shape and settings)."""
    buckets: dict[tuple[Any, ...], list[_Job]] = {}
    for index, job in enumerate(jobs):
        group = job.group
        key = (
            matrix_shape(job.param),
            job.param.device,
            _ns_dtype(group, job.param.device),
            group["ns_steps"],
            tuple(group["ns_coefficients"]),
            group["eps"],
            group["ns_method"],
            None if _batched(group, job.param.device) else index,
        )
        buckets.setdefault(key, []).append(job)
    return list(buckets.values())


def _direction(out: Tensor, job: _Job) -> None:
    """Write the (Nesterov) momentum direction of ``job`` into ``out`` (its 2-D shape)."""
    buffer = job.buffer.reshape(out.shape)
    if job.group["nesterov"]:
        torch.lerp(job.grad.reshape(out.shape), buffer, job.group["momentum"], out=out)
    else:
        out.copy_(buffer)


def _apply(update: Tensor, job: _Job) -> None:
    """``p = p * (1 - lr * wd) - lr * adjust * update``."""
    param, group = job.param, job.group
    lr, weight_decay = group["lr"], group["weight_decay"]
    scale = adjust_lr_factor(param, group["adjust_lr"])
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    update = update.view(param.shape)
    if isinstance(lr, Tensor):
        param.sub_(update * (lr * scale))
    else:
        param.add_(update, alpha=-lr * scale)


def _adamw_update(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    group: Mapping[str, Any],
    state: Any,
) -> None:
    """torch's AdamW kernel: fused where supported (fastest on CPU and GPU), else the loop.

    Inside ``torch.compile`` always the loop: torch keeps its fused kernel out
    of graphs (``torch.compiler.disable``, a graph break), and the compiler
    fuses the loop's ops itself.
    """
    fused = fused_supported(params) and not torch.compiler.is_compiling()
    if fused:
        for index, (param, step) in enumerate(zip(params, steps, strict=True)):
            if step.device != param.device:  # loaded from a CPU checkpoint
                steps[index] = state[param]["step"] = step.to(param.device)
    beta1, beta2 = group["aux_betas"]
    torch_adam(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        foreach=False,
        fused=fused,
        decoupled_weight_decay=True,
        amsgrad=False,
        beta1=beta1,
        beta2=beta2,
        lr=group["lr"],
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=False,
    )

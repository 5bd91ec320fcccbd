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
    Prepared,
    StepPiece,
    ValidatedLoading,
    accepts_prepared,
    closure_loss,
    fused_supported,
    named_param_groups,
    parameter_tensors,
    prepare,
    run_pipeline,
    state_codec,
    warn_at_caller,
)
from optiplug.errors import HyperparameterError

from .config import AUX_KEYS, MUON_KEYS, MuonConfig, ns_dtype_name
from .newton_schulz import (
    Buffers,
    Workspace,
    allocate_buffers,
    check_coefficients,
    check_method,
    default_ns_dtype,
    newton_schulz_,
    resolve_method,
)
from .report import StepReport, assign_owners, newton_schulz_cost, row_ranges
from .routing import Decision, ModelInfo, ParameterRoute, Routing, decide, model_info
from .sharded import (
    UnsupportedPlacementError,
    all_to_all,
    describe_placement,
    elementwise_problem,
    is_distributed,
    local,
    muon_problem,
    split_sizes,
    whole_on_every_rank,
)

__all__ = [
    "Muon",
    "RoutingWarning",
    "StepReport",
    "UnsupportedPlacementError",
    "adjust_lr_factor",
    "matrix_shape",
]

_UNSET: Any = object()


class RoutingWarning(UserWarning):
    """Muon could not recognise embeddings and output heads (no names, no model)."""


def matrix_shape(param: Tensor) -> tuple[int, int]:
    """The 2-D shape Muon orthogonalises: (out, in * kh * kw...) for conv kernels.

    For a ``DTensor`` this is the global shape (``DTensor.shape``), not the local shard's.
    """
    return param.shape[0], math.prod(param.shape[1:])


def adjust_lr_factor(param: Tensor, adjust_lr: str) -> float:
    """The lr multiplier of ``adjust_lr`` for ``param``'s matrix shape.

    Args:
        param: a Muon parameter.
        adjust_lr: ``"original"`` (sqrt(max(1, rows/cols)) of the flattened
            matrix), ``"match_rms_adamw"`` (0.2 * sqrt(max(rows, cols))) or
            ``"original_last_two"`` (sqrt(max(1, shape[-2]/shape[-1])) of the
            parameter as it is, the reference code's reading of a conv kernel).

    Returns:
        The factor applied to the group's lr.
    """
    if adjust_lr == "original_last_two":
        return math.sqrt(max(1.0, param.shape[-2] / param.shape[-1]))
    return _adjust(*matrix_shape(param), adjust_lr)


def _adjust(rows: int, cols: int, adjust_lr: str) -> float:
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
    source: Tensor
    """The optimizer's parameter (``param`` is its local part when it is a ``DTensor``)."""


class _Sharded(NamedTuple):
    """A Muon matrix split by rows across a mesh: this rank's part and the global shape."""

    job: _Job
    label: str
    rows: int
    cols: int
    mesh: Any


def _group_dict(
    items: list[tuple[str | None, Tensor]], use_muon: bool, config: MuonConfig, keys: Sequence[str]
) -> dict[str, Any]:
    named = all(name is not None for name, _ in items)
    group: dict[str, Any] = {"params": list(items) if named else [t for _, t in items]}
    if use_muon:
        group.update({key: getattr(config, key) for key in keys})
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
    params: Sequence[Any], config: MuonConfig, keys: Sequence[str]
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Split ``params`` into Muon and AdamW param groups; (groups, (label, reason) per param)."""
    model = model_info(cast("nn.Module | None", config.model))  # checked by MuonConfig
    groups: list[dict[str, Any]] = []
    labels: list[tuple[str, str]] = []
    entries: list[tuple[_Entry, MuonConfig]] = []
    fields = {field.name for field in attrs.fields(type(config))}
    for group in named_param_groups(params):
        known = {k: v for k, v in group.options.items() if k in fields}
        extra = {k: v for k, v in group.options.items() if k not in fields}  # timm's lr_scale
        local = attrs.evolve(config, **known) if known else config
        decided = _decided(list(group.params), len(entries), local, model)
        entries += [(e, local) for e in decided]
        for use_muon in (True, False):
            chosen = [e for e in decided if e.decision.use_muon is use_muon]
            if chosen:
                named = [(e.name, e.tensor) for e in chosen]
                groups.append({**extra, **_group_dict(named, use_muon, local, keys)})
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
    ``weight_decay_mode="cautious"`` decays only the coordinates where the
    update and the parameter agree in sign (arXiv 2510.12402).

    ``DTensor`` parameters (FSDP2's ``fully_shard``): a matrix placed
    ``Shard(0)`` on a 1-D mesh is orthogonalised whole on one owner rank
    (owners balance the Newton-Schulz work; all matrices travel in one
    all-to-all there and one back per step); ``Replicate()`` matrices are
    orthogonalised where they are; the AdamW half steps local shards. Any
    other placement is an error, never a silent fallback;
    :meth:`last_step_report` says what each step did on this rank.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs;
            names (or ``model=``) let embeddings and heads be recognised.
        lr: Muon's learning rate (default 0.02).
        **hparams: see :class:`~optiplug_muon.config.MuonConfig` (momentum,
            nesterov, ns_steps, ns_coefficients (a tuple, ``"quintic"`` or
            ``"polar_express"``), eps, weight_decay, weight_decay_mode, adjust_lr,
            ns_dtype, ns_batch, ns_method, aux, aux_lr, aux_betas, aux_eps,
            aux_weight_decay, model, aux_patterns, force_muon, force_aux, use_muon).

    Raises:
        HyperparameterError: an unknown keyword, a bad value, a non-matrix
            forced to Muon, or a parameter for AdamW while ``aux=None``.
        UnsupportedPlacementError: a ``DTensor`` Muon matrix not placed
            ``Shard(0)``/``Replicate()`` on a 1-D mesh, or an AdamW ``DTensor``
            placed ``Partial`` (a ``HyperparameterError`` naming the parameter).
    """

    algorithm: ClassVar[str] = "muon"
    config_class: ClassVar[type[MuonConfig]] = MuonConfig
    group_keys: ClassVar[tuple[str, ...]] = MUON_KEYS
    """The keys of this algorithm's matrix param groups (besides ``params`` and ``use_muon``)."""
    collectives_per_exchange: ClassVar[int] = 2
    """Collective calls per exchange of sharded matrices (an all-to-all there and one back)."""
    linear_slots: ClassVar[frozenset[str]] = frozenset({"momentum_buffer"})
    """Muon's momentum takes the linear int8/int4 table: evenly spaced codes
    (Gupta et al. 2025, arXiv 2509.23106), which Newton-Schulz tolerates
    better than the dynamic table AdamW's moments need."""
    low_rank_slots: ClassVar[frozenset[str]] = frozenset({"momentum_buffer"})
    """Muon's momentum keeps rank-4 float32 factors beside its int8/int4 codes
    (``optiplug.base.LOW_RANK``): Newton-Schulz lifts every singular direction
    to one, so the codes' rounding in a steep momentum's small directions
    would otherwise be a large part of the update."""

    @accepts_prepared
    def __init__(self, params: Iterable[Any] | Prepared, lr: Any = _UNSET, **hparams: Any) -> None:
        given = hparams if lr is _UNSET else {**hparams, "lr": lr}
        made = prepare(type(self), params, hparams=given)
        params, config = made.params, cast("MuonConfig", made.config)
        groups, self._labels = _route(params, config, self.group_keys)
        self._workspaces: dict[tuple[Any, ...], Workspace] = {}
        self._last_report: StepReport | None = None
        for device_type in {tensor.device.type for tensor in parameter_tensors(params)}:
            default_ns_dtype(device_type)  # probed now, eagerly: a compiled step only reads it
        defaults = {key: getattr(config, key) for key in self.group_keys}
        defaults.update({field: getattr(config, field) for field in AUX_KEYS.values()})
        defaults["ns_dtype"] = ns_dtype_name(config.ns_dtype)
        super().__init__(groups, defaults)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_labels": self._labels}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_labels", [])
        self._workspaces = {}
        self._last_report = None

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
            UnsupportedPlacementError: a ``DTensor`` this group's algorithm
                cannot step (see the class docstring).
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
        self._check_placements(param_group, use_muon)
        fill = (
            {key: self.defaults[key] for key in self.group_keys}
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

    def _check_placements(self, param_group: Mapping[str, Any], use_muon: bool) -> None:
        """Refuse ``DTensor`` parameters the group's algorithm cannot step (before adding them)."""
        items = param_group["params"]
        if isinstance(items, Tensor):
            items = [items]
        start = sum(len(group["params"]) for group in self.param_groups)
        for offset, item in enumerate(items):
            name, tensor = item if isinstance(item, tuple) else (None, item)
            if not is_distributed(tensor):
                continue
            problem = muon_problem(tensor) if use_muon else elementwise_problem(tensor)
            if problem is not None:
                label = name or self._label(start + offset)[0]
                raise UnsupportedPlacementError(_described(label, tensor), problem)

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
                row = _route_row(name or label, reason, param, group, number, self.algorithm)
                rows.append(row)
        return Routing(tuple(rows))

    def _label(self, index: int) -> tuple[str, str]:
        labels = getattr(self, "_labels", [])
        return labels[index] if index < len(labels) else (f"#{index}", "unknown")

    def _names(self) -> dict[int, str]:
        """``id(parameter) -> name`` (its routing label, ``#i`` when unnamed)."""
        names: dict[int, str] = {}
        for group in self.param_groups:
            given = group.get("param_names") or [None] * len(group["params"])
            for name, param in zip(given, group["params"], strict=True):
                names[id(param)] = name or self._label(len(names))[0]
        return names

    def last_step_report(self) -> StepReport | None:
        """What the last :meth:`step` did on this rank: who went through Newton-Schulz, and how.

        Under FSDP2, summing the reports of all ranks
        (``torch.distributed.all_gather_object``) lists every sharded Muon
        matrix in exactly one rank's ``gathered``; a matrix that went
        anywhere else would be missing. Not updated by a step run under
        ``torch.compile``.

        Returns:
            A frozen :class:`~optiplug_muon.report.StepReport`, or None before the first step.
        """
        return self._last_report

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step (Muon groups and AdamW groups).

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        ``DTensor`` parameters: see the class docstring; what the step did
        on this rank is :meth:`last_step_report`.

        Returns:
            The closure's loss, or None.

        Raises:
            HyperparameterError: a Muon group's ``ns_method`` or ``ns_coefficients``
                was edited to a bad name.
            UnsupportedPlacementError: a ``DTensor`` parameter, its gradient or its
                state is placed in a way it cannot be stepped (nothing is updated).
        """
        loss = closure_loss(closure)
        run_pipeline(self, self.step_pipeline, self._update)
        return loss

    step_pipeline: ClassVar[tuple[StepPiece, ...]] = (state_codec,)
    """Each group in its ``state_precision`` (the state codec of :mod:`optiplug.base`)."""

    def _update(self, view: Muon) -> None:
        """One step over ``view``'s groups (this optimizer's, or one narrowed to a parameter)."""
        view._step_groups()
        self._last_report = view._last_report

    def _step_groups(self) -> None:
        """One step over ``self.param_groups`` (all of them, or one narrowed to a parameter)."""
        for group in self.param_groups:  # before anything is updated
            if group["use_muon"]:
                check_method(group["ns_method"])
                if isinstance(group["ns_coefficients"], str):
                    check_coefficients(group["ns_coefficients"])
        names = None if torch.compiler.is_compiling() else self._names()
        self._check_distributed(names)
        jobs: list[_Job] = []
        sharded: list[_Sharded] = []
        elementwise: list[Tensor] = []
        for group in self.param_groups:
            if group["use_muon"]:
                self._momentum(group, names, jobs, sharded)
            else:
                elementwise += self._adamw(group, names)
        for bucket in _buckets(jobs):
            self._orthogonalize(bucket)
        owned, collectives = self._orthogonalize_sharded(sharded) if sharded else ([], 0)
        if names is not None:
            self._last_report = _report(names, jobs, sharded, owned, elementwise, collectives)

    def _check_distributed(self, names: dict[int, str] | None) -> None:
        """Before anything is updated: every ``DTensor`` to step can be stepped as placed.

        Raises:
            UnsupportedPlacementError: a placement its half cannot step (a group
                edited after construction), a gradient or state tensor placed
                unlike its parameter, or a Muon shard that is not the
                ``torch.chunk`` split of the rows.
        """
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None or not is_distributed(param):
                    continue
                label = _described((names or self._names())[id(param)], param)
                use_muon = group["use_muon"]
                problem = muon_problem(param) if use_muon else elementwise_problem(param)
                if problem is not None:
                    raise UnsupportedPlacementError(label, problem)
                _placed_like(param, param.grad, "gradient", label)
                for slot, value in self.state.get(param, {}).items():
                    if isinstance(value, Tensor) and (value.ndim > 0 or is_distributed(value)):
                        _placed_like(param, value, slot, label)
                if use_muon and not whole_on_every_rank(param):
                    _check_rows(param, label)

    def _momentum(
        self,
        group: dict[str, Any],
        names: dict[int, str] | None,
        jobs: list[_Job],
        sharded: list[_Sharded],
    ) -> None:
        """Update the momentum of ``group``'s parameters; queue them for Newton-Schulz."""
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
            if not is_distributed(param):
                buffer.lerp_(param.grad, 1 - group["momentum"])
                jobs.append(_Job(param, param.grad, buffer, group, param))
                continue
            label = _described((names or self._names())[id(param)], param)
            grad = _placed_like(param, param.grad, "gradient", label)
            buffer = _placed_like(param, buffer, "momentum_buffer", label)
            buffer.lerp_(grad, 1 - group["momentum"])
            job = _Job(local(param), grad, buffer, group, param)
            if whole_on_every_rank(param):
                jobs.append(job)
            else:
                rows, cols = matrix_shape(param)
                mesh = param.device_mesh
                sharded.append(_Sharded(job, label, rows, cols, mesh))

    def _buffers(
        self, group: Mapping[str, Any], rows: int, cols: int, device: torch.device, count: int
    ) -> tuple[Buffers, str]:
        """Newton-Schulz buffers for ``count`` matrices of one shape, and the method to run."""
        method = resolve_method(
            group["ns_method"], rows, cols, group["ns_steps"], device.type, count
        )
        dtype = _ns_dtype(group, device)
        if torch.compiler.is_compiling():
            return allocate_buffers(rows, cols, count, method, dtype, device), method
        key = (rows, cols, dtype, device)
        if key not in self._workspaces:
            self._workspaces[key] = Workspace(rows, cols, dtype, device)
        return self._workspaces[key].take(count, method), method

    def _orthogonalize(self, jobs: list[_Job]) -> None:
        group, param = jobs[0].group, jobs[0].param
        rows, cols = matrix_shape(param)
        buffers, method = self._buffers(group, rows, cols, param.device, len(jobs))
        for row, job in zip(buffers.x, jobs, strict=True):
            _direction(row, job)
        result = _newton_schulz(buffers, group, method)
        scale = adjust_lr_factor(param, group["adjust_lr"])
        self._apply_whole([(update, job, scale) for update, job in zip(result, jobs, strict=True)])

    def _orthogonalize_sharded(self, sharded: list[_Sharded]) -> tuple[list[_Sharded], int]:
        """Orthogonalise row-sharded matrices on their owners; (owned here, collectives made).

        One exchange (an all-to-all there and one back) per process group and
        Newton-Schulz dtype, in order of first appearance: every rank steps the
        same parameters in the same order, so every rank makes the same calls.
        """
        exchanges: dict[tuple[int, torch.dtype], list[_Sharded]] = {}
        for item in sharded:
            dtype = _ns_dtype(item.job.group, item.job.param.device)
            exchanges.setdefault((id(item.mesh.get_group()), dtype), []).append(item)
        owned: list[_Sharded] = []
        for (_, dtype), items in exchanges.items():
            owned += self._exchange(items, dtype)
        return owned, self.collectives_per_exchange * len(exchanges)

    def _exchange(self, items: list[_Sharded], dtype: torch.dtype) -> list[_Sharded]:
        """Gather ``items`` to their owners, orthogonalise the owned ones, scatter the rows back."""
        mesh = items[0].mesh
        group, rank, world = mesh.get_group(), mesh.get_local_rank(), mesh.size()
        owners = assign_owners([newton_schulz_cost(i.rows, i.cols) for i in items], world)
        ranges = [row_ranges(item.rows, world) for item in items]
        cols = [item.cols for item in items]
        send_sizes, receive_sizes = split_sizes(owners, ranges, cols, rank)
        send = torch.empty(sum(send_sizes), dtype=dtype, device=items[0].job.param.device)
        slots = [0] * len(items)  # where each item's rows sit in `send` (and come back)
        offset = 0
        for destination in range(world):
            for index, item in enumerate(items):
                if owners[index] == destination:
                    start, end = ranges[index][rank]
                    slots[index] = offset
                    size = (end - start) * item.cols
                    _direction(send[offset : offset + size].view(end - start, item.cols), item.job)
                    offset += size
        received = all_to_all(send, send_sizes, receive_sizes, group)
        mine = [index for index, owner in enumerate(owners) if owner == rank]
        pieces: dict[int, list[Tensor]] = {index: [] for index in mine}
        offset = 0
        for source in range(world):
            for index in mine:
                start, end = ranges[index][source]
                size = (end - start) * cols[index]
                pieces[index].append(
                    received[offset : offset + size].view(end - start, cols[index])
                )
                offset += size
        owned = [(items[index], pieces[index]) for index in mine]
        for bucket in _owned_buckets(owned):
            self._orthogonalize_owned(bucket)
        back = all_to_all(received, receive_sizes, send_sizes, group)  # `send`'s layout
        pending = []
        for index, item in enumerate(items):
            start, end = ranges[index][rank]
            size = (end - start) * item.cols
            update = back[slots[index] : slots[index] + size].view(end - start, item.cols)
            scale = _adjust(item.rows, item.cols, item.job.group["adjust_lr"])
            pending.append((update, item.job, scale))
        self._apply_rows(pending, group)
        return [items[index] for index in mine]

    def _apply_whole(self, pending: list[tuple[Tensor, _Job, float]]) -> None:
        """Apply orthogonalised updates of whole matrices: ``(update, job, adjust factor)``."""
        for update, job, scale in pending:
            _apply(update, job, scale)

    def _apply_rows(self, pending: list[tuple[Tensor, _Job, float]], process_group: Any) -> None:
        """Apply this rank's rows of sharded matrices' updates (all ranks call it alike).

        Muon's update is elementwise once orthogonalised, so the rows apply
        alone; ``process_group`` is for subclasses whose update needs sums
        over whole matrices.
        """
        self._apply_whole(pending)

    def _orthogonalize_owned(self, bucket: list[tuple[_Sharded, list[Tensor]]]) -> None:
        """Newton-Schulz on whole matrices assembled from every rank's rows; results in place."""
        first = bucket[0][0]
        group, device = first.job.group, first.job.param.device
        buffers, method = self._buffers(group, first.rows, first.cols, device, len(bucket))
        for matrix, (_, parts) in zip(buffers.x, bucket, strict=True):
            torch.cat(parts, out=matrix)
        result = _newton_schulz(buffers, group, method)
        for matrix, (_, parts) in zip(result, bucket, strict=True):
            start = 0
            for part in parts:  # the received rows become the rows sent back
                part.copy_(matrix[start : start + part.shape[0]])
                start += part.shape[0]

    def _adamw(self, group: dict[str, Any], names: dict[int, str] | None) -> list[Tensor]:
        """Step ``group`` with AdamW (a ``DTensor`` on its local part); the parameters stepped."""
        params, grads, exp_avgs, exp_avg_sqs, steps, keys = [], [], [], [], [], []
        for param in group["params"]:
            if param.grad is None:
                continue
            _check_grad(param)
            state = self.state[param]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            tensors = [param.grad, state["exp_avg"], state["exp_avg_sq"]]
            if is_distributed(param):
                label = _described((names or self._names())[id(param)], param)
                slots = ("gradient", "exp_avg", "exp_avg_sq")
                tensors = [
                    _placed_like(param, t, n, label) for t, n in zip(tensors, slots, strict=True)
                ]
            params.append(local(param))
            grads.append(tensors[0])
            exp_avgs.append(tensors[1])
            exp_avg_sqs.append(tensors[2])
            steps.append(state["step"])
            keys.append(param)
        if params:
            _adamw_update(params, grads, exp_avgs, exp_avg_sqs, steps, keys, group, self.state)
        return keys


def _route_row(
    name: str, reason: str, param: Tensor, group: Mapping[str, Any], number: int, matrices: str
) -> ParameterRoute:
    lr = float(group["lr"])
    if group["use_muon"]:
        lr *= adjust_lr_factor(param, group["adjust_lr"])
    algorithm = matrices if group["use_muon"] else "adamw"
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


def _coefficients(group: Mapping[str, Any]) -> tuple[float, float, float] | str:
    """The group's ``ns_coefficients``: a schedule name, or (a, b, c) as a tuple."""
    value = group["ns_coefficients"]
    return value if isinstance(value, str) else tuple(value)


def _bucket_key(
    shape: tuple[int, int], device: torch.device, group: Mapping[str, Any], index: int
) -> tuple[Any, ...]:
    """Matrices with equal keys share one batched Newton-Schulz call."""
    return (
        shape,
        device,
        _ns_dtype(group, device),
        group["ns_steps"],
        _coefficients(group),
        group["eps"],
        group["ns_method"],
        None if _batched(group, device) else index,
    )


def _buckets(jobs: list[_Job]) -> list[list[_Job]]:
    """Jobs that can share one batched Newton-Schulz call (same shape and settings)."""
    buckets: dict[tuple[Any, ...], list[_Job]] = {}
    for index, job in enumerate(jobs):
        key = _bucket_key(matrix_shape(job.param), job.param.device, job.group, index)
        buckets.setdefault(key, []).append(job)
    return list(buckets.values())


_Owned = tuple[_Sharded, list[Tensor]]


def _owned_buckets(owned: list[_Owned]) -> list[list[_Owned]]:
    """Owned sharded matrices (with their received rows) that can share one Newton-Schulz call."""
    buckets: dict[tuple[Any, ...], list[_Owned]] = {}
    for index, entry in enumerate(owned):
        item = entry[0]
        key = _bucket_key((item.rows, item.cols), item.job.param.device, item.job.group, index)
        buckets.setdefault(key, []).append(entry)
    return list(buckets.values())


def _newton_schulz(buffers: Buffers, group: Mapping[str, Any], method: str) -> Tensor:
    return newton_schulz_(
        buffers,
        steps=group["ns_steps"],
        coefficients=_coefficients(group),
        eps=group["eps"],
        method=method,
    )


def _described(label: str, param: Tensor) -> str:
    """The parameter's name, or for an unnamed one ``#i (shape RxC)``."""
    if not label.startswith("#"):
        return label
    return f"{label} (shape {'x'.join(str(size) for size in param.shape)})"


def _placed_like(param: Tensor, tensor: Tensor, slot: str, label: str) -> Tensor:
    """The local part of ``param``'s gradient or state ``tensor``, after checking it is
    placed as ``param`` is (else its local part would not match the parameter's).

    Raises:
        UnsupportedPlacementError: naming the parameter and the slot.
    """
    same = (
        is_distributed(tensor)
        and tensor.placements == param.placements  # type: ignore[attr-defined]
        and tensor.device_mesh == param.device_mesh  # type: ignore[attr-defined]
        and tensor.shape == param.shape
    )
    if not same:
        found = (
            f"has {describe_placement(tensor)}" if is_distributed(tensor) else "is a plain tensor"
        )
        raise UnsupportedPlacementError(
            label,
            f"its {slot} (shape {tuple(tensor.shape)}) {found}, but the parameter has "
            f"{describe_placement(param)}; they must be placed alike",
        )
    return local(tensor)


def _check_rows(param: Any, label: str) -> None:
    """The local shard of a ``Shard(0)`` parameter holds the rows ``torch.chunk`` gives this rank.

    Raises:
        UnsupportedPlacementError: another split (e.g. a custom ``Shard(0)`` layout).
    """
    mesh = param.device_mesh
    start, end = row_ranges(param.shape[0], mesh.size())[mesh.get_local_rank()]
    held = local(param).shape[0]
    if held != end - start:
        raise UnsupportedPlacementError(
            label,
            f"its local shard has {held} of {param.shape[0]} rows where the even "
            f"(torch.chunk) split gives this rank {end - start}; Muon supports that split only",
        )


def _report(
    names: Mapping[int, str],
    jobs: Sequence[_Job],
    sharded: Sequence[_Sharded],
    owned: Sequence[_Sharded],
    elementwise: Sequence[Tensor],
    collectives: int,
) -> StepReport:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    world = torch.distributed.get_world_size() if distributed else 1
    gathered = tuple(item.label for item in owned)
    here = tuple(names[id(job.source)] for job in jobs)
    cost = sum(newton_schulz_cost(*matrix_shape(job.param)) for job in jobs)
    cost += sum(newton_schulz_cost(item.rows, item.cols) for item in owned)
    return StepReport(
        rank=rank,
        world=world,
        orthogonalized=here + gathered,
        gathered=gathered,
        replicated=tuple(names[id(job.source)] for job in jobs if is_distributed(job.source)),
        sharded=tuple(item.label for item in sharded),
        elementwise=tuple(names[id(param)] for param in elementwise),
        ns_cost=cost,
        collectives=collectives,
    )


def _direction(out: Tensor, job: _Job) -> None:
    """Write the (Nesterov) momentum direction of ``job`` into ``out`` (its 2-D shape)."""
    buffer = job.buffer.reshape(out.shape)
    if job.group["nesterov"]:
        torch.lerp(job.grad.reshape(out.shape), buffer, job.group["momentum"], out=out)
    else:
        out.copy_(buffer)


def _apply(update: Tensor, job: _Job, scale: float) -> None:
    """``p = p * (1 - lr * wd) - lr * scale * update`` (``scale``: the ``adjust_lr`` factor).

    With ``weight_decay_mode="cautious"`` the decay applies only where
    ``update * p >= 0`` (the step moves ``p`` towards zero, so decay agrees
    with it): Chen et al., "Cautious Weight Decay", arXiv 2510.12402, as in
    the modded-nanogpt speedrun. The mask is taken before ``p`` changes.
    """
    param, group = job.param, job.group
    lr, weight_decay = group["lr"], group["weight_decay"]
    update = update.view(param.shape)
    if weight_decay != 0:
        if group["weight_decay_mode"] == "cautious":
            agree = torch.mul(update, param).ge_(0).to(param.dtype)
            param.sub_(agree.mul_(param).mul_(lr * weight_decay))
        else:
            param.mul_(1 - lr * weight_decay)
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
    keys: list[Tensor],
    group: Mapping[str, Any],
    state: Any,
) -> None:
    """torch's AdamW kernel: fused where supported (fastest on CPU and GPU), else the loop.

    Inside ``torch.compile`` always the loop: torch keeps its fused kernel out
    of graphs (``torch.compiler.disable``, a graph break), and the compiler
    fuses the loop's ops itself. ``params`` may be the local parts
    of ``DTensor`` parameters; ``keys`` are the optimizer's parameters (the state's keys).
    """
    fused = fused_supported(params) and not torch.compiler.is_compiling()
    if fused:
        for index, (param, step, key) in enumerate(zip(params, steps, keys, strict=True)):
            if step.device != param.device:  # loaded from a CPU checkpoint
                steps[index] = state[key]["step"] = step.to(param.device)
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

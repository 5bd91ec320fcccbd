"""Optimizer checkpoints on disk: atomic, verified, validated before use.

::

    from optiplug import checkpoint

    checkpoint.save("ckpt/opt", optimizer, epoch=3)      # a directory, written atomically
    result = checkpoint.load("ckpt/opt", optimizer)      # verified, then loaded all-or-nothing
    result.extra["epoch"]                                # 3
    checkpoint.verify("ckpt/opt")                        # what it holds, without an optimizer

A checkpoint is a directory holding ``tensors.safetensors`` (every state
tensor), ``metadata.json`` (schema version, algorithm, implementation,
plugin and versions, parameter names/shapes/dtypes, hyperparameters, the
SHA-256 of the tensor file, a checkpoint id, your ``extra`` data) and a
``COMMITTED`` marker written last (holding the SHA-256 of the metadata).
Nothing is used before the marker, both hashes, the schema and the
safetensors header have been checked. :func:`verify` and :func:`load` reach
the same verdict on a checkpoint (one routine checks it), and :func:`save`
refuses a state that would not load back (a NaN in a moment estimate, say),
leaving an earlier checkpoint at the path as it was. :func:`export_torch` and
:func:`import_torch` exchange a plain ``torch.save`` file of the state dict
instead (loadable with ``torch.load(..., weights_only=True)``).

:func:`save_sharded` and :func:`load_sharded` keep a model and its optimizer
(FSDP2 ``DTensor`` shards, or plain tensors) through
``torch.distributed.checkpoint``: every rank writes its own shards, the same
guarantees hold (hashes, a marker written last, all-or-nothing loading,
problems of every rank reported together) and the world size may change
between saving and loading. :func:`verify` reads both kinds.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as to_bytes

from ._checkpoint.format import (
    ALLOWED_FILES,
    FORMAT,
    MARKER,
    METADATA,
    SCHEMA_VERSION,
    TENSORS,
    Stored,
    check_stored,
    decode,
    encode,
    read_checkpoint,
    sha256,
)
from ._checkpoint.io import publish_directory, write_atomic_file, write_durable
from ._checkpoint.schema import check_metadata, parse_object
from ._checkpoint.sharded import is_sharded, read_steps, verify_sharded
from ._checkpoint.sharded import load_sharded as _load_sharded
from ._checkpoint.sharded import save_sharded as _save_sharded
from ._checkpoint.state import snapshot, state_dict_from, stored_target, unshared
from ._core.registry import Registry, bound_registry
from ._core.specs import OptimizerSpec, Problem, ProviderInfo
from ._lazy import LazyCallable
from ._state.check import check
from ._state.load import load_state_dict, registry_of, spec_of, validate_state_dict
from .errors import CheckpointError, OptiplugError, StateDictError

__all__ = [
    "CheckpointInfo",
    "LoadResult",
    "ParameterInfo",
    "export_torch",
    "extra_tensors",
    "import_torch",
    "load",
    "load_sharded",
    "load_stored",
    "save",
    "save_sharded",
    "verify",
]

PathLike = str | os.PathLike[str]


@attrs.frozen
class ParameterInfo:
    """One parameter as a checkpoint recorded it.

    Attributes:
        index: position over all param groups.
        name: its name, when the optimizer was built from named parameters.
        group: its param-group index.
        shape: its shape.
        dtype: its dtype name (``"float32"``).
        slots: the state slots saved for it (empty before its first step).
    """

    index: int
    name: str | None
    group: int
    shape: tuple[int, ...]
    dtype: str
    slots: tuple[str, ...]


@attrs.frozen
class CheckpointInfo:
    """What a verified checkpoint holds.

    Attributes:
        path: the checkpoint directory.
        checkpoint_id: unique per save.
        created: UTC time of the save (ISO 8601).
        algorithm: the optimizer's algorithm name.
        implementation: ``"loop"``, ``"foreach"``, ``"fused"``... when known.
        optimizer_class: ``"module:Class"`` of the saved optimizer.
        plugin: the plugin that provided the algorithm, when known.
        versions: optiplug, torch, safetensors and Python versions at save time.
        parameters: each parameter's record.
        hyperparameters: each group's saved hyperparameters.
        steps: the distinct values of the ``step`` slot, sorted (empty if none).
        tensor_count: tensors in the tensor file.
        tensor_bytes: size of the tensor file.
        sha256: SHA-256 of the tensor file.
        extra: the user data given to :func:`save`.
        problems: filled by :func:`verify`: the saved state checked against
            its own recorded parameters and its algorithm's schema (empty
            when valid, and always empty from :func:`save` and :func:`load`).
        world_size: for a sharded checkpoint (:func:`save_sharded`), the
            number of ranks that wrote it; None for a single-file one. Its
            ``tensor_count`` counts DCP's entries, ``tensor_bytes`` all
            files, ``sha256`` is that of DCP's ``.metadata`` index, and
            ``steps`` is filled by :func:`verify` only (read from the shards).
    """

    path: str
    checkpoint_id: str
    created: str
    algorithm: str
    implementation: str | None
    optimizer_class: str
    plugin: ProviderInfo | None
    versions: dict[str, str] = attrs.field(eq=False)
    parameters: tuple[ParameterInfo, ...]
    hyperparameters: tuple[dict[str, Any], ...] = attrs.field(eq=False)
    steps: tuple[float, ...]
    tensor_count: int
    tensor_bytes: int
    sha256: str
    extra: dict[str, Any] = attrs.field(eq=False)
    problems: tuple[Problem, ...] = ()
    world_size: int | None = None


@attrs.frozen
class LoadResult:
    """What :func:`load` did.

    Attributes:
        info: the checkpoint that was loaded.
        problems: problems skipped (``strict=False``) and
            ``hyperparameter-changed`` notes (the checkpoint's values won).
        tensors: the named tensors given to :func:`save` as ``tensors=``.
    """

    info: CheckpointInfo
    problems: tuple[Problem, ...]
    tensors: dict[str, torch.Tensor] = attrs.field(factory=dict, eq=False)

    @property
    def extra(self) -> dict[str, Any]:
        """The user data given to :func:`save`."""
        return self.info.extra


def save(
    path: PathLike,
    optimizer: Any,
    *,
    tensors: Mapping[str, torch.Tensor] | None = None,
    **extra: Any,
) -> CheckpointInfo:
    """Save ``optimizer``'s state to the directory ``path``, atomically.

    The directory is written under a temporary name in the same parent,
    every file fsynced, the commit marker written last, then renamed into
    place (an earlier checkpoint at ``path`` is replaced atomically; a crash
    at any point leaves the earlier one intact).

    Args:
        path: the checkpoint directory (created; parents too).
        optimizer: any ``torch.optim.Optimizer``.
        tensors: further named tensors to keep in the same verified tensor
            file (a model's state dict, RNG states...); :func:`load` returns
            them as ``LoadResult.tensors``.
        **extra: JSON-serialisable data to keep with it (epoch, notes...).

    Returns:
        The :class:`CheckpointInfo` of what was written.

    Raises:
        TypeError: ``extra`` is not JSON-serialisable.
        StateDictError: the state would not load back (non-finite values,
            wrong shapes...: the problems :func:`load` would report); nothing
            was written.
        CheckpointError: ``path`` holds something other than a checkpoint,
            the state holds a value that cannot be stored, or the file system
            refused (no space left, read-only...); an earlier checkpoint at
            ``path`` is unchanged.
    """
    _check_extra(extra)
    registry = registry_of(optimizer)
    spec = spec_of(optimizer, registry)
    metadata, stored = snapshot(optimizer, spec, extra)
    added: dict[str, torch.Tensor] = {}
    metadata["extra_tensors"] = {
        key: encode(value, f"extra_tensors.{key}", added) for key, value in (tensors or {}).items()
    }
    stored = unshared({**stored, **added})
    data, text = _files(Path(path), metadata, stored)
    written = Stored(Path(path), json.loads(text), safetensors_load(data))
    _refuse_invalid(written, optimizer, registry, spec)
    checkpoint_id = metadata["checkpoint_id"]
    publish_directory(
        Path(path), lambda d: _write(d, checkpoint_id, data, text), ALLOWED_FILES, marker=MARKER
    )
    return _info(Path(path), metadata, stored)


def _refuse_invalid(
    written: Stored, optimizer: Any, registry: Registry, spec: OptimizerSpec
) -> None:
    """Raise, before anything is written, what a strict :func:`load` of ``written`` would raise.

    ``written`` is the checkpoint as it will be on disk (its metadata and
    tensors decoded from the bytes about to be written), checked by the
    validator :func:`load` uses (:func:`_refusal`), against ``optimizer``.
    """
    _, _, problems = _refusal(written, optimizer, registry)
    if problems:
        header = (
            f"refusing to save {spec.name} state to {written.path}: it would not load back, "
            "so nothing was written (an earlier checkpoint there is unchanged)"
        )
        raise StateDictError(problems, header=header)


def _refusal(
    stored: Stored, optimizer: Any, registry: Registry
) -> tuple[dict[str, Any], list[Problem], list[Problem]]:
    """The one validator :func:`save` and :func:`load` share: what a strict load refuses.

    The checkpoint's state against its own records (:func:`_examine`, as
    :func:`verify` checks it), its algorithm against ``optimizer``'s, and the
    state as loading it into ``optimizer`` checks it
    (:func:`optiplug.validate_state_dict`: the optimizer's load pre-hooks,
    then the schema and the plugins' validators).

    Returns:
        The state dict the checkpoint holds; the problems of the checkpoint
        itself (its own records, its algorithm), which a partial load
        reports; and every problem, sorted.
    """
    state_dict, own = _examine(stored, registry)
    mismatch = _algorithm_problems(stored.metadata, spec_of(optimizer, registry))
    fit = validate_state_dict(optimizer, state_dict, registry=registry)
    return state_dict, [*mismatch, *own], sorted({*own, *mismatch, *fit})


def _check_extra(extra: Mapping[str, Any]) -> None:
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as error:
        message = f"checkpoint extra data must be JSON-serialisable: {error}"
        raise TypeError(message) from error


def _files(
    path: Path, metadata: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> tuple[bytes, bytes]:
    """The tensor file's and the metadata's bytes, checked as loading will check them.

    Raises:
        CheckpointError: what loading would refuse (extra data nested too deep...).
    """
    header = {"format": FORMAT, "checkpoint_id": metadata["checkpoint_id"]}
    data = to_bytes(tensors, metadata=header)
    metadata["tensors"] = {
        "file": TENSORS,
        "sha256": sha256(data),
        "bytes": len(data),
        "count": len(tensors),
    }
    text = json.dumps(metadata, indent=1).encode("utf-8")
    try:
        check_metadata(parse_object(text, path / METADATA), path / METADATA, FORMAT, SCHEMA_VERSION)
        check_stored(path, metadata, tensors)
    except CheckpointError as error:
        raise CheckpointError(f"cannot save {path}: {error}") from error
    return data, text


def _write(directory: Path, checkpoint_id: str, data: bytes, text: bytes) -> None:
    write_durable(directory / TENSORS, data)
    write_durable(directory / METADATA, text)
    marker = {"format": FORMAT, "checkpoint_id": checkpoint_id, "metadata_sha256": sha256(text)}
    write_durable(directory / MARKER, json.dumps(marker).encode("utf-8"))


def load(path: PathLike, optimizer: Any, *, strict: bool = True) -> LoadResult:
    """Verify the checkpoint at ``path``, then load it into ``optimizer``.

    Integrity (marker, hashes, schema, safetensors header) is checked before
    the optimizer is touched; then the state is validated and loaded as by
    :func:`optiplug.load_state_dict` (name-keyed, all-or-nothing, copied).
    A checkpoint of another algorithm is a problem of kind ``algorithm``.

    Args:
        path: the checkpoint directory.
        optimizer: the optimizer to load into.
        strict: False loads what is valid and reports the rest.

    Returns:
        A :class:`LoadResult` (``.extra`` is the data given to :func:`save`).

    Raises:
        CheckpointError: missing, truncated, tampered or foreign files.
        StateDictError: the state does not fit ``optimizer``; it is unchanged.
    """
    return load_stored(read_checkpoint(Path(path)), optimizer, strict=strict)


def load_stored(stored: Stored, optimizer: Any, *, strict: bool = True) -> LoadResult:
    """Load an already verified checkpoint (see :func:`load`) into ``optimizer``.

    The checkpoint is first checked on its own, as :func:`verify` checks it
    (its state against the parameters it recorded); with ``strict`` any
    problem found there refuses the load, so ``optiplug check`` and
    :func:`load` agree.

    Raises:
        StateDictError: the checkpoint's own state is invalid, or it does not
            fit ``optimizer``; the optimizer is unchanged.
    """
    registry = registry_of(optimizer)
    state_dict, recorded = _examine(stored, registry)
    own = [*_algorithm_problems(stored.metadata, spec_of(optimizer, registry)), *recorded]
    try:  # validated once: load_state_dict refuses with ``own`` counted among its problems
        problems = load_state_dict(
            optimizer, state_dict, strict=strict, registry=registry, extra_problems=own
        )
    except StateDictError as error:
        if not strict:
            raise
        spec = spec_of(optimizer, registry)
        where = "holds invalid state (as optiplug check reports)" if own else "does not fit"
        header = f"{stored.path} {where} {spec.name}; nothing was changed"
        raise StateDictError(sorted(set(error.problems)), header=header) from None
    info = _info(stored.path, stored.metadata, stored.tensors)
    return LoadResult(info, tuple(sorted(set(problems))), extra_tensors(stored))


def _examine(stored: Stored, registry: Registry) -> tuple[dict[str, Any], tuple[Problem, ...]]:
    """The state a verified checkpoint holds, and its problems against what it recorded.

    The one check :func:`verify` and :func:`load` share: the saved state
    validated against the checkpoint's own parameter records and its
    algorithm's schema (generic checks when the algorithm is not installed).
    """
    _import_algorithm(stored.metadata, registry)
    state_dict = state_dict_from(stored)
    report = check(_self_target(stored, state_dict, registry), state_dict)
    return state_dict, tuple(sorted(report.problems))


def _saved_spec(metadata: Mapping[str, Any], registry: Registry) -> OptimizerSpec:
    """The spec of the algorithm a checkpoint names, from the plugin that saved it.

    A bridged name may also be a native one (heavyball's ``adamw``): the
    recorded plugin picks the provider, so the checkpoint is checked against
    the schema it was written with. An algorithm not installed here (or a
    checkpoint without a plugin record) falls back to the plain name, then
    to a schema-less spec.
    """
    name = metadata["algorithm"]
    plugin = metadata.get("plugin")
    provider = plugin.get("plugin") if isinstance(plugin, Mapping) else None
    for wanted in (provider, None) if isinstance(provider, str) else (None,):
        try:
            return registry.spec(name, provider=wanted)
        except OptiplugError:
            continue
    return OptimizerSpec(name=name, factory=object)


def _import_algorithm(metadata: Mapping[str, Any], registry: Registry) -> None:
    """Import the module of the algorithm a checkpoint names, where ``registry`` has it.

    Its state's tensor subclasses (a library's quantized state) are then
    importable by name, as in the process that saved it, so :func:`verify`
    in a fresh process reaches :func:`load`'s verdict. Only a registered
    plugin's own factory is imported, never a module the file names; an
    algorithm that is not installed, or whose module fails to import, is
    left to the decoding error, which says what to install.
    """
    factory = _saved_spec(metadata, registry).factory
    if isinstance(factory, LazyCallable):
        try:
            factory.resolve()
        except Exception:  # a broken plugin: the decoding error names the class
            return


def extra_tensors(stored: Stored) -> dict[str, torch.Tensor]:
    """The named tensors given to :func:`save` as ``tensors=``, from a verified checkpoint.

    Raises:
        CheckpointError: the metadata names a tensor the file does not hold.
    """
    records = stored.metadata.get("extra_tensors", {})
    if not isinstance(records, dict):
        raise CheckpointError(f"{stored.path / METADATA} is malformed: field 'extra_tensors'")
    where = f"{stored.path / METADATA}: extra_tensors"
    return {key: decode(value, stored.tensors, where) for key, value in records.items()}


def _algorithm_problems(metadata: Mapping[str, Any], spec: OptimizerSpec) -> list[Problem]:
    """A problem when the checkpoint's algorithm has another name than ``spec``'s.

    The same name from another plugin is not one by itself (a copied
    optimizer is looked up by its class, perhaps in another registry): the
    state checks then say whether the slots fit (heavyball's ``adamw``
    state into optiplug's is ``foreign-state``).
    """
    saved = metadata["algorithm"]
    if saved == spec.name:
        return []
    expected, found = f"a checkpoint of {spec.name}", f"a checkpoint of {saved}"
    return [Problem(slot="algorithm", kind="algorithm", expected=expected, found=found)]


def verify(path: PathLike, *, registry: Registry | None = None) -> CheckpointInfo:
    """Verify the checkpoint at ``path`` and describe it, without an optimizer.

    Besides integrity, the saved state is validated against the parameters
    the checkpoint recorded and its algorithm's state schema (when that
    algorithm is installed; generic checks otherwise); what fails is in
    :attr:`CheckpointInfo.problems`.

    Args:
        path: the checkpoint directory.
        registry: where to look the algorithm up; the default registry when None.

    A sharded checkpoint (:func:`save_sharded`) is verified whole in this
    process: marker, manifest, and every rank's files against their
    SHA-256; its problems are parameters the manifest records that DCP's
    index lacks or holds with another shape.

    Returns:
        The :class:`CheckpointInfo`.

    Raises:
        CheckpointError: missing, truncated, tampered or foreign files.
    """
    if is_sharded(path):
        manifest, index = verify_sharded(path)
        return _sharded_info(Path(path), manifest, index, check=True)
    stored = read_checkpoint(Path(path))
    _, problems = _examine(stored, bound_registry(registry))
    info = _info(stored.path, stored.metadata, stored.tensors)
    return attrs.evolve(info, problems=problems)


def save_sharded(
    path: PathLike, model: torch.nn.Module, optimizer: Any, **extra: Any
) -> CheckpointInfo:
    """Save ``model`` and ``optimizer`` as a sharded checkpoint: every rank writes its own shards.

    Call it on every rank of the process group (or in a single process
    without ``torch.distributed``). Model and optimizer state are taken with
    ``torch.distributed.checkpoint.state_dict`` (keyed by parameter FQN; an
    FSDP2 parameter is a ``DTensor`` and each rank keeps its shards) and
    written with ``torch.distributed.checkpoint.save`` into a staging
    directory; each rank hashes the files it wrote; once every rank has
    finished, rank 0 writes ``manifest.json`` (every file's SHA-256) and the
    ``COMMITTED`` marker last, then renames the directory into place. A rank
    that fails or dies before that leaves an earlier checkpoint at ``path``
    as it was. Every rank must see ``path`` (a shared file system).

    Args:
        path: the checkpoint directory (created; parents too).
        model: the module (``fully_shard``-ed or plain).
        optimizer: its optimizer.
        **extra: JSON-serialisable data to keep with it (rank 0's values).

    Returns:
        The :class:`CheckpointInfo` of what was written (on every rank).

    Raises:
        TypeError: ``extra`` is not JSON-serialisable.
        StateDictError: on some rank the state would not load back (NaN or
            inf, invalid optimizer state): every rank's problems, on every
            rank; nothing was written.
        CheckpointError: ``path`` holds something other than a checkpoint,
            the file system refused, or a rank failed or stopped answering;
            nothing was committed.
    """
    manifest = _save_sharded(path, model, optimizer, extra=extra)
    return _sharded_info(Path(path), manifest, None)


def load_sharded(path: PathLike, model: torch.nn.Module, optimizer: Any) -> LoadResult:
    """Verify a sharded checkpoint on every rank, then load it into ``model`` and ``optimizer``.

    Call it on every rank. The ranks share the hashing of the files, check
    the target's keys, shapes and dtypes against the checkpoint's index,
    read their parts into copies (``torch.distributed.checkpoint.load``
    reshards: any world size, FSDP2 or a plain single-process model) and
    validate them (finite values; the optimizer state as
    :func:`optiplug.load_state_dict` validates it). Every problem of every
    rank is reported on every rank, and only when there is none anywhere are
    ``set_model_state_dict``/``set_optimizer_state_dict`` applied.

    Args:
        path: the checkpoint directory written by :func:`save_sharded`.
        model: the module to load into.
        optimizer: its optimizer (same algorithm and parameters).

    Returns:
        A :class:`LoadResult`: ``.extra`` is the data given to
        :func:`save_sharded`; ``.problems`` is empty (a sharded load is
        always strict) and ``.tensors`` too.

    Raises:
        CheckpointError: missing, truncated or modified files on any rank,
            or a rank failed or stopped answering; nothing was changed.
        StateDictError: the checkpoint does not fit ``model``/``optimizer``
            (missing or unexpected keys, shapes, dtypes, NaN or inf, invalid
            optimizer state); nothing was changed.
    """
    loaded = _load_sharded(path, model, optimizer)
    info = _sharded_info(loaded.path, loaded.manifest, None)
    return LoadResult(info, ())


def _sharded_info(
    path: Path, manifest: Mapping[str, Any], index: Any = None, *, check: bool = False
) -> CheckpointInfo:
    """A sharded checkpoint's manifest as a :class:`CheckpointInfo`.

    With ``check``, the parameters the manifest records are looked up in
    DCP's ``index``: one absent or of another shape is a problem.
    """
    files = manifest["files"]
    parameters = tuple(
        ParameterInfo(
            index=record["index"],
            name=record.get("name"),
            group=record["group"],
            shape=tuple(record["shape"]),
            dtype=record["dtype"],
            slots=tuple(record.get("slots", ())),
        )
        for record in manifest["parameters"]
    )
    problems: list[Problem] = []
    if index is not None and check:
        entries = index.state_dict_metadata
        for parameter in parameters:
            entry = entries.get(f"model.{parameter.name}")
            size = tuple(getattr(entry, "size", ()))
            if entry is None or size != parameter.shape:
                found = "absent" if entry is None else str(list(size))
                problems.append(
                    Problem(
                        parameter=str(parameter.name),
                        kind="missing-key" if entry is None else "shape",
                        expected=str(list(parameter.shape)),
                        found=found,
                    )
                )
    return CheckpointInfo(
        path=str(path),
        checkpoint_id=manifest["checkpoint_id"],
        created=manifest["created"],
        algorithm=manifest["algorithm"],
        implementation=manifest["implementation"],
        optimizer_class=manifest["optimizer_class"],
        plugin=_provider(manifest["plugin"]),
        versions=dict(manifest["versions"]),
        parameters=parameters,
        hyperparameters=tuple(dict(g["hyperparameters"]) for g in manifest["param_groups"]),
        steps=read_steps(path, index) if index is not None and check else (),
        tensor_count=manifest["tensor_count"],
        tensor_bytes=sum(info["bytes"] for info in files.values()),
        sha256=files[".metadata"]["sha256"],
        extra=dict(manifest["extra"]),
        problems=tuple(sorted(problems)),
        world_size=manifest["world_size"],
    )


def _self_target(stored: Stored, state_dict: Mapping[str, Any], registry: Registry) -> Any:
    spec = _saved_spec(stored.metadata, registry)
    others = tuple(registry.optimizer_specs())
    return stored_target(stored, state_dict, spec, others)


def _info(path: Path, metadata: Mapping[str, Any], tensors: Mapping[str, Any]) -> CheckpointInfo:
    slots = {int(k): tuple(v) for k, v in metadata["state"].items()}
    ids = [i for group in metadata["param_groups"] for i in group["params"]]
    plugin = metadata["plugin"]
    return CheckpointInfo(
        path=str(path),
        checkpoint_id=metadata["checkpoint_id"],
        created=metadata["created"],
        algorithm=metadata["algorithm"],
        implementation=metadata["implementation"],
        optimizer_class=metadata["optimizer_class"],
        plugin=_provider(plugin),
        versions=dict(metadata["versions"]),
        parameters=tuple(_parameter(r, ids, slots) for r in metadata["parameters"]),
        hyperparameters=tuple(_hyperparameters(g, tensors) for g in metadata["param_groups"]),
        steps=_steps(metadata, tensors),
        tensor_count=metadata["tensors"]["count"],
        tensor_bytes=metadata["tensors"]["bytes"],
        sha256=metadata["tensors"]["sha256"],
        extra=dict(metadata["extra"]),
    )


def _hyperparameters(group: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    return {k: decode(v, tensors, "param group") for k, v in group["hyperparameters"].items()}


def _provider(plugin: Any) -> ProviderInfo | None:
    if not isinstance(plugin, dict):
        return None
    fields = ("plugin", "distribution", "version")
    return ProviderInfo(*(str(plugin.get(field, "?")) for field in fields))


def _parameter(
    record: Mapping[str, Any], ids: list[Any], slots: Mapping[int, tuple[str, ...]]
) -> ParameterInfo:
    index = record["index"]
    saved_id = ids[index] if isinstance(index, int) and 0 <= index < len(ids) else None
    return ParameterInfo(
        index=index,
        name=record.get("name"),
        group=record["group"],
        shape=tuple(record["shape"]),
        dtype=record["dtype"],
        slots=slots.get(saved_id, ()) if saved_id is not None else (),
    )


def _steps(metadata: Mapping[str, Any], tensors: Mapping[str, Any]) -> tuple[float, ...]:
    values = set()
    for entry in metadata["state"].values():
        step = entry.get("step") if isinstance(entry, dict) else None
        if isinstance(step, dict) and step.get("tensor") in tensors:
            tensor = tensors[step["tensor"]]
            if tensor.numel() == 1 and tensor.is_floating_point():
                values.add(float(tensor.reshape(()).item()))
        elif isinstance(step, (int, float)) and not isinstance(step, bool):
            values.add(float(step))
    return tuple(sorted(values))


def export_torch(path: PathLike, optimizer: Any) -> None:
    """Write ``optimizer.state_dict()`` as a plain torch file, atomically.

    The file loads with ``torch.load(path, weights_only=True)`` into plain
    torch (``torch.optim.AdamW.load_state_dict``) or with :func:`import_torch`.
    The state is serialised in memory first (as :func:`save` does), then
    written, so a write the file system refuses is an ``OSError`` with its
    reason rather than torch's stream-writer failure.

    Args:
        path: the file to write (replaced atomically if it exists).
        optimizer: any ``torch.optim.Optimizer``.

    Raises:
        CheckpointError: the file system refused (no space left, file too
            large, read-only...); ``path`` is unchanged and no temporary is left.
    """
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    data = buffer.getbuffer()
    write_atomic_file(Path(path), lambda temporary: _write_all(temporary, data))


def _write_all(path: Path, data: memoryview) -> None:
    """Write ``data`` to the existing file ``path`` (a short write is an ``OSError``)."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()


def import_torch(path: PathLike, optimizer: Any, *, strict: bool = True) -> list[Problem]:
    """Load a torch-format optimizer state dict file, validated like a checkpoint.

    The file is read with ``torch.load(weights_only=True)`` (no arbitrary
    code) onto the CPU, then loaded as by :func:`optiplug.load_state_dict`.

    Args:
        path: a file written by :func:`export_torch` or ``torch.save(opt.state_dict())``.
        optimizer: the optimizer to load into.
        strict: False loads what is valid and reports the rest.

    Returns:
        As :func:`optiplug.load_state_dict`.

    Raises:
        CheckpointError: the file is missing, truncated or not a torch file.
        StateDictError: the state does not fit ``optimizer``; it is unchanged.
    """
    try:
        state_dict = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as error:
        raise CheckpointError(f"no torch state file at {path}") from error
    except Exception as error:
        message = f"{path} is not a readable torch file (truncated or corrupt?): {error}"
        raise CheckpointError(message) from error
    return load_state_dict(optimizer, state_dict, strict=strict)

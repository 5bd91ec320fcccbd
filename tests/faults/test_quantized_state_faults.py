"""Quantized optimizer state under fault: crafted slots, failed loads, precision switches.

Every test asserts the state after the fault, not only that an error was
raised: a refused load leaves the optimizer's state and groups exactly as
they were, and a refused step leaves parameters and state untouched.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from state_helpers import forge_tensors, stored_tensors

import optiplug
from optiplug import checkpoint
from optiplug.base import QuantizedState
from optiplug.errors import HyperparameterError, StateDictError


def _stepped(name: str, shape: tuple[int, ...], **hparams: object) -> torch.optim.Optimizer:
    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(shape, generator=generator))
    optimizer = optiplug.create(name, [param], **hparams)
    for _ in range(2):
        param.grad = torch.randn(shape, generator=generator)
        optimizer.step()
    return optimizer


# ------------------------------------------------------------------ optiplug check in a fresh process
CHECKED = {
    "int8-adamw": ("adamw", {"lr": 1e-3, "state_precision": "int8"}),
    "int8-muon-factors": ("muon", {"lr": 0.02, "state_precision": "int8"}),
    "torchao-adamw8bit": ("torchao:adamw8bit", {"lr": 1e-3}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CHECKED))
def test_check_in_a_fresh_process_accepts_a_quantized_checkpoint_load_accepts(
    tmp_path: Path, case: str
) -> None:
    name, hparams = CHECKED[case]
    optimizer = _stepped(name, (256, 64), **hparams)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    checkpoint.load(tmp_path / "ckpt", _stepped(name, (256, 64), **hparams))  # load's verdict
    checked = subprocess.run(
        [sys.executable, "-m", "optiplug", "check", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{tmp_path / 'ckpt'}: OK" in checked.stdout


# ------------------------------------------------------------------ crafted slots
def _state_snapshot(optimizer: torch.optim.Optimizer) -> list[dict[str, object]]:
    """Every slot's parts, cloned: codes, scales, factors and labels of a quantized slot."""
    taken = []
    for param in (p for g in optimizer.param_groups for p in g["params"]):
        entry = {}
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, QuantizedState):
                parts = [value.codes, value.scales, value.factors]
                labels = (value.precision, value.signed, value.linear, value.writes)
                entry[key] = ([None if t is None else t.clone() for t in parts], labels)
            else:
                entry[key] = value.clone() if isinstance(value, torch.Tensor) else value
        taken.append(entry)
    return taken


def _same_snapshot(a: list[dict[str, object]], b: list[dict[str, object]]) -> bool:
    def same(x: object, y: object) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            return len(x) == len(y) and all(same(i, j) for i, j in zip(x, y, strict=True))
        return type(x) is type(y) and x == y

    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(same(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )


def _rebuilt(slot: QuantizedState, **parts: object) -> QuantizedState:
    """``slot`` with some of its parts or labels replaced, as a crafted checkpoint holds it."""
    given = {
        "codes": slot.codes.clone(),
        "scales": slot.scales.clone(),
        "precision": slot.precision,
        "signed": slot.signed,
        "shape": slot.shape,
        "dtype": slot.dtype,
        "writes": slot.writes,
        "linear": slot.linear,
        "factors": None if slot.factors is None else slot.factors.clone(),
    }
    given.update(parts)
    return QuantizedState(**given)  # type: ignore[arg-type]


Craft = Callable[[QuantizedState], QuantizedState]
CRAFTED: dict[str, tuple[str, str, str, Craft]] = {
    # name: (algorithm, precision, slot, craft)
    "empty-codes": ("adamw", "int8", "exp_avg", lambda s: _rebuilt(s, codes=s.codes[:0])),
    "truncated-codes": ("adamw", "int8", "exp_avg", lambda s: _rebuilt(s, codes=s.codes[:-7])),
    "doubled-codes": (
        "adamw", "int8", "exp_avg", lambda s: _rebuilt(s, codes=torch.cat((s.codes, s.codes)))
    ),
    "int4-odd-codes": ("adamw", "int4", "exp_avg", lambda s: _rebuilt(s, codes=s.codes[:-1])),
    "a-block-short": ("adamw", "int8", "exp_avg_sq", lambda s: _rebuilt(s, scales=s.scales[:-1])),
    "a-block-over": (
        "adamw", "int8", "exp_avg", lambda s: _rebuilt(s, scales=torch.cat((s.scales, s.scales)))
    ),
    "negative-scales": ("adamw", "int8", "exp_avg_sq", lambda s: _rebuilt(s, scales=-s.scales)),
    "nan-scale": (
        "adamw", "int4", "exp_avg", lambda s: _rebuilt(s, scales=s.scales.index_fill(0, torch.tensor([0]), float("nan")))
    ),
    "int64-codes": ("adamw", "int8", "exp_avg", lambda s: _rebuilt(s, codes=s.codes.long())),
    "float32-codes": ("adamw", "int8", "exp_avg", lambda s: _rebuilt(s, codes=s.codes.float())),
    "float16-scales": ("adamw", "int8", "exp_avg", lambda s: _rebuilt(s, scales=s.scales.half())),
    "bf16-label-on-uint8": ("adamw", "int8", "exp_avg", lambda s: _rebuilt(s, precision="bf16")),
    "flipped-signed-second-moment": (
        "adamw", "int8", "exp_avg_sq", lambda s: _rebuilt(s, signed=True)
    ),
    "unsigned-first-moment": ("lion", "int8", "exp_avg", lambda s: _rebuilt(s, signed=False)),
    "int3-precision": ("adamw", "int8", "exp_avg", lambda s: _rebuilt(s, precision="int3")),
    "negative-writes": ("adamw", "bf16", "exp_avg", lambda s: _rebuilt(s, writes=-1)),
    "bf16-short": ("adamw", "bf16", "exp_avg", lambda s: _rebuilt(s, codes=s.codes[:-1])),
    "muon-factors-1e30": (
        "muon", "int8", "momentum_buffer", lambda s: _rebuilt(s, factors=s.factors * 1e30)
    ),
    "muon-factors-q-1e30": (
        "muon", "int8", "momentum_buffer",
        lambda s: _rebuilt(s, factors=torch.cat((s.factors[:256], s.factors[256:] * 1e30))),
    ),
    "muon-factors-wrong-shape": (
        "muon", "int8", "momentum_buffer", lambda s: _rebuilt(s, factors=s.factors[:-1])
    ),
    "muon-factors-transposed": (
        "muon", "int8", "momentum_buffer", lambda s: _rebuilt(s, factors=s.factors.T.contiguous())
    ),
    "muon-factors-not-orthonormal": (
        "muon", "int8", "momentum_buffer",
        lambda s: _rebuilt(s, factors=torch.cat((s.factors[:256] * 3, s.factors[256:]))),
    ),
}  # fmt: skip
HPARAMS = {"adamw": {"lr": 1e-3}, "lion": {"lr": 1e-4}, "muon": {"lr": 0.02}}


def _crafted_state_dict(case: str) -> tuple[torch.optim.Optimizer, dict[str, object]]:
    """A stepped optimizer of the case's kind, and a state dict holding the crafted slot."""
    name, precision, slot, craft = CRAFTED[case]
    source = _stepped(name, (256, 64), state_precision=precision, **HPARAMS[name])
    state_dict = source.state_dict()
    state_dict["state"][0][slot] = craft(state_dict["state"][0][slot])
    target = _stepped(name, (256, 64), state_precision=precision, **HPARAMS[name])
    return target, state_dict


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_quantized_slot_is_refused_by_load_with_nothing_changed(case: str) -> None:
    optimizer, state_dict = _crafted_state_dict(case)
    before, groups = _state_snapshot(optimizer), copy.deepcopy(optimizer.param_groups[0]["lr"])
    with pytest.raises(StateDictError, match="nothing was changed"):
        optiplug.load_state_dict(optimizer, state_dict)
    assert _same_snapshot(_state_snapshot(optimizer), before)
    assert optimizer.param_groups[0]["lr"] == groups
    param = optimizer.param_groups[0]["params"][0]
    param.grad = torch.ones_like(param)
    optimizer.step()  # the state it kept still steps
    assert bool(torch.isfinite(param).all())


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_save_refuses_a_crafted_quantized_slot_and_keeps_the_checkpoint_before(
    tmp_path: Path, case: str
) -> None:
    optimizer, state_dict = _crafted_state_dict(case)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    before = {f.name: f.read_bytes() for f in (tmp_path / "ckpt").iterdir()}
    _, _, slot, _ = CRAFTED[case]
    param = optimizer.param_groups[0]["params"][0]
    optimizer.state[param][slot] = state_dict["state"][0][slot]  # held by the optimizer itself
    with pytest.raises(StateDictError):
        checkpoint.save(tmp_path / "ckpt", optimizer)
    assert {f.name: f.read_bytes() for f in (tmp_path / "ckpt").iterdir()} == before


def test_the_decoder_refuses_codes_of_another_size_before_reading() -> None:
    slot = QuantizedState.encode(torch.randn(4096), "int8", signed=True)
    for crafted in (
        _rebuilt(slot, codes=slot.codes[:0]),
        _rebuilt(slot, codes=slot.codes[:100]),
        _rebuilt(slot, scales=slot.scales[:1]),
        _rebuilt(slot, codes=slot.codes.long()),
    ):
        with pytest.raises(ValueError, match="QuantizedState of 4096 elements"):
            crafted.dequantize()


# ------------------------------------------------------------------ switching a group's precision
SWITCHED = {
    "adamw": {"lr": 1e-3},
    "lion": {"lr": 1e-4},
    "muon": {"lr": 0.02},
    "sgd": {"lr": 0.1, "momentum": 0.9},
}


def _decoded_state_dict(optimizer: torch.optim.Optimizer) -> dict[str, object]:
    state_dict = optimizer.state_dict()  # its entries are the optimizer's own dicts: not changed
    state_dict["state"] = {
        index: {k: v.dequantize() if isinstance(v, QuantizedState) else v for k, v in entry.items()}
        for index, entry in state_dict["state"].items()
    }
    return state_dict


@pytest.mark.parametrize("precision", ["int8", "int4", "bf16"])
@pytest.mark.parametrize("name", sorted(SWITCHED))
def test_switching_a_group_to_fp32_decodes_its_state_before_the_step(
    name: str, precision: str
) -> None:
    optimizer = _stepped(name, (256, 64), state_precision=precision, **SWITCHED[name])
    param = optimizer.param_groups[0]["params"][0]
    reference_param = torch.nn.Parameter(param.detach().clone())
    reference = optiplug.create(name, [reference_param], **SWITCHED[name])
    optiplug.load_state_dict(reference, _decoded_state_dict(optimizer))
    optimizer.param_groups[0]["state_precision"] = "fp32"
    grad = torch.randn(param.shape, generator=torch.Generator().manual_seed(1))
    param.grad, reference_param.grad = grad.clone(), grad.clone()
    optimizer.step()
    reference.step()
    # the same kernel on the same float32 values: the same bits
    assert torch.equal(param, reference_param)
    assert not any(isinstance(v, QuantizedState) for v in optimizer.state[param].values())


@pytest.mark.parametrize("name", sorted(SWITCHED))
def test_an_unknown_precision_is_refused_before_the_step_touches_anything(name: str) -> None:
    optimizer = _stepped(name, (256, 64), state_precision="int8", **SWITCHED[name])
    param = optimizer.param_groups[0]["params"][0]
    before, value = _state_snapshot(optimizer), param.detach().clone()
    optimizer.param_groups[0]["state_precision"] = "int2"
    param.grad = torch.ones_like(param)
    with pytest.raises(HyperparameterError, match="state_precision='int2'"):
        optimizer.step()
    assert torch.equal(param, value)
    assert _same_snapshot(_state_snapshot(optimizer), before)


# ------------------------------------------------------------------ any crafted slot (hypothesis)
SHAPE = (64, 80)  # 5120 elements: quantized (at least 4096), int8 in 20 blocks, int4 in 40
DTYPES = [torch.uint8, torch.int8, torch.int64, torch.float32, torch.bfloat16, torch.float16]
SPECIAL = [0.0, -1.0, 1e-45, 3e38, float("inf"), float("-inf"), float("nan")]


MUTATIONS = [
    "precision", "codes-size", "scales-size", "codes-dtype", "scales-dtype", "outer-dtype",
    "signed", "linear", "scale-value", "writes", "codes-values",
]  # fmt: skip


def _linear(slot: str, precision: str) -> bool:
    """Whether adamw's ``slot`` takes the linear table in ``precision`` (int4 second moments)."""
    return slot == "exp_avg_sq" and precision == "int4"


def _sized(draw: st.DrawFn, tensor: torch.Tensor) -> torch.Tensor:
    n = tensor.numel()
    size = draw(st.sampled_from([0, n - 1, n + 1, 2 * n, draw(st.integers(0, 12_000))]))
    return torch.cat((tensor, tensor, tensor))[: max(0, size)] if size != n else tensor[:0]


@st.composite
def _crafted_slot(draw: st.DrawFn) -> tuple[str, QuantizedState]:
    """A slot a write could give (any precision, table, value scale), with up to two parts or
    labels crafted (see :data:`MUTATIONS`); about a third of them are not crafted at all."""
    slot = draw(st.sampled_from(["exp_avg", "exp_avg_sq"]))
    precision = draw(st.sampled_from(["int8", "int4", "bf16"]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    value = torch.randn(SHAPE, generator=generator) * draw(st.sampled_from([1e-6, 1.0, 1e20]))
    if slot == "exp_avg_sq":
        value = value.abs()
    linear = _linear(slot, precision)
    made = QuantizedState.encode(
        value, precision, signed=slot != "exp_avg_sq", writes=3, linear=linear
    )
    parts = {"codes": made.codes, "scales": made.scales, "precision": precision}
    parts |= {"signed": made.signed, "dtype": torch.float32, "writes": 3, "linear": made.linear}
    chosen = draw(st.lists(st.sampled_from(MUTATIONS), max_size=2)) if draw(st.booleans()) else []
    for mutation in chosen:
        _mutate(draw, parts, mutation)
    crafted = QuantizedState(
        parts["codes"], parts["scales"], parts["precision"], parts["signed"], SHAPE,
        parts["dtype"], parts["writes"], parts["linear"],
    )  # fmt: skip
    return slot, crafted


def _mutate(draw: st.DrawFn, parts: dict[str, Any], mutation: str) -> None:
    if mutation == "precision":
        parts["precision"] = draw(st.sampled_from(["int8", "int4", "bf16", "int3", "fp8", ""]))
    elif mutation in ("codes-size", "scales-size"):
        key = mutation.removesuffix("-size")
        parts[key] = _sized(draw, parts[key])
    elif mutation == "codes-dtype":
        parts["codes"] = parts["codes"].to(draw(st.sampled_from(DTYPES)))
    elif mutation == "scales-dtype":
        dtype = draw(st.sampled_from([torch.float16, torch.float64, torch.bfloat16]))
        parts["scales"] = parts["scales"].to(dtype)
    elif mutation == "outer-dtype":
        parts["dtype"] = draw(st.sampled_from([torch.float64, torch.float16, torch.int64]))
    elif mutation in ("signed", "linear"):
        parts[mutation] = not parts[mutation]
    elif mutation == "writes":
        parts["writes"] = draw(st.sampled_from([-1, -(2**40), 2**40]))
    elif mutation == "scale-value" and parts["scales"].numel():
        scales = parts["scales"].clone()
        scales[draw(st.integers(0, scales.numel() - 1))] = draw(st.sampled_from(SPECIAL))
        parts["scales"] = scales
    elif mutation == "codes-values":
        codes = parts["codes"].clone()
        codes.view(-1)[: draw(st.integers(0, codes.numel()))] = draw(st.sampled_from([0, 255]))
        parts["codes"] = codes


def _parts_of(value: QuantizedState) -> tuple[object, ...]:
    if value.precision == "bf16":  # no table: its signed and linear labels say nothing
        return (value.codes, value.scales, value.precision)
    return (value.codes, value.scales, value.precision, value.signed, value.linear)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crafted=_crafted_slot(), precision=st.sampled_from(["int8", "int4", "bf16"]))
def test_any_crafted_slot_loads_exactly_or_is_refused_with_nothing_changed(
    crafted: tuple[str, QuantizedState], precision: str
) -> None:
    slot, value = crafted
    source = _stepped("adamw", SHAPE, lr=1e-3, state_precision=precision)
    state_dict = source.state_dict()
    state_dict["state"] = {0: {**state_dict["state"][0], slot: value}}
    optimizer = _stepped("adamw", SHAPE, lr=1e-3, state_precision=precision)
    before = _state_snapshot(optimizer)
    try:
        optiplug.load_state_dict(optimizer, state_dict)
    except StateDictError:
        event("refused")
        assert _same_snapshot(_state_snapshot(optimizer), before)
        return
    event("loaded")
    loaded = optimizer.state[optimizer.param_groups[0]["params"][0]][slot]
    decoded = value.dequantize()  # it was accepted: it decodes, to finite values
    assert bool(torch.isfinite(decoded).all())
    linear = _linear(slot, precision)
    if value.precision == precision and (precision == "bf16" or value.linear == linear):
        # stored as it was: the same parts, bit for bit
        assert _same_snapshot([{"s": _parts_of(loaded)}], [{"s": _parts_of(value)}])
    else:  # in another precision or table: the decoded value, encoded as a write would
        signed = slot != "exp_avg_sq"
        expected = QuantizedState.encode(
            decoded, precision, signed=signed, linear=linear, writes=value.writes
        )
        assert torch.equal(loaded.dequantize(), expected.dequantize())


@st.composite
def _crafted_factors(draw: st.DrawFn) -> torch.Tensor | None:
    if draw(st.booleans()):
        return None
    rows = draw(st.sampled_from([256 + 64, 256 + 64, 256 + 63, 64]))
    rank = draw(st.sampled_from([4, 4, 4, 0, 1, 64, 300]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    factors = torch.randn(rows, rank, generator=generator) * draw(
        st.sampled_from([1.0, 1e-3, 1e30])
    )
    if factors.numel() and draw(st.booleans()):
        factors.view(-1)[0] = draw(st.sampled_from(SPECIAL))
    return factors.to(draw(st.sampled_from([torch.float32, torch.float32, torch.float64])))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(factors=_crafted_factors(), orthonormal=st.booleans())
def test_any_crafted_muon_factors_load_exactly_or_are_refused_with_nothing_changed(
    factors: torch.Tensor | None, orthonormal: bool
) -> None:
    source = _stepped("muon", (256, 64), lr=0.02, state_precision="int8")
    state_dict = source.state_dict()
    held = state_dict["state"][0]["momentum_buffer"]
    if factors is not None and orthonormal and factors.shape == held.factors.shape:
        factors = torch.cat((held.factors[:256], factors[256:]))  # a real basis, any Q
    value = _rebuilt(held, factors=factors)
    state_dict["state"] = {0: {**state_dict["state"][0], "momentum_buffer": value}}
    optimizer = _stepped("muon", (256, 64), lr=0.02, state_precision="int8")
    before = _state_snapshot(optimizer)
    try:
        optiplug.load_state_dict(optimizer, state_dict)
    except StateDictError:
        event("refused")
        assert _same_snapshot(_state_snapshot(optimizer), before)
        return
    event("loaded")
    loaded = optimizer.state[optimizer.param_groups[0]["params"][0]]["momentum_buffer"]
    assert bool(torch.isfinite(loaded.dequantize()).all())
    if value.factors is not None and value.rank == 4:  # stored as it was
        assert torch.equal(loaded.factors, value.factors)
        assert torch.equal(loaded.codes, value.codes)


# ------------------------------------------------------------------ crafted files on disk
ON_DISK: dict[str, tuple[str, str, Callable[[torch.Tensor], torch.Tensor]]] = {
    # name: (algorithm, the stored tensor, how it is crafted)
    "empty-codes": ("adamw", "state.0.exp_avg.codes", lambda t: t[:0]),
    "truncated-codes": ("adamw", "state.0.exp_avg_sq.codes", lambda t: t[:-5]),
    "negative-scales": ("adamw", "state.0.exp_avg_sq.scales", lambda t: -t),
    "codes-as-int64": ("adamw", "state.0.exp_avg.codes", lambda t: t.long()),
    "muon-factors-1e30": ("muon", "state.0.momentum_buffer.factors", lambda t: t * 1e30),
}


@pytest.mark.parametrize("case", sorted(ON_DISK))
def test_a_crafted_checkpoint_file_is_refused_by_load_and_check_alike(
    tmp_path: Path, case: str
) -> None:
    name, key, craft = ON_DISK[case]
    path = tmp_path / "ckpt"
    checkpoint.save(path, _stepped(name, (256, 64), state_precision="int8", **HPARAMS[name]))
    tensors = stored_tensors(path)
    tensors[key] = craft(tensors[key]).contiguous()
    forge_tensors(path, tensors)
    optimizer = _stepped(name, (256, 64), state_precision="int8", **HPARAMS[name])
    before = _state_snapshot(optimizer)
    with pytest.raises(StateDictError, match="nothing was changed"):
        checkpoint.load(path, optimizer)
    assert _same_snapshot(_state_snapshot(optimizer), before)
    assert checkpoint.verify(path).problems  # optiplug check says INVALID too

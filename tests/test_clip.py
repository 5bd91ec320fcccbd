"""Graph.set_grad_clip: global-norm clipping at the optimizer step, as clip_grad_norm_ does it."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from rounding import assert_within_rounding, identity_order

from optiplug._graph.graph import Graph
from optiplug.errors import HyperparameterError

MAX_NORM = 0.1


def data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, 6, generator=generator)
    return x, (x @ torch.arange(6.0).reshape(6, 1) + 0.5) / 16  # fp16-scaled grads stay finite


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for _, p in params], lr=0.05, momentum=0.9)


def graph_run(
    steps: int,
    *,
    clip: float | None = MAX_NORM,
    accumulate: int = 1,
    precision: str | None = None,
    batch: int = 8,
) -> tuple[list[torch.Tensor], list[float | None]]:
    """Train with a Graph; ``batch`` samples per optimizer step, split in micro-batches."""
    graph = Graph(model(), accumulate=accumulate, precision=precision)
    graph.set_optimizer(sgd)
    graph.set_grad_clip(clip)
    x, y = data()
    micro = batch // accumulate
    norms = []
    for step in range(steps):
        for k in range(accumulate):
            start = step * batch + k * micro
            with graph.autocast():
                out = graph.model(x[start : start + micro])
            graph.backward(torch.nn.functional.mse_loss(out.float(), y[start : start + micro]))
            graph.step()
        norms.append(graph.last_grad_norm)
    return [p.detach().clone() for p in graph.parameters()], norms


def torch_run(
    steps: int,
    *,
    batch: int = 8,
    dtype: torch.dtype = torch.float32,
    order: Callable[[int], torch.Tensor] = identity_order,
) -> tuple[list[torch.Tensor], list[float]]:
    """The same by hand: backward, clip_grad_norm_, step.

    ``dtype`` and ``order`` (a permutation of each batch's rows) change only
    the rounding; :mod:`rounding` measures tolerances from them.
    """
    net = model().to(dtype)
    optimizer = sgd(net.named_parameters())
    x, y = (t.to(dtype) for t in data())
    norms = []
    for step in range(steps):
        rows = step * batch + order(batch)
        torch.nn.functional.mse_loss(net(x[rows]), y[rows]).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in net.parameters()], norms


def test_graph_clipping_is_bit_identical_to_clip_grad_norm_by_hand() -> None:
    params, norms = graph_run(6)
    reference, reference_norms = torch_run(6)
    assert all(torch.equal(p, q) for p, q in zip(params, reference, strict=True))
    assert norms == reference_norms
    assert min(norms) > MAX_NORM  # every step was clipped
    unclipped, _ = graph_run(6, clip=None)
    assert not all(torch.equal(p, q) for p, q in zip(unclipped, reference, strict=True))


def test_accumulation_clips_once_on_the_accumulated_gradient() -> None:
    # 2 micro-batches of 4 = one batch of 8: the mean of the two half-batch means
    # is the full mean summed in another order, and so is its norm (equal up to
    # the float32 rounding spread, measured by tests/rounding.py). Clipping each
    # micro-batch's gradient instead would give a different update.
    accumulated, norms = graph_run(6, accumulate=2)
    assert_within_rounding(
        accumulated,
        lambda dtype, order: torch_run(6, dtype=dtype, order=order)[0],
        start=list(model().parameters()),
    )
    assert_within_rounding(
        [torch.tensor(norms)],
        lambda dtype, order: [torch.tensor(torch_run(6, dtype=dtype, order=order)[1])],
    )


def test_fp16_unscales_before_clipping() -> None:
    # CPU autocast runs fp16 and the Graph's GradScaler works on CPU, so the
    # fp16 path is tested here: unscale_, clip, scaler.step, as torch documents it.
    params, norms = graph_run(4, precision="fp16")
    net = model()
    optimizer = sgd(net.named_parameters())
    scaler = torch.amp.GradScaler("cpu")
    x, y = data()
    reference_norms = []
    for step in range(4):
        xs, ys = x[step * 8 : (step + 1) * 8], y[step * 8 : (step + 1) * 8]
        with torch.autocast("cpu", dtype=torch.float16):
            out = net(xs)
        scaler.scale(torch.nn.functional.mse_loss(out.float(), ys)).backward()
        scaler.unscale_(optimizer)
        reference_norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    assert norms == reference_norms
    assert all(torch.equal(p, q) for p, q in zip(params, net.parameters(), strict=True))
    # no step was skipped, and the norm is the unscaled one (the scale is 2**16:
    # clipping the scaled gradients would see a norm ~65536x larger)
    _, fp32_norms = graph_run(4)
    assert all(math.isfinite(n) for n in norms) and min(norms) > MAX_NORM
    # fp16's unit roundoff is 2**-11; the first norm passes through a forward and
    # backward with inner dimensions 6 and 16, so it may be off by (6 + 16) units
    assert norms[0] == pytest.approx(fp32_norms[0], rel=(6 + 16) * 2**-11)


def test_infinite_max_norm_measures_without_changing_the_update() -> None:
    measured, norms = graph_run(3, clip=math.inf)
    plain, plain_norms = graph_run(3, clip=None)
    assert all(torch.equal(p, q) for p, q in zip(measured, plain, strict=True))
    assert plain_norms == [None, None, None] and all(n > 0 for n in norms)


@pytest.mark.parametrize("value", [0, -1.0, math.nan, True, "1"])
def test_bad_clip_values_are_refused(value: object) -> None:
    graph = Graph(model())
    with pytest.raises(HyperparameterError, match="max_norm"):
        graph.set_grad_clip(value)  # type: ignore[arg-type]
    with pytest.raises(HyperparameterError, match="norm_type"):
        graph.set_grad_clip(1.0, norm_type=0)
    graph.set_grad_clip(1.0, norm_type=math.inf)
    assert graph.grad_clip == (1.0, math.inf)
    graph.set_grad_clip(None)
    assert graph.grad_clip is None and graph.last_grad_norm is None

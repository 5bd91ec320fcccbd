"""Low-precision state on a CUDA device: the torch ops there code as the CPU's C loops do.

The decade rule is three float32 operations per value on the same
constants, so CUDA's correctly rounded multiply and subtract give the CPU's
codes bit for bit; an AdamW step on CUDA (torch's own kernels on the
decoded state) matches the CPU's C step. Skipped without a CUDA device
(``scripts/gpu_check.sh`` runs it on one).
"""

from __future__ import annotations

import pytest
import torch

import optiplug
from optiplug._state.codec import _encode_blocks, _magnitudes
from optiplug._state.precision import BLOCK_SIZES, CODE_BITS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

EPS32 = torch.finfo(torch.float32).eps
LR = 1e-3


def _values(bits: int, signed: bool) -> torch.Tensor:
    """Random magnitudes over eight decades, and the table's values and midpoints with their
    float32 neighbours, in blocks whose maximum is 1 (so each is coded as it is)."""
    generator = torch.Generator().manual_seed(bits + signed)
    spread = torch.rand(30_000, generator=generator) * 10.0 ** (
        -8 * torch.rand(30_000, generator=generator)
    )
    magnitudes = torch.tensor(_magnitudes(bits, signed, zero=signed), dtype=torch.float32)
    exact = torch.cat([magnitudes, (magnitudes[1:] + magnitudes[:-1]) / 2])
    edges = torch.cat([exact, exact.nextafter(torch.zeros(())), exact.nextafter(torch.ones(()))])
    values = torch.cat([torch.ones(1), edges.clamp(0, 1), spread])
    if signed:
        values = values * torch.where(torch.rand(values.numel(), generator=generator) < 0.5, -1, 1)
    return values


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("signed", [True, False])
def test_cuda_writes_the_cpu_codes(precision: str, signed: bool) -> None:
    bits, block = CODE_BITS[precision], BLOCK_SIZES[precision]
    values = _values(bits, signed)
    cpu_codes, cpu_scales = _encode_blocks(values, bits, signed, block)
    cuda_codes, cuda_scales = _encode_blocks(values.cuda(), bits, signed, block)
    assert torch.equal(cuda_codes.cpu(), cpu_codes)
    assert torch.equal(cuda_scales.cpu(), cpu_scales)


def _codes(optimizer: torch.optim.Optimizer, key: str) -> torch.Tensor:
    param = optimizer.param_groups[0]["params"][0]
    codes = optimizer.state[param][key].codes.cpu()
    if codes.dtype == torch.bfloat16:
        return codes.view(torch.int16).int()
    if optimizer.param_groups[0]["state_precision"] == "int4":
        codes = torch.stack((codes & 15, codes >> 4), dim=1).reshape(-1)
    return codes.int()


@pytest.mark.parametrize("precision", ["int8", "int4", "bf16"])
def test_an_adamw_step_on_cuda_matches_the_cpu_step(precision: str) -> None:
    generator = torch.Generator().manual_seed(7)
    start = torch.randn(64, 1024, generator=generator)
    grads = [torch.randn(64, 1024, generator=generator) for _ in range(2)]
    made = {}
    for device in ("cpu", "cuda"):
        param = torch.nn.Parameter(start.to(device))
        optimizer = optiplug.create("adamw", [param], lr=LR, state_precision=precision)
        for step, grad in enumerate(grads):
            param.grad = grad.to(device)
            optimizer.step()
            if step == 0:  # the first step reads zero moments: no code is involved yet
                after_first = param.detach().cpu().clone()
        made[device] = (optimizer, after_first)
    (cpu, cpu_first), (cuda, cuda_first) = made["cpu"], made["cuda"]
    # one step: p - lr * m / (sqrt(v) / c + eps) with |m / sqrt(v)| ~ 1 and a few
    # roundings of each operand: within a few ulps of p and of the lr-sized update
    torch.testing.assert_close(cuda_first, cpu_first, rtol=4 * EPS32, atol=8 * EPS32 * LR)
    for key in ("exp_avg", "exp_avg_sq"):
        apart = (_codes(cuda, key) - _codes(cpu, key)).abs()
        assert int(apart.max()) <= 1  # a moment an ulp off lands on the other side of a midpoint
        assert float((apart > 0).float().mean()) < 0.01

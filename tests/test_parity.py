"""sgd, adam and adamw match torch's own optimizers for every flag and implementation."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

import optiplug

IMPLEMENTATIONS = ["loop", "foreach", "fused", None]
TORCH_CLASSES = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def sgd_flag_sets() -> list[dict]:
    found = []
    for momentum, dampening, nesterov, wd, maximize in itertools.product(
        (0.0, 0.9), (0.0, 0.5), (False, True), (0.0, 0.1), (False, True)
    ):
        if nesterov and (momentum == 0 or dampening != 0):
            continue  # torch rejects these too
        found.append(
            {
                "momentum": momentum,
                "dampening": dampening,
                "nesterov": nesterov,
                "weight_decay": wd,
                "maximize": maximize,
            }
        )
    return found


def adam_flag_sets() -> list[dict]:
    return [
        {"weight_decay": wd, "amsgrad": amsgrad, "maximize": maximize}
        for wd, amsgrad, maximize in itertools.product((0.0, 0.1), (False, True), (False, True))
    ]


CASES = [("sgd", flags) for flags in sgd_flag_sets()]
CASES += [(name, flags) for name in ("adam", "adamw") for flags in adam_flag_sets()]


def make_params(dtype: torch.dtype) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(7)
    shapes = [(5, 3), (3,), (2, 2, 2)]
    return [torch.nn.Parameter(torch.randn(s, generator=generator, dtype=dtype)) for s in shapes]


def run(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int, seed: int = 1
) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            p.grad = 2 * (p.detach() - 0.5) + noise
        optimizer.step()


def flag_id(case: tuple[str, dict]) -> str:
    name, flags = case
    return name + "-" + "-".join(f"{k}={v}" for k, v in flags.items() if v)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda i: i or "default")
@pytest.mark.parametrize("case", CASES, ids=flag_id)
def test_fifty_steps_match_torch(case: tuple[str, dict], impl: str | None) -> None:
    name, flags = case
    hparams = {"lr": 0.01, **flags}
    ours, theirs = make_params(torch.float64), make_params(torch.float64)
    run(optiplug.create(name, ours, impl=impl, **hparams), ours, 50)
    run(TORCH_CLASSES[name](theirs, foreach=False, **hparams), theirs, 50)
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference)


@pytest.mark.parametrize("impl", ["loop", "foreach", "fused"])
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_float32_and_state_names_match_torch(name: str, impl: str) -> None:
    hparams = {"lr": 0.01, "momentum": 0.9} if name == "sgd" else {"lr": 0.01, "amsgrad": True}
    ours, theirs = make_params(torch.float32), make_params(torch.float32)
    mine = optiplug.create(name, ours, impl=impl, **hparams)
    reference = TORCH_CLASSES[name](
        theirs, foreach=impl == "foreach", fused=impl == "fused", **hparams
    )
    run(mine, ours, 50)
    run(reference, theirs, 50)
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p, q)
        assert set(mine.state[p]) == set(reference.state[q])


def test_defaults_match_the_design() -> None:
    defaults = {
        name: {h.name: h.default for h in optiplug.spec(name).hyperparameters}
        for name in TORCH_CLASSES
    }
    assert defaults["sgd"] == {
        "lr": 1e-3,
        "momentum": 0.0,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
        "maximize": False,
        "state_precision": "fp32",
    }
    adam = {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "amsgrad": False,
        "maximize": False,
        "state_precision": "fp32",
    }
    assert defaults["adam"] == adam
    assert defaults["adamw"] == {**adam, "weight_decay": 1e-2, "weight_decay_mode": "decoupled"}


@pytest.mark.parametrize("impl", ["loop", "foreach", "fused"])
def test_torch_adamw_state_dict_loads_into_ours_and_back(impl: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05, amsgrad=True)
    params = list(model.parameters())
    run(reference, params, 5)
    twin = copy.deepcopy(model)
    twin_params = list(twin.parameters())
    mine = optiplug.create(
        "adamw", twin_params, impl=impl, lr=0.01, weight_decay=0.05, amsgrad=True
    )
    mine.load_state_dict(reference.state_dict())
    assert mine.impl == impl
    run(reference, params, 10, seed=2)
    run(mine, twin_params, 10, seed=2)
    for p, q in zip(params, twin_params, strict=True):
        torch.testing.assert_close(q, p)
    back = torch.optim.AdamW(params, lr=0.01, weight_decay=0.05, amsgrad=True)
    back.load_state_dict(copy.deepcopy(mine.state_dict()))  # torch's loader aliases tensors
    run(back, params, 3, seed=3)
    run(mine, twin_params, 3, seed=3)
    for p, q in zip(params, twin_params, strict=True):
        torch.testing.assert_close(q, p)


# ------------------------------------------------------------------ cautious weight decay
def _adamw_cautious_reference(
    params: list[torch.Tensor], grads: list[list[torch.Tensor]], lr: float, wd: float
) -> list[torch.Tensor]:
    """AdamW (Loshchilov & Hutter; torch's defaults betas (0.9, 0.999), eps 1e-8) in float64,
    with cautious weight decay (Chen et al. 2025, arXiv 2510.12402):
    u = m_hat / (sqrt(v_hat) + eps); p <- p - lr * (u + wd * p * [u * p >= 0])."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    ps = [p.detach().double().clone() for p in params]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    for step, gs in enumerate(grads, start=1):
        for p, m, v, g in zip(ps, ms, vs, gs, strict=True):
            g = g.double()
            m.mul_(beta1).add_((1 - beta1) * g)
            v.mul_(beta2).add_((1 - beta2) * g * g)
            u = (m / (1 - beta1**step)) / ((v / (1 - beta2**step)).sqrt() + eps)
            p -= lr * (u + wd * p * (u * p >= 0).double())
    return ps


@pytest.mark.parametrize("impl", ["loop", "foreach", "fused"])
def test_adamw_cautious_weight_decay_matches_the_published_rule(impl: str) -> None:
    generator = torch.Generator().manual_seed(5)
    shapes = [(16, 8), (8,)]
    params = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    grads = [
        [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes] for _ in range(5)
    ]
    lr, wd = 0.01, 0.5
    live = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = optiplug.create(
        "adamw", [{"params": live[:1]}, {"params": live[1:], "weight_decay_mode": "decoupled"}],
        lr=lr, weight_decay=wd, weight_decay_mode="cautious", impl=impl,
    )  # fmt: skip
    torch_twin = [torch.nn.Parameter(p.clone()) for p in params[1:]]
    plain = torch.optim.AdamW(torch_twin, lr=lr, weight_decay=wd)
    for step in grads:
        for p, g in zip(live, step, strict=True):
            p.grad = g.clone()
        torch_twin[0].grad = step[1].clone()
        optimizer.step()
        plain.step()
    want = _adamw_cautious_reference(params[:1], [step[:1] for step in grads], lr, wd)[0]
    # float64; 5 steps of ~20 roundings each near values of order 1: 1e-12 is far above
    # that and far below the decay the mask withholds (lr * wd * |p| ~ 5e-3 per step)
    torch.testing.assert_close(live[0].detach(), want, rtol=0, atol=1e-12)
    assert torch.equal(live[1].detach(), torch_twin[0].detach())  # the decoupled group: torch's
    assert optimizer.param_groups[0]["weight_decay"] == wd  # restored after each step

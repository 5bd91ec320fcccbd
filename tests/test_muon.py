"""optiplug-muon: equal to torch.optim.Muon on matrices, AdamW for the rest, routing explained."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
from torch import nn

import optiplug
from optiplug.errors import HyperparameterError
from optiplug_muon import MUON_STATE, Muon, RoutingWarning
from optiplug_muon.newton_schulz import method_flops, orthogonalize, resolve_method

# Most tests hand over bare matrices on purpose; the warning has its own test.
pytestmark = pytest.mark.filterwarnings("ignore::optiplug_muon.optimizer.RoutingWarning")

STEPS = 50
COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# wide, tall (transpose trick), square, and a repeat of each so batching has work.
SHAPES = ((24, 40), (40, 24), (32, 32), (24, 40), (40, 24))


@pytest.fixture(autouse=True)
def one_thread():
    """Run single-threaded: these matrices are tiny, and on a shared machine every
    two-thread OpenMP region (oneDNN's bf16 bmm opens one per call) can wait a whole
    scheduler time slice for the second core, turning microseconds into milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_same_state(got: dict, want: dict) -> None:
    assert got["param_groups"] == want["param_groups"]
    torch.testing.assert_close(got["state"], want["state"], rtol=0, atol=0)


def matrices(shapes=SHAPES, seed: int = 0) -> list[nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [nn.Parameter(0.1 * torch.randn(s, generator=generator)) for s in shapes]


def clones(params: list[torch.Tensor]) -> list[nn.Parameter]:
    return [nn.Parameter(p.detach().clone()) for p in params]


def set_grads(step: int, *param_lists: list[torch.Tensor]) -> None:
    generator = torch.Generator().manual_seed(1000 + step)
    grads = [torch.randn(p.shape, generator=generator) for p in param_lists[0]]
    for params in param_lists:
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad.clone()


def train_together(steps: int, *pairs: tuple[torch.optim.Optimizer, list[torch.Tensor]]) -> None:
    for step in range(steps):
        set_grads(step, *(params for _, params in pairs))
        for optimizer, _ in pairs:
            optimizer.step()


# --- equality with torch.optim.Muon ---------------------------------------------------------


@pytest.mark.parametrize(
    ("hparams", "adjust_lr"),
    [
        ({}, "original"),
        ({"weight_decay": 0.1}, "original"),
        ({"nesterov": False, "momentum": 0.9}, "original"),
        ({"weight_decay": 0.05}, "match_rms_adamw"),
    ],
)
@pytest.mark.parametrize("ns_method", ["standard", "gram"])
def test_equals_torch_muon_on_matrices(hparams: dict, adjust_lr: str, ns_method: str) -> None:
    ours_params = matrices()
    torch_params = clones(ours_params)
    ours = Muon(
        ours_params,
        lr=0.02,
        ns_dtype=torch.bfloat16,
        ns_method=ns_method,
        adjust_lr=adjust_lr,
        **hparams,
    )
    reference = torch.optim.Muon(
        torch_params,
        lr=0.02,
        adjust_lr_fn=adjust_lr,
        **{"weight_decay": 0.0, "momentum": 0.95, "nesterov": True, **hparams},
    )
    train_together(STEPS, (ours, ours_params), (reference, torch_params))
    # torch.optim.Muon runs Newton-Schulz in bf16 too; the gradients do not depend on the
    # parameters, so any difference is a sum of per-step update differences. An update
    # element is lr*adjust*O with |O| <= 1, and two bf16 matmul orders may round O
    # differently by about one bf16 ulp (2**-8 relative), so after STEPS steps the
    # parameters may differ by at most STEPS * lr * adjust * 2**-8.
    for ours_p, torch_p in zip(ours_params, torch_params, strict=True):
        rows, cols = ours_p.shape
        adjust = (
            0.2 * math.sqrt(max(rows, cols))
            if adjust_lr == "match_rms_adamw"
            else math.sqrt(max(1, rows / cols))
        )
        bound = STEPS * 0.02 * adjust * 2**-8
        torch.testing.assert_close(ours_p.detach(), torch_p.detach(), rtol=0, atol=bound)
        moved = (ours_p - matrices()[0].new_zeros(())).detach()
        assert moved.abs().max() > 10 * bound  # the comparison is not vacuous


def test_tensor_learning_rate_equals_float() -> None:
    floats, tensors = matrices(), matrices()
    a = Muon(floats, lr=0.02, ns_dtype="float32", weight_decay=0.1)
    b = Muon(tensors, lr=torch.tensor(0.02), ns_dtype="float32", weight_decay=0.1)
    train_together(5, (a, floats), (b, tensors))
    for x, y in zip(floats, tensors, strict=True):
        torch.testing.assert_close(x, y)


# --- Newton-Schulz --------------------------------------------------------------------------


def newton_schulz_formula(matrix: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic iteration written out in float64 on X (r <= c) or X^T."""
    a, b, c = COEFFICIENTS
    x = matrix.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("method", ["standard", "gram"])
@pytest.mark.parametrize("shape", [(24, 40), (40, 24), (32, 32), (8, 3, 3, 3)])
def test_orthogonalize_equals_formula_in_float64(shape: tuple[int, ...], method: str) -> None:
    matrix = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    flat = matrix.reshape(shape[0], -1)
    got = orthogonalize(flat, dtype=torch.float64, method=method)
    torch.testing.assert_close(got, newton_schulz_formula(flat), rtol=1e-10, atol=1e-12)
    singular = torch.linalg.svdvals(got)  # roughly orthogonal (a square matrix's tiny
    assert singular.max() < 1.5 and (singular > 0.5).double().mean() > 0.9  # ones lag)


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("shape", [(301, 520), (520, 301)])
def test_gram_form_and_symmetric_blocks_equal_the_formula(
    shape: tuple[int, int], steps: int
) -> None:
    # sides >= 256 on CPU take the blocked symmetric products (301 rows: uneven blocks);
    # every step count walks a different restart pattern of the Gram form
    matrix = torch.randn(shape, generator=torch.Generator().manual_seed(steps), dtype=torch.float64)
    want = newton_schulz_formula(matrix, steps)
    for method in ("standard", "gram"):
        got = orthogonalize(matrix, steps=steps, dtype=torch.float64, method=method)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


def spectrum(shape: tuple[int, int], kind: str) -> torch.Tensor:
    """A matrix whose singular values are flat (Gaussian), low-rank plus noise, or log-spaced."""
    generator = torch.Generator().manual_seed(11)
    rows, cols = shape
    if kind == "gaussian":
        return torch.randn(shape, generator=generator)
    if kind == "low-rank":
        u, v = torch.randn(rows, 8, generator=generator), torch.randn(8, cols, generator=generator)
        return u @ v + 0.05 * torch.randn(shape, generator=generator)
    k = min(shape)
    u = torch.linalg.qr(torch.randn(rows, k, generator=generator, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(cols, k, generator=generator, dtype=torch.float64))[0]
    return ((u * torch.logspace(0, -4, k, dtype=torch.float64)) @ v.T).float()


@pytest.mark.parametrize("kind", ["gaussian", "low-rank", "log-spaced"])
@pytest.mark.parametrize("shape", [(256, 768), (768, 256)])
def test_gram_form_in_bf16_is_as_accurate_as_the_standard_form(
    shape: tuple[int, int], kind: str
) -> None:
    # In bf16 the Gram matrix drifts from X Xᵀ; restarting every 2 iterations keeps the
    # error against float64 at the standard form's. Without restarts the low-rank and
    # log-spaced cases fail (relative error 0.4-2), restarting every 3 the Gaussian one.
    matrix = spectrum(shape, kind)
    exact = newton_schulz_formula(matrix)

    def error(method: str) -> float:
        got = orthogonalize(matrix, dtype=torch.bfloat16, method=method).double()
        return ((got - exact).norm() / exact.norm()).item()

    standard, gram = error("standard"), error("gram")
    assert gram <= 1.25 * standard + 2e-3, (standard, gram)


def test_a_group_edited_to_a_bad_method_fails_before_updating_anything() -> None:
    params = matrices()
    optimizer = Muon(params)
    optimizer.param_groups[0]["ns_method"] = "fastest"
    set_grads(0, params)
    before = [p.detach().clone() for p in params]
    with pytest.raises(HyperparameterError) as caught:
        optimizer.step()
    assert (caught.value.field, caught.value.value) == ("ns_method", "fastest")
    assert not optimizer.state  # no momentum was updated
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))


def test_auto_method_picks_the_form_with_fewer_flops() -> None:
    # GPT-2 small's matrices, one at a time on CPU (blocked symmetric products)
    assert resolve_method("auto", 768, 768, 5, "cpu", 1) == "standard"
    for rows, cols in ((768, 2304), (768, 3072), (3072, 768)):
        assert resolve_method("auto", rows, cols, 5, "cpu", 1) == "gram"
        assert resolve_method("standard", rows, cols, 5, "cpu", 1) == "standard"
    # 5 standard iterations of a 768x3072 matrix in 4 blocks: per iteration X Xᵀ and A²
    # at 5/8 of 2k²n and 2k³ (lower block rows), then P X at 2k²n
    k, n = 768, 3072
    per_iteration = 5 / 8 * 2 * k * k * n + 5 / 8 * 2 * k**3 + 2 * k * k * n
    assert method_flops("standard", k, n, 5, 4) == pytest.approx(5 * per_iteration)
    assert method_flops("gram", k, n, 5, 4) < 0.75 * method_flops("standard", k, n, 5, 4)


def test_batched_and_unbatched_orthogonalisation_agree() -> None:
    batch = torch.randn(6, 24, 40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    together = orthogonalize(batch, dtype=torch.float64)
    alone = torch.stack([orthogonalize(m, dtype=torch.float64) for m in batch])
    torch.testing.assert_close(together, alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_batched_and_unbatched_optimizers_agree(ns_dtype: str) -> None:
    batched, unbatched = matrices(), matrices()
    a = Muon(batched, ns_dtype=ns_dtype, ns_batch=True)
    b = Muon(unbatched, ns_dtype=ns_dtype, ns_batch=False)
    train_together(10, (a, batched), (b, unbatched))
    # Each of 10 steps moves a parameter by lr * adjust * O, |O| <= 1 (see above). In
    # bfloat16 the two matmul orders may round O apart by one bf16 ulp (2**-8). In
    # float32 they may differ by a few (4) units of roundoff per matmul, which each
    # of the 5 Newton-Schulz iterations can grow by at most its linear coefficient
    # (3.4445, the quintic's slope at 0).
    per_step_o = 4 * 2**-24 * 3.4445**5 if ns_dtype == "float32" else 2**-8
    bound = 10 * 0.02 * math.sqrt(40 / 24) * per_step_o
    for x, y in zip(batched, unbatched, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=bound)


def test_zero_gradient_gives_zero_update_not_nan() -> None:
    params = matrices()
    before = [p.detach().clone() for p in params]
    optimizer = Muon(params, ns_dtype="bfloat16")
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for got, want in zip(params, before, strict=True):
        assert torch.equal(got.detach(), want)


def test_conv_weights_equal_torch_muon_on_the_flattened_matrix() -> None:
    conv = nn.Parameter(0.1 * torch.randn(8, 3, 3, 3, generator=torch.Generator().manual_seed(5)))
    flat = nn.Parameter(conv.detach().reshape(8, 27).clone())
    # the flattening is under test: the standard form rounds exactly as torch does
    ours = Muon([conv], ns_dtype="bfloat16", ns_method="standard", force_muon=("*",))
    reference = torch.optim.Muon([flat], lr=0.02, weight_decay=0.0)
    for step in range(10):
        grad = torch.randn(8, 3, 3, 3, generator=torch.Generator().manual_seed(step))
        conv.grad, flat.grad = grad, grad.reshape(8, 27).clone()
        ours.step()
        reference.step()
    # torch's "original" adjustment is max(1, 8/27)**0.5 = 1: each of the 10 steps moves
    # an element by lr * O, and the two may round O apart by one bf16 ulp (2**-8)
    bound = 10 * 0.02 * 2**-8
    torch.testing.assert_close(conv.detach().reshape(8, 27), flat.detach(), rtol=0, atol=bound)
    assert "orthogonalised as 8x27" in ours.routing().routes[0].reason


def test_conv_net_trains() -> None:
    torch.manual_seed(0)
    net, teacher = (
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
        for _ in range(2)
    )
    inputs = torch.randn(16, 3, 8, 8)
    with torch.no_grad():
        target = teacher(inputs)
    optimizer = optiplug.create("muon", net.named_parameters(), model=net, aux_lr=1e-2)
    assert optimizer.routing().names("muon") == ("0.weight", "2.weight")
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(net(inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(math.isfinite(v) for v in losses)


# --- routing --------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_out = nn.Linear(4 * width, width)


class TinyGPT(nn.Module):
    def __init__(
        self,
        vocab: int = 50,
        context: int = 16,
        width: int = 16,
        tied: bool = False,
        head_name: str = "lm_head",
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(2))
        self.ln_f = nn.LayerNorm(width)
        setattr(self, head_name, nn.Linear(width, vocab, bias=False))
        if tied:
            getattr(self, head_name).weight = self.wte.weight


HIDDEN = {
    f"blocks.{i}.{layer}.weight" for i in range(2) for layer in ("qkv", "proj", "fc", "fc_out")
}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("with_model", [False, True])
def test_gpt_routing_sends_exactly_the_hidden_linears_to_muon(tied: bool, with_model: bool) -> None:
    model = TinyGPT(tied=tied)
    extra = {"model": model} if with_model else {}
    optimizer = optiplug.create("muon", model.named_parameters(), **extra)
    routing = optimizer.routing()
    assert set(routing.names("muon")) == HIDDEN
    assert len(routing) == len(list(model.parameters()))
    assert "embedding" in routing["wte.weight"].reason
    assert "not a matrix" in routing["blocks.0.ln_1.bias"].reason
    if not tied:
        assert "head" in routing["lm_head.weight"].reason
    if tied and with_model:
        assert "tied to output head 'lm_head'" in routing["wte.weight"].reason
    for group in optimizer.param_groups:
        names = set(group["param_names"])
        assert (names <= HIDDEN) if group["use_muon"] else not (names & HIDDEN)


def test_model_detects_an_unusually_named_head_and_embeddings() -> None:
    model = TinyGPT(head_name="decoder")
    optimizer = optiplug.create("muon", model.named_parameters(), model=model, aux_patterns=())
    routing = optimizer.routing()
    assert set(routing.names("muon")) == HIDDEN
    assert "last nn.Linear 'decoder'" in routing["decoder.weight"].reason
    without_model = optiplug.create("muon", model.named_parameters(), aux_patterns=())
    assert "decoder.weight" in without_model.routing().names("muon")


def test_model_names_unnamed_parameters() -> None:
    model = TinyGPT()
    optimizer = optiplug.create("muon", model.parameters(), model=model)
    assert set(optimizer.routing().names("muon")) == HIDDEN


def test_unnamed_parameters_route_by_shape_with_a_warning() -> None:
    model = TinyGPT()
    with pytest.warns(RoutingWarning, match="cannot be recognised"):
        optimizer = optiplug.create("muon", model.parameters())
    routing = optimizer.routing()
    muon_count = sum(p.ndim >= 2 for p in model.parameters())
    assert len(routing.names("muon")) == muon_count
    assert all(r.reason.startswith("not a matrix") for r in routing if r.algorithm == "adamw")
    first_vector = next(i for i, p in enumerate(model.parameters()) if p.ndim < 2)
    assert routing[f"#{first_vector}"].algorithm == "adamw"  # labels are input positions


def test_force_keywords_override_the_rules() -> None:
    model = TinyGPT()
    optimizer = optiplug.create(
        "muon", model.named_parameters(), force_aux=("blocks.1.*",), force_muon=("lm_head.*",)
    )
    routing = optimizer.routing()
    assert set(routing.names("muon")) == {n for n in HIDDEN if n.startswith("blocks.0")} | {
        "lm_head.weight"
    }
    assert "force_aux" in routing["blocks.1.qkv.weight"].reason


def test_routing_table_reports_effective_lr_and_weight_decay() -> None:
    model = TinyGPT()
    optimizer = optiplug.create(
        "muon", model.named_parameters(), weight_decay=0.1, aux_weight_decay=0.01
    )
    routing = optimizer.routing()
    fc = routing["blocks.0.fc.weight"]  # 64 x 16: original adjust = sqrt(64/16) = 2
    assert (fc.algorithm, fc.lr, fc.weight_decay) == ("muon", pytest.approx(0.04), 0.1)
    assert (routing["wte.weight"].lr, routing["wte.weight"].weight_decay) == (3e-4, 0.01)
    table = str(routing)
    assert table.splitlines()[0].split() == [
        "parameter",
        "shape",
        "algorithm",
        "route",
        "lr",
        "wd",
        "reason",
    ]
    assert "blocks.0.fc.weight" in table and "hidden matrix" in table


def test_aux_none_rejects_non_matrices_naming_the_parameter() -> None:
    model = TinyGPT()
    with pytest.raises(HyperparameterError, match=r"blocks\.0\.ln_1\.weight") as caught:
        optiplug.create(
            "muon", model.named_parameters(), aux=None, force_muon=("w?e.weight", "lm_head.weight")
        )
    assert caught.value.field == "aux"
    only_matrices = [(n, p) for n, p in model.named_parameters() if n in HIDDEN]
    optimizer = optiplug.create("muon", only_matrices, aux=None)
    assert set(optimizer.routing().names("muon")) == HIDDEN


@pytest.mark.parametrize(
    ("hparams", "field"),
    [
        ({"lr": -0.1}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"ns_steps": 0}, "ns_steps"),
        ({"ns_coefficients": (1.0, 2.0)}, "ns_coefficients"),
        ({"adjust_lr": "sqrt"}, "adjust_lr"),
        ({"ns_dtype": torch.int8}, "ns_dtype"),
        ({"ns_method": "fast"}, "ns_method"),
        ({"ns_batch": "yes"}, "ns_batch"),
        ({"aux_betas": (0.9, 1.5)}, "aux_betas"),
        ({"aux": "sgd"}, "aux"),
        ({"model": 3}, "model"),
    ],
)
def test_bad_hyperparameters_name_the_field(hparams: dict, field: str) -> None:
    with pytest.raises(HyperparameterError) as caught:
        optiplug.create("muon", matrices(), **hparams)
    assert caught.value.field == field


# --- auxiliary AdamW, param groups, schedulers -----------------------------------------------


def test_aux_params_equal_torch_adamw() -> None:
    model = TinyGPT()
    reference_model = copy.deepcopy(model)
    ours = optiplug.create("muon", model.named_parameters(), aux_weight_decay=0.1)
    aux_names = set(ours.routing().names("adamw"))
    reference = torch.optim.AdamW(
        [p for n, p in reference_model.named_parameters() if n in aux_names],
        lr=3e-4,
        betas=(0.9, 0.95),
        eps=1e-10,
        weight_decay=0.1,
    )
    ours_aux = [p for n, p in model.named_parameters() if n in aux_names]
    reference_aux = [p for n, p in reference_model.named_parameters() if n in aux_names]
    steps, lr, unit = 20, 3e-4, 2.0**-24
    train_together(steps, (ours, ours_aux), (reference, reference_aux))
    # The gradients are fixed (set_grads), so the two runs differ only by how each
    # kernel rounds: each step's update (at most about lr in size) by a few units of
    # roundoff, and the parameter's sum by at most one ulp (2 units of |p|). Over
    # `steps` steps: |x - y| <= steps * (8 * unit * lr + 2 * unit * |y|).
    for x, y in zip(ours_aux, reference_aux, strict=True):
        torch.testing.assert_close(x, y, rtol=steps * 2 * unit, atol=steps * 8 * unit * lr)


def test_groups_reach_both_algorithms_and_schedulers_work() -> None:
    model = TinyGPT()
    optimizer = optiplug.create("muon", model.named_parameters())
    assert sorted(g["use_muon"] for g in optimizer.param_groups) == [False, True]
    muon_group = next(g for g in optimizer.param_groups if g["use_muon"])
    aux_group = next(g for g in optimizer.param_groups if not g["use_muon"])
    assert "aux_betas" not in muon_group and "momentum" not in aux_group
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    optimizer.step()
    scheduler.step()
    assert (muon_group["lr"], aux_group["lr"]) == (0.01, 1.5e-4)


def test_group_dicts_override_per_algorithm() -> None:
    model = TinyGPT()
    named = dict(model.named_parameters())
    groups = [
        {
            "params": [(n, p) for n, p in named.items() if n.startswith("blocks.0")],
            "lr": 0.01,
            "aux_lr": 1e-3,
        },
        {"params": [(n, p) for n, p in named.items() if not n.startswith("blocks.0")]},
    ]
    optimizer = optiplug.create("muon", groups)
    lrs = {(g["use_muon"], g["lr"]) for g in optimizer.param_groups}
    assert lrs == {(True, 0.01), (False, 1e-3), (True, 0.02), (False, 3e-4)}
    optimizer.add_param_group({"params": [("extra.bias", nn.Parameter(torch.zeros(3)))]})
    added = optimizer.param_groups[-1]
    assert added["use_muon"] is False and added["lr"] == 3e-4 and "momentum" not in added
    with pytest.raises(HyperparameterError, match="mixes"):
        optimizer.add_param_group(
            {
                "params": [
                    ("a", nn.Parameter(torch.zeros(3, 3))),
                    ("b", nn.Parameter(torch.zeros(3))),
                ]
            }
        )


# --- state ---------------------------------------------------------------------------------


def stepped(seed: int = 0) -> tuple[Muon, TinyGPT]:
    torch.manual_seed(seed)
    model = TinyGPT()
    optimizer = optiplug.create("muon", model.named_parameters())
    for step in range(3):
        set_grads(step, list(model.parameters()))
        optimizer.step()
    return optimizer, model


def test_state_dict_validates_and_aux_hyperparameters_may_change() -> None:
    optimizer, _ = stepped()
    saved = optimizer.state_dict()
    assert optiplug.validate_state_dict(optimizer, saved) == []
    aux = next(i for i, g in enumerate(saved["param_groups"]) if not g["use_muon"])
    saved["param_groups"][aux]["aux_betas"] = (0.8, 0.9)
    assert optiplug.validate_state_dict(optimizer, saved) == []
    saved["param_groups"][aux]["aux_betas"] = (0.8, 1.5)
    assert [p.slot for p in optiplug.validate_state_dict(optimizer, saved)] == ["aux_betas"]


def test_state_slots_match_the_schema() -> None:
    optimizer, _ = stepped()
    assert optiplug.spec("muon").state_slots == MUON_STATE
    for group in optimizer.param_groups:
        expected = {s.name for s in MUON_STATE if s.present_for(group)}
        for param in group["params"]:
            assert set(optimizer.state[param]) == expected
    assert optimizer.state[optimizer.param_groups[1]["params"][0]]["step"].dtype == torch.float32


def test_state_dict_round_trip_continues_identically() -> None:
    optimizer, model = stepped()
    twin_model = copy.deepcopy(model)
    twin = optiplug.create("muon", twin_model.named_parameters(), lr=0.5)
    twin.load_state_dict(optimizer.state_dict())
    assert_same_state(twin.state_dict(), optimizer.state_dict())
    set_grads(7, list(model.parameters()), list(twin_model.parameters()))
    optimizer.step()
    twin.step()
    for x, y in zip(model.parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(x, y)


def test_deepcopy_and_pickle_keep_state_and_routing() -> None:
    optimizer, _ = stepped()
    for clone in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert str(clone.routing()) == str(optimizer.routing())
        assert_same_state(clone.state_dict(), optimizer.state_dict())
        set_grads(9, [p for g in clone.param_groups for p in g["params"]])
        clone.step()  # the workspace is rebuilt


def test_step_without_gradients_is_a_no_op() -> None:
    model = TinyGPT()
    before = copy.deepcopy(model.state_dict())
    optimizer = optiplug.create("muon", model.named_parameters(), weight_decay=0.5)
    optimizer.step()
    assert not optimizer.state
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_quadratic_converges() -> None:
    target = 0.3 * torch.randn(16, 16, generator=torch.Generator().manual_seed(6))
    weight = nn.Parameter(torch.zeros(16, 16))
    optimizer = Muon([weight], lr=0.05, ns_dtype="float32")
    initial = ((weight - target) ** 2).sum().item()
    for _ in range(150):
        optimizer.zero_grad()
        ((weight - target) ** 2).sum().backward()
        optimizer.step()
    assert ((weight - target) ** 2).sum().item() < 0.01 * initial


def test_auto_optimizer_proposes_muon_for_causal_lm_pretraining_only() -> None:
    chosen = optiplug.AutoOptimizer.for_task("causal-lm", stage="pretraining")
    assert chosen.optimizer == "muon"
    assert optiplug.AutoOptimizer.for_task("causal-lm", stage="finetuning").optimizer == "adamw"
    assert optiplug.AutoOptimizer.for_task("text-classification").optimizer == "adam"
    model = TinyGPT()
    assert set(chosen(model.named_parameters()).routing().names("muon")) == HIDDEN


def test_explain_shows_the_muon_rule_and_the_default_rules() -> None:
    pretraining = optiplug.AutoOptimizer.explain(
        task="causal-lm", stage="pretraining", num_parameters=10**7
    )
    rows = {line.split()[-5]: line for line in pretraining.splitlines()[5:] if line.strip()}
    assert "chosen" in rows["muon:pretraining"] and "optiplug-muon" in rows["muon:pretraining"]
    assert (
        "rules (optiplug" in rows["pretraining:adamw"] and "outscored" in rows["pretraining:adamw"]
    )
    assert "pretraining:muon" not in rows  # one muon rule: the plugin's
    finetuning = optiplug.AutoOptimizer.explain(
        task="causal-lm", stage="finetuning", num_parameters=10**7
    )
    ranked = finetuning.split("for comparison, the most-used algorithms")[0]
    assert "muon" not in ranked  # muon is among the most-used ones cited after, for comparison


@pytest.mark.parametrize(
    ("shape", "adjust_lr", "expected"),
    [
        ((64, 3, 3, 3), "original", math.sqrt(64 / 27)),  # the flattened 64 x 27 matrix: 1.54
        ((64, 3, 3, 3), "original_last_two", 1.0),  # the reference's last two dimensions
        ((3, 64, 5, 2), "original_last_two", math.sqrt(5 / 2)),
        ((96, 64), "original", math.sqrt(96 / 64)),  # a matrix: the two readings agree
        ((96, 64), "original_last_two", math.sqrt(96 / 64)),
        ((64, 3, 3, 3), "match_rms_adamw", 0.2 * math.sqrt(64)),
    ],
)
def test_the_lr_adjustment_of_a_conv_kernel_follows_the_chosen_reading(
    shape: tuple[int, ...], adjust_lr: str, expected: float
) -> None:
    from optiplug_muon.optimizer import adjust_lr_factor

    assert adjust_lr_factor(torch.zeros(shape), adjust_lr) == pytest.approx(expected, rel=1e-12)


def test_a_conv_kernel_steps_by_the_reference_reading_with_original_last_two() -> None:
    """The same orthogonalised update, scaled by 1.0 instead of sqrt(64/27)."""
    deltas = {}
    for adjust_lr in ("original", "original_last_two"):
        start = torch.randn(64, 3, 3, 3, generator=torch.Generator().manual_seed(0))
        conv = torch.nn.Parameter(start.clone())
        optimizer = optiplug.create(
            "muon", [("conv.weight", conv)], lr=0.01, adjust_lr=adjust_lr, weight_decay=0.0
        )
        conv.grad = torch.randn(conv.shape, generator=torch.Generator().manual_seed(1))
        optimizer.step()
        deltas[adjust_lr] = (conv.detach() - start).double()
    ratio = math.sqrt(64 / 27)
    # each new parameter is rounded to float32 once: a delta is off by half an ulp of |p|
    # (at most 2**-24 * 2 * max|p|, the ulp doubling once per binade), the scaled one by
    # ratio times that; the orthogonalised update itself is the same computation
    ulp = 2.0**-23 * float(start.abs().max())
    torch.testing.assert_close(
        deltas["original"], deltas["original_last_two"] * ratio, rtol=0, atol=(1 + ratio) * ulp
    )

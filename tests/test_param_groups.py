"""no_decay / layer_decay param groups, modules as params, and the group report."""

from __future__ import annotations

import fnmatch
import itertools
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import optiplug
from optiplug.base import count_layers, param_groups, param_groups_report
from optiplug.errors import HyperparameterError
from optiplug_muon.optimizer import RoutingWarning


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Linear(width, width, bias=False)


class Tiny(nn.Module):
    """GPT-shaped: embeddings, blocks under ``h.N``, a final norm and a head."""

    def __init__(self, layers: int = 3, width: int = 4, vocab: int = 11) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.h = nn.ModuleList(Block(width) for _ in range(layers))
        self.norm_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)


class Odd(nn.Module):
    """Names that hide the role: a LayerNorm called ``gain``, an Embedding called ``table``."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(5, 3)
        self.gain = nn.LayerNorm(3)
        self.bn = nn.BatchNorm1d(3)
        self.proj = nn.Linear(3, 3)


def _wd(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    return {row.name: row.weight_decay for row in param_groups_report(optimizer)}


def _lr(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    return {row.name: row.lr for row in param_groups_report(optimizer)}


# ------------------------------------------------------------------ no_decay
def test_auto_excludes_norms_biases_and_embeddings_by_module_type() -> None:
    model = Tiny()
    optimizer = optiplug.create("adamw", model, no_decay="auto", weight_decay=0.1)
    wd = _wd(optimizer)
    assert wd["wte.weight"] == 0.0
    assert wd["h.0.ln_1.weight"] == 0.0 and wd["h.0.ln_1.bias"] == 0.0
    assert wd["h.0.attn.bias"] == 0.0 and wd["norm_f.weight"] == 0.0
    assert wd["h.0.attn.weight"] == 0.1 and wd["head.weight"] == 0.1
    report = str(param_groups_report(optimizer))
    assert "no decay: norm (LayerNorm 'h.0.ln_1')" in report
    assert "no decay: embedding (Embedding 'wte')" in report


def test_module_type_decides_where_names_cannot() -> None:
    model = Odd()
    with_model = _wd(optiplug.create("sgd", model, no_decay="auto", lr=0.1, weight_decay=0.1))
    assert with_model["table.weight"] == 0.0  # an Embedding named "table"
    assert with_model["gain.weight"] == 0.0 and with_model["bn.weight"] == 0.0
    assert with_model["proj.weight"] == 0.1
    names_only = optiplug.create(
        "sgd", model.named_parameters(), no_decay="auto", lr=0.1, weight_decay=0.1
    )
    assert _wd(names_only)["table.weight"] == 0.1  # a name alone cannot tell


def test_name_heuristics_without_a_model() -> None:
    named = [
        ("transformer.wte.weight", nn.Parameter(torch.ones(5, 3))),
        ("transformer.h.0.ln_1.weight", nn.Parameter(torch.ones(3))),
        ("transformer.h.0.mlp.c_fc.weight", nn.Parameter(torch.ones(3, 3))),
        ("transformer.h.0.mlp.c_fc.bias", nn.Parameter(torch.ones(3))),
    ]
    optimizer = optiplug.create("adamw", named, no_decay="auto", weight_decay=0.1)
    rows = {row.name: row for row in param_groups_report(optimizer)}
    assert rows["transformer.wte.weight"].weight_decay == 0.0
    assert "name contains 'wte'" in rows["transformer.wte.weight"].reason
    assert rows["transformer.h.0.mlp.c_fc.bias"].reason == "no decay: bias (by name)"
    assert rows["transformer.h.0.mlp.c_fc.weight"].weight_decay == 0.1


def test_user_patterns_replace_the_auto_rules_unless_auto_is_listed() -> None:
    model = Tiny()
    only = _wd(optiplug.create("adamw", model, no_decay=["*.mlp.*"], weight_decay=0.1))
    assert only["h.1.mlp.weight"] == 0.0 and only["h.1.attn.bias"] == 0.1
    both = _wd(optiplug.create("adamw", model, no_decay=["auto", "head.*"], weight_decay=0.1))
    assert both["head.weight"] == 0.0 and both["h.1.attn.bias"] == 0.0
    assert both["h.1.attn.weight"] == 0.1


def test_bad_no_decay_values_are_refused() -> None:
    model = Tiny()
    with pytest.raises(HyperparameterError, match="no_decay"):
        optiplug.create("adamw", model, no_decay="everything")
    with pytest.raises(HyperparameterError, match="layer_decay"):
        optiplug.create("adamw", model, layer_decay=1.5)
    with pytest.raises(HyperparameterError, match="names"):
        optiplug.create("adamw", [nn.Parameter(torch.ones(2, 2))], layer_decay=0.5)
    with pytest.raises(HyperparameterError, match="no_decay"):
        optiplug.factory("adamw", no_decay=3)
    assert optiplug.factory("adamw", no_decay="auto", weight_decay=0.1)(model)


# ------------------------------------------------------------------ defaults keep parity
def test_the_default_is_no_grouping_so_torch_state_dicts_load_both_ways() -> None:
    model = Tiny()
    ours = optiplug.create("adamw", model.named_parameters(), lr=1e-3, weight_decay=0.1)
    assert len(ours.param_groups) == 1
    theirs = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    theirs.step()
    ours.load_state_dict(theirs.state_dict())
    ours.step()
    theirs.load_state_dict(ours.state_dict())


def test_grouped_steps_match_torch_with_the_same_groups() -> None:
    torch.manual_seed(0)
    model = Tiny()
    twin = Tiny()
    twin.load_state_dict(model.state_dict())
    ours = optiplug.create("adamw", model, no_decay="auto", layer_decay=0.7, weight_decay=0.1)
    groups = param_groups(
        twin, no_decay="auto", layer_decay=0.7, hparams={"lr": 1e-3, "weight_decay": 0.1}
    )
    theirs = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.1)
    for module in (model, twin):
        for p in module.parameters():
            p.grad = torch.ones_like(p) * 0.5
    ours.step()
    theirs.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------ layer decay
def test_layer_decay_follows_the_formula() -> None:
    model = Tiny(layers=3)
    lr = _lr(optiplug.create("adamw", model, layer_decay=0.5, lr=1.0))
    num_layers = 4  # 3 blocks + 1
    assert lr["wte.weight"] == pytest.approx(0.5**num_layers)
    assert lr["h.0.attn.weight"] == pytest.approx(0.5**3)
    assert lr["h.2.attn.weight"] == pytest.approx(0.5**1)
    assert lr["head.weight"] == pytest.approx(1.0) and lr["norm_f.weight"] == pytest.approx(1.0)


@pytest.mark.parametrize("algorithm", ["sgd", "adam", "adamw", "lion"])
def test_every_algorithm_gets_groups(algorithm: str) -> None:
    optimizer = optiplug.create(
        algorithm, Tiny(), no_decay="auto", layer_decay=0.5, lr=0.1, weight_decay=0.1
    )
    wd, lr = _wd(optimizer), _lr(optimizer)
    assert wd["h.0.ln_1.weight"] == 0.0 and wd["h.0.attn.weight"] == 0.1
    assert lr["h.0.attn.weight"] == pytest.approx(0.1 * 0.5**3)


def test_muon_scales_both_halves_and_zeroes_the_adamw_half_decay() -> None:
    optimizer = optiplug.create(
        "muon", Tiny(), no_decay="auto", layer_decay=0.5, weight_decay=0.1, aux_weight_decay=0.1
    )
    rows = {row.name: row for row in param_groups_report(optimizer)}
    assert rows["wte.weight"].algorithm == "adamw" and rows["wte.weight"].weight_decay == 0.0
    assert rows["wte.weight"].lr == pytest.approx(3e-4 * 0.5**4)
    assert rows["h.0.attn.weight"].algorithm == "muon"
    assert rows["h.0.attn.weight"].weight_decay == 0.1
    muon_groups = [g for g in optimizer.param_groups if g["use_muon"]]
    assert sorted(g["lr"] for g in muon_groups) == pytest.approx(
        [0.02 * 0.5**3, 0.02 * 0.5**2, 0.02 * 0.5]
    )
    assert "layer 0/4" in rows["wte.weight"].reason


def test_multi_applies_grouping_per_route_over_the_whole_depth() -> None:
    optimizer = optiplug.create(
        "multi",
        Tiny(),
        routes=[
            {"algorithm": "sgd", "match": "wte.*", "lr": 1.0, "no_decay": None},
            {"algorithm": "adamw", "match": "*", "lr": 1.0, "weight_decay": 0.1},
        ],
        no_decay="auto",
        layer_decay=0.5,
    )
    rows = {row.name: row for row in param_groups_report(optimizer)}
    # the sgd route holds only the embedding, yet scales by the whole model's depth
    assert rows["wte.weight"].lr == pytest.approx(0.5**4)
    assert rows["h.1.attn.weight"].lr == pytest.approx(0.5**2)
    assert rows["h.1.attn.bias"].weight_decay == 0.0 and rows["h.1.attn.weight"].weight_decay == 0.1
    assert (
        "route 'adamw'" in rows["h.1.attn.bias"].reason and "bias" in rows["h.1.attn.bias"].reason
    )


def test_a_module_as_params_works_for_every_algorithm() -> None:
    model = Tiny()
    for name in ("sgd", "adam", "adamw", "lion"):
        assert optiplug.create(name, model, lr=0.1)
    with warnings.catch_warnings():
        # muon gets model=, so it knows the head: no RoutingWarning
        warnings.simplefilter("error", RoutingWarning)
        muon = optiplug.create("muon", model)
    assert muon.routing()["head.weight"].algorithm == "adamw"
    multi = optiplug.create("multi", model, routes=[{"algorithm": "sgd", "match": "*", "lr": 0.1}])
    assert len(param_groups_report(multi)) == len(list(model.parameters()))


# ------------------------------------------------------------------ properties
_widths = st.integers(1, 4)


@st.composite
def module_trees(draw: st.DrawFn) -> nn.Module:
    """Random trees of Linear / LayerNorm / Embedding / BatchNorm under containers and ``layers.N``."""
    leaves = [
        lambda w: nn.Linear(w, w, bias=draw(st.booleans())),
        lambda w: nn.LayerNorm(w),
        lambda w: nn.Embedding(3, w),
        lambda w: nn.BatchNorm1d(w),
    ]

    def tree(depth: int) -> nn.Module:
        width = draw(_widths)
        if depth == 0 or draw(st.booleans()):
            return draw(st.sampled_from(leaves))(width)
        children = nn.Module()
        for index in range(draw(st.integers(1, 3))):
            setattr(
                children,
                draw(st.sampled_from(["layers", "mod", "h"])) + f"_{index}",
                tree(depth - 1),
            )
        if draw(st.booleans()):
            children.layers = nn.ModuleList(tree(depth - 1) for _ in range(draw(st.integers(1, 3))))
        return children

    return tree(3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=module_trees(),
    decay=st.floats(0.1, 1.0),
    wd=st.floats(0.01, 1.0),
    patterns=st.lists(st.sampled_from(["*.bias", "*layers.0*", "auto", "*weight"]), max_size=2),
)
def test_every_parameter_lands_in_exactly_one_group(
    model: nn.Module, decay: float, wd: float, patterns: list[str]
) -> None:
    hparams = {"lr": 1.0, "weight_decay": wd}
    num_layers = count_layers(n for n, _ in model.named_parameters())
    if num_layers == 1:  # no block index in any name: layer_decay cannot count the layers
        with pytest.raises(HyperparameterError, match="cannot count the layers"):
            param_groups(model, no_decay=patterns or "auto", layer_decay=decay, hparams=hparams)
    explicit = num_layers if num_layers == 1 else None  # num_layers= makes it countable
    groups = param_groups(
        model,
        no_decay=patterns or "auto",
        layer_decay=decay,
        num_layers=explicit,
        hparams=hparams,
    )
    seen = [id(t) for g in groups for _, t in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())
    owner = {id(p): m for _, m in model.named_modules() for p in m.parameters(recurse=False)}
    auto = not patterns or "auto" in patterns
    globs = [p for p in patterns if p != "auto"]
    for group in groups:
        for name, tensor in group["params"]:
            module = owner[id(tensor)]
            excluded = any(fnmatch.fnmatchcase(name, g) for g in globs) or (
                auto
                and (
                    tensor.ndim < 2
                    or isinstance(module, (nn.LayerNorm, nn.Embedding, nn.BatchNorm1d))
                )
            )
            assert group.get("weight_decay", wd) == (0.0 if excluded else wd)
            layer = _expected_layer(name, num_layers, isinstance(module, nn.Embedding))
            assert group.get("lr", 1.0) == pytest.approx(decay ** (num_layers - layer))


def _expected_layer(name: str, num_layers: int, embedding: bool) -> int:
    parts = name.split(".")
    for key, index in itertools.pairwise(parts):
        if key in {"h", "layers"} and index.isdigit():
            return int(index) + 1
    return 0 if embedding else num_layers


def test_report_names_unnamed_parameters_by_position() -> None:
    tensors = [nn.Parameter(torch.ones(2, 2)), nn.Parameter(torch.ones(2))]
    optimizer = optiplug.create("adamw", tensors, no_decay="auto", weight_decay=0.1)
    rows = {row.name: row for row in param_groups_report(optimizer)}
    assert rows["#1"].reason == "no decay: 1-D" and rows["#1"].weight_decay == 0.0
    assert rows["#0"].weight_decay == 0.1


# ------------------------------------------------------------------ timm's conventions
# The expected groups below are derived by hand from timm's rules
# (timm.optim.param_groups_layer_decay / param_groups_weight_decay and
# timm.models.group_with_matcher), which tests/test_timm_conventions.py checks
# against timm itself where timm imports:
# - weight decay 0 for tensors with ndim <= 1 and names the model's
#   no_weight_decay() lists; everything else (conv kernels too) keeps it;
# - group_matcher(coarse=False) maps every name to a key: (the group's position
#   in the dict, the numbers the regex captured, the suffix); names no regex
#   matches get +inf (the head); the sorted distinct keys are numbered
#   0, 1, 2...; a key ending in 99999 shares the number of the key before it;
# - lr scale = layer_decay ** (top id - id), one group per (layer, decay).
# layer_decay=0.5 makes every scale a power of two, so lr = 1.0 * scale is exact.
class TimmBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.mlp = nn.Linear(width, width)


class PatchEmbed(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, width, kernel_size=2, stride=2)


class TimmViT(nn.Module):
    """timm's VisionTransformer conventions: its no_weight_decay() and group_matcher()."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.zeros(1, 5, width))
        self.patch_embed = PatchEmbed(width)
        self.blocks = nn.ModuleList(TimmBlock(width) for _ in range(2))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 3)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    def group_matcher(self, coarse: bool = False) -> dict[str, object]:
        return {
            "stem": r"^cls_token|pos_embed|patch_embed",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }


def _settings(optimizer: torch.optim.Optimizer) -> dict[str, tuple[float, float]]:
    return {row.name: (row.lr, row.weight_decay) for row in param_groups_report(optimizer)}


def test_vit_conventions_no_weight_decay_list_conv_kernel_and_matcher_layers() -> None:
    model = TimmViT()
    optimizer = optiplug.create(
        "adamw", model, no_decay="auto", layer_decay=0.5, lr=1.0, weight_decay=0.1
    )
    # keys: stem (0,) -> 0; blocks.0 (1, 0) -> 1; blocks.1 (1, 1) -> 2;
    # norm (1, 99999) joins blocks.1 -> 2; head (inf,) -> 3 = the top id
    assert _settings(optimizer) == {
        "cls_token": (0.5**3, 0.0),  # listed by no_weight_decay()
        "pos_embed": (0.5**3, 0.0),  # listed by no_weight_decay()
        "patch_embed.proj.weight": (0.5**3, 0.1),  # a 4-D conv kernel keeps its decay
        "patch_embed.proj.bias": (0.5**3, 0.0),
        "blocks.0.norm1.weight": (0.5**2, 0.0),
        "blocks.0.norm1.bias": (0.5**2, 0.0),
        "blocks.0.mlp.weight": (0.5**2, 0.1),
        "blocks.0.mlp.bias": (0.5**2, 0.0),
        "blocks.1.norm1.weight": (0.5, 0.0),
        "blocks.1.norm1.bias": (0.5, 0.0),
        "blocks.1.mlp.weight": (0.5, 0.1),
        "blocks.1.mlp.bias": (0.5, 0.0),
        "norm.weight": (0.5, 0.0),
        "norm.bias": (0.5, 0.0),
        "head.weight": (1.0, 0.1),
        "head.bias": (1.0, 0.0),
    }
    assert len(optimizer.param_groups) == 8  # 4 layers x (decay, no decay)
    reason = param_groups_report(optimizer)["pos_embed"].reason
    assert "TimmViT.no_weight_decay() lists 'pos_embed'" in reason


def test_auto_decides_kernels_by_shape_when_only_names_are_known() -> None:
    named = [
        ("patch_embed.proj.weight", nn.Parameter(torch.ones(4, 3, 2, 2))),
        ("patch_embed.proj.bias", nn.Parameter(torch.ones(4))),
        ("tok_embeddings.weight", nn.Parameter(torch.ones(5, 4))),
    ]
    optimizer = optiplug.create("adamw", named, no_decay="auto", weight_decay=0.1)
    rows = {row.name: row for row in param_groups_report(optimizer)}
    assert rows["patch_embed.proj.weight"].weight_decay == 0.1  # "embed" in its name, yet a kernel
    assert rows["patch_embed.proj.weight"].reason == "decay: 4-D kernel"
    assert rows["patch_embed.proj.bias"].weight_decay == 0.0
    assert rows["tok_embeddings.weight"].weight_decay == 0.0  # a 2-D table: the name decides


class TimmResNet(nn.Module):
    """timm's ResNet names (``layer1.0.``, not ``layers.0.``) and its group_matcher()."""

    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        for stage, blocks in ((1, 2), (2, 1)):
            stage_blocks = [
                nn.Sequential(nn.Conv2d(width, width, 3, bias=False)) for _ in range(blocks)
            ]
            setattr(self, f"layer{stage}", nn.Sequential(*stage_blocks))
        self.fc = nn.Linear(width, 3)

    def group_matcher(self, coarse: bool = False) -> dict[str, str]:
        return {"stem": r"^conv1|bn1|maxpool", "blocks": r"^layer(\d+)\.(\d+)"}


def test_resnet_conventions_layers_from_the_group_matcher() -> None:
    model = TimmResNet()
    optimizer = optiplug.create(
        "adamw", model, no_decay="auto", layer_decay=0.5, lr=1.0, weight_decay=0.1
    )
    # keys: conv1, bn1 (0,) -> 0; layer1.0 (1, 1, 0) -> 1; layer1.1 (1, 1, 1) -> 2;
    # layer2.0 (1, 2, 0) -> 3; fc (inf,) -> 4 = the top id
    assert _settings(optimizer) == {
        "conv1.weight": (0.5**4, 0.1),
        "bn1.weight": (0.5**4, 0.0),
        "bn1.bias": (0.5**4, 0.0),
        "layer1.0.0.weight": (0.5**3, 0.1),
        "layer1.1.0.weight": (0.5**2, 0.1),
        "layer2.0.0.weight": (0.5, 0.1),
        "fc.weight": (1.0, 0.1),
        "fc.bias": (1.0, 0.0),
    }
    assert len(optimizer.param_groups) == 7  # layer 0 and the head have both kinds


class TimmConvNeXt(nn.Module):
    """timm's ConvNeXt: a downsample shares block 0's layer, (99999,) joins the layer before."""

    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 2, stride=2)
        self.stages = nn.ModuleList([nn.Module(), nn.Module()])
        self.stages[0].blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(2))
        self.stages[1].downsample = nn.Conv2d(width, width, 2, stride=2, bias=False)
        self.stages[1].blocks = nn.ModuleList([nn.Linear(width, width, bias=False)])
        self.norm_pre = nn.LayerNorm(width)
        self.head = nn.Linear(width, 3, bias=False)

    def group_matcher(self, coarse: bool = False) -> dict[str, object]:
        return {
            "stem": r"^stem",
            "blocks": [
                (r"^stages\.(\d+)\.downsample", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm_pre", (99999,)),
            ],
        }


def test_convnext_conventions_tuple_suffixes_and_the_99999_override() -> None:
    model = TimmConvNeXt()
    groups = param_groups(
        model, no_decay="auto", layer_decay=0.5, hparams={"lr": 1.0, "weight_decay": 0.1}
    )
    got = {
        name: (group.get("lr", 1.0), group.get("weight_decay", 0.1))
        for group in groups
        for name, _ in group["params"]
    }
    # keys: stem (0,) -> 0; stages.0.blocks.0 (1, 0, 0) -> 1; stages.0.blocks.1
    # (1, 0, 1) -> 2; stages.1.downsample (1, 1) + suffix (0,) = (1, 1, 0) and
    # stages.1.blocks.0 (1, 1, 0) -> the same key, 3; norm_pre (1, 99999) joins
    # it -> 3; head (inf,) -> 4 = the top id
    assert got == {
        "stem.weight": (0.5**4, 0.1),
        "stem.bias": (0.5**4, 0.0),
        "stages.0.blocks.0.weight": (0.5**3, 0.1),
        "stages.0.blocks.0.bias": (0.5**3, 0.0),
        "stages.0.blocks.1.weight": (0.5**2, 0.1),
        "stages.0.blocks.1.bias": (0.5**2, 0.0),
        "stages.1.downsample.weight": (0.5, 0.1),
        "stages.1.blocks.0.weight": (0.5, 0.1),
        "norm_pre.weight": (0.5, 0.0),
        "norm_pre.bias": (0.5, 0.0),
        "head.weight": (1.0, 0.1),
    }
    assert len(groups) == 9  # layers 0-3 with both kinds, the head with one


class Flat(nn.Module):
    """No group_matcher() and no block index in any name: the layers cannot be counted."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 3)
        self.out = nn.LayerNorm(3)


def test_uncountable_layers_are_a_clear_error_not_one_group() -> None:
    with pytest.raises(HyperparameterError, match=r"layer_decay=0\.8: cannot count.*model Flat"):
        optiplug.create("adamw", Flat(), layer_decay=0.8)
    with pytest.raises(HyperparameterError, match=r"layer_decay=0\.8.*no model="):
        optiplug.create("adamw", Flat().named_parameters(), layer_decay=0.8)
    # num_layers= says how deep it is: then there is nothing to guess
    lr = _lr(optiplug.create("adamw", Flat(), layer_decay=0.5, num_layers=2, lr=1.0))
    assert lr == {"body.weight": 1.0, "body.bias": 1.0, "out.weight": 1.0, "out.bias": 1.0}


def test_a_group_matcher_with_one_layer_or_another_depth_is_refused() -> None:
    model = TimmResNet()
    with pytest.raises(HyperparameterError, match=r"num_layers=9.*TimmResNet's group_matcher"):
        optiplug.create("adamw", model, layer_decay=0.5, num_layers=9)
    model.group_matcher = lambda coarse=False: {"all": r".*"}  # type: ignore[method-assign]
    with pytest.raises(HyperparameterError, match=r"layer_decay=0\.5.*one layer"):
        optiplug.create("adamw", model, layer_decay=0.5)


def test_a_matcher_function_and_bad_timm_hooks() -> None:
    model = TimmResNet()
    # a function of the name: the keys it gives are sorted and numbered the same way;
    # conv1, bn1 (0,) -> 0; layer1.* (1,) -> 1; layer2.* (1, 99999) joins it -> 1; fc (5,) -> 2
    table = {"conv1": (0,), "bn1": (0,), "layer1": (1,), "layer2": (1, 99999), "fc": (5,)}
    model.group_matcher = lambda coarse=False: lambda n: table[n.split(".")[0]]  # type: ignore[method-assign]
    lr = _lr(optiplug.create("adamw", model, layer_decay=0.5, lr=1.0))
    assert lr["conv1.weight"] == 0.25 and lr["layer1.1.0.weight"] == 0.5
    assert lr["layer2.0.0.weight"] == 0.5 and lr["fc.bias"] == 1.0
    model.group_matcher = lambda coarse=False: {"blocks": r"^(\w+)\."}  # type: ignore[method-assign]
    with pytest.raises(HyperparameterError, match=r"TimmResNet\.group_matcher\(\).*not numbers"):
        optiplug.create("adamw", model, layer_decay=0.5)
    vit = TimmViT()
    vit.no_weight_decay = lambda: "pos_embed"  # type: ignore[assignment,method-assign,return-value]
    with pytest.raises(HyperparameterError, match=r"no_decay.*TimmViT\.no_weight_decay\(\)"):
        optiplug.create("adamw", vit, no_decay="auto", weight_decay=0.1)

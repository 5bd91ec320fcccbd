"""Graph(parallel="fsdp"): FSDP2 on 2 gloo processes (tests/fsdp_worker.py), and `optiplug train`.

One 2-process run of the worker covers every Graph scenario; its results are
compared here with the same training in this one process, on the same global
batches. The worker trains in float64 so that the only differences left are
summation order: the reduce-scatter averages two per-rank gradients, each the
mean over 4 windows x 8 positions, where one process takes the mean over all
64 terms at once.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import optiplug
from optiplug.cli import main
from optiplug.errors import GraphError, HyperparameterError
from optiplug_train.config import TrainConfig
from optiplug_train.model import next_token_loss

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.distributed.is_available(), reason="torch.distributed unavailable"
    ),
]

WORKER = Path(__file__).with_name("fsdp_worker.py")
sys.path.insert(0, str(WORKER.parent))
import fsdp_worker  # noqa: E402
from rank_processes import run_ranks  # noqa: E402

# Tolerance of float64 FSDP training against one process (3 steps). A gradient
# element is a sum of at most 64 per-token terms; summed in another order it
# changes by at most 64 * 2**-53 * sum|terms| (about 7e-15 of the terms' size,
# which are O(1) here). An SGD step moves a parameter by lr * g (lr 0.1, momentum
# adding at most 1 + 0.9 + 0.81 of it over 3 steps): at most 3e-15. An Adam step
# lr * m / (sqrt(v) + eps) changes by at most lr / 4 times the relative change of g
# (d/dg of g / (|g| + eps) is eps / (|g| + eps)**2 <= 1 / (4 |g|)), but a gradient
# that cancels to near zero has a large relative change; allowing relative changes
# up to 1e-10 for those gives 3 steps * lr 1e-2 * 1e-10 / 4, below 1e-12. Every
# parameter difference then feeds the next steps' gradients, through the model's
# O(1) Jacobian. So: 1e-12 absolute, and no relative part.
ATOL = 1e-12


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fsdp")
    outcome = run_ranks(WORKER, 2, [str(out)], timeout=180)
    assert [code for code, _ in outcome] == [0, 0], outcome
    found = [torch.load(out / f"results{rank}.pt", weights_only=False) for rank in (0, 1)]
    return {"rank0": found[0], "rank1": found[1]}


def reference(
    algorithm: str,
    impl: str = "loop",
    *,
    batches: list[int] | None = None,
    clip: float | None = None,
) -> tuple[list[torch.Tensor], list[float]]:
    """The worker's training in one process on the global batches (8 windows each)."""
    model = fsdp_worker.model()
    hparams = {**fsdp_worker.HPARAMS.get(algorithm, {}), "lr": fsdp_worker.LR[algorithm]}
    optimizer = optiplug.create(algorithm, list(model.named_parameters()), impl=impl, **hparams)
    rows = fsdp_worker.Windows().rows
    norms = []
    for step in range(fsdp_worker.STEPS) if batches is None else batches:
        batch = rows[8 * step : 8 * step + 8]
        optimizer.zero_grad()
        next_token_loss(model(batch[:, :-1]), batch[:, 1:]).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
    return [p.detach() for p in model.parameters()], norms


def assert_close(found: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for p, q in zip(found, expected, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=ATOL)


def key_bias(index: int) -> slice | None:
    """Where a block's attention key bias sits in parameter ``index``, else None.

    Its exact gradient is zero (softmax is invariant to a constant added to
    every key), so what backward computes there is rounding noise.
    """
    names = [name for name, _ in fsdp_worker.model().named_parameters()]
    width = fsdp_worker.WIDTH
    return slice(width, 2 * width) if names[index].endswith("qkv.bias") else None


@pytest.mark.parametrize("impl", ["loop", "foreach"])
@pytest.mark.parametrize("algorithm", ["adamw", "adam", "sgd"])
def test_fsdp_training_equals_one_process_on_the_global_batch(
    results: dict[str, Any], algorithm: str, impl: str
) -> None:
    found = results["rank0"][f"train/{algorithm}/{impl}"]
    other = results["rank1"][f"train/{algorithm}/{impl}"]
    assert all(torch.equal(p, q) for p, q in zip(found, other, strict=True))  # gathered alike
    assert_close(found, reference(algorithm, impl)[0])
    # each transformer block is its own unit; embeddings, final norm and head are the root's
    assert results["rank0"][f"units/{algorithm}/{impl}"] == ("blocks.0", "blocks.1")


@pytest.mark.parametrize("impl", ["loop", "foreach"])
def test_fsdp_lion_equals_one_process_up_to_the_sign_of_rounding_noise(
    results: dict[str, Any], impl: str
) -> None:
    # Lion moves every element by exactly lr * sign(c). Where c is a real number
    # both runs agree to rounding (ATOL, as for Adam). The attention key biases
    # have an exact gradient of zero, so c there is rounding noise whose sign each
    # run draws differently: each step moves them by +-lr in either run, a
    # difference of at most 2 * lr * steps, and nowhere else may differ.
    found = results["rank0"][f"train/lion/{impl}"]
    expected, _ = reference("lion", impl)
    noise_bound = 2 * fsdp_worker.LR["lion"] * fsdp_worker.STEPS
    for index, (p, q) in enumerate(zip(found, expected, strict=True)):
        where = key_bias(index)
        if where is not None:
            assert float((p[where] - q[where]).abs().max()) <= noise_bound
            p, q = p.clone(), q.clone()
            p[where] = q[where] = 0
        torch.testing.assert_close(p, q, rtol=0, atol=ATOL)


def test_accumulation_defers_the_reduce_scatter_and_equals_one_big_batch(
    results: dict[str, Any],
) -> None:
    # 2 micro-batches of 2 windows per rank: one step on the 8-window global batch
    assert_close(results["rank0"]["accumulate"], reference("adamw")[0])
    # after a non-final micro-batch's backward nothing was reduce-scattered yet
    assert results["rank0"]["nonfinite"]["unsynced_grad_is_none"]


def test_clipping_sharded_gradients_equals_one_process(results: dict[str, Any]) -> None:
    expected, norms = reference("adamw", clip=0.05)
    assert_close(results["rank0"]["clip"], expected)
    for rank in ("rank0", "rank1"):  # the norm is reduced over the shards: one value everywhere
        found = results[rank]["clip_norms"]
        # the norm is a sqrt of a sum of squares over every element: rounding 2**-53 per term
        assert found == pytest.approx(norms, rel=1e-12, abs=0)
        assert min(found) > 0.05  # it did clip


def test_nonfinite_gradient_on_one_shard_stops_or_skips_every_rank(
    results: dict[str, Any],
) -> None:
    zero, one = results["rank0"]["nonfinite"], results["rank1"]["nonfinite"]
    assert "a gradient shard of another rank is not finite at step 1" in zero["stop"]
    assert "the gradient of parameter 'embed.weight' is not finite at step 1" in one["stop"]
    for found in (zero, one):
        assert found["stop_unchanged"] and found["stop_step"] == 0
        assert found["skip_stepped"] is False and found["skip_unchanged"]
        assert found["skip_then_stepped"] and found["skip_counts"] == (1, 1)
        assert found["dropped_stepped"] is False and found["dropped_skipped"]
        assert found["dropped_then_stepped"]
    # the dropped accumulation left nothing behind: one step on the second global batch
    assert_close(zero["dropped_params"], reference("adamw", batches=[1])[0])


def test_unsupported_kernels_are_excluded_for_sharded_parameters(
    results: dict[str, Any],
) -> None:
    choices = results["rank0"]["impl"]
    for algorithm in ("adamw", "sgd", "lion"):
        assert choices[f"{algorithm}/auto"] in ("loop", "foreach")
        # the choice says why fused was left out (optiplug.base.excluded_implementations)
        assert f"{algorithm}|cpu/torch.float64 DTensor" in choices["excluded"], choices["excluded"]
        reasons = choices["excluded"][f"{algorithm}|cpu/torch.float64 DTensor"]
        assert reasons["fused"] == ("does not support these parameters (cpu/torch.float64 DTensor)")
        assert (
            "invalid impl='fused': does not support these parameters"
            in (choices[f"{algorithm}/fused"])
        )


def test_each_fsdp_rank_holds_half_the_optimizer_state(results: dict[str, Any]) -> None:
    # FSDP2 shards every tensor on dim 0 in chunks of ceil(rows / 2): rank 0 holds
    # ceil, rank 1 floor, so each rank is within half a row of half the tensor, per
    # tensor and slot. The 0-d "step" tensors are not sharded: every rank holds them.
    model = fsdp_worker.model()
    half_row = sum(8 * p.numel() // p.shape[0] for p in model.parameters()) / 2
    ddp, shards = None, []
    for rank in (0, 1):
        memory = results[f"rank{rank}"][f"memory{rank}"]
        assert memory["ddp_wrapped"] == "DistributedDataParallel"
        assert memory["fsdp"]["total"] == memory["fsdp"]["report_total"]
        ddp = memory["ddp"]["by_slot"]
        assert ddp["exp_avg"] == 8 * sum(p.numel() for p in model.parameters())
        fsdp = memory["fsdp"]["by_slot"]
        assert fsdp["step"] == ddp["step"]
        for slot in ("exp_avg", "exp_avg_sq"):
            assert abs(fsdp[slot] - ddp[slot] / 2) <= half_row
        shards.append(fsdp)
    assert ddp is not None
    for slot in ("exp_avg", "exp_avg_sq"):  # the shards partition the state exactly
        assert shards[0][slot] + shards[1][slot] == ddp[slot]


def test_bf16_is_fsdps_mixed_precision_policy(results: dict[str, Any]) -> None:
    found = results["rank0"]["bf16"]
    # computed in bf16, returned in float32 for the loss; sharded parameters and the
    # optimizer state stay in the parameters' own dtype
    assert found == {
        "output": "torch.float32",
        "param": "torch.float64",
        "state": "torch.float64",
        "stepped": True,
    }


def test_fp16_under_fsdp_scales_the_loss_alike_on_every_rank(results: dict[str, Any]) -> None:
    zero, one = results["rank0"]["fp16"], results["rank1"]["fp16"]
    assert zero["scaler"] == "ShardedGradScaler"
    # the scale (and so whether a step was skipped) is agreed: one inf check for all ranks
    assert zero["scale"] == one["scale"] and zero["steps"] == one["steps"] >= 1
    assert all(torch.equal(p, q) for p, q in zip(zero["params"], one["params"], strict=True))
    assert all(bool(torch.isfinite(p).all()) for p in zero["params"])


def test_bad_parallel_values_raise_typed_errors_naming_the_parameter() -> None:
    module = torch.nn.Linear(2, 2)
    with pytest.raises(HyperparameterError, match="parallel"):
        optiplug.Graph(module, parallel="zero")
    with pytest.raises(HyperparameterError, match="fsdp_min_params"):
        optiplug.Graph(module, parallel="fsdp", fsdp_min_params=0)
    with pytest.raises(GraphError, match=r"parallel='fsdp'\) needs an initialised"):
        optiplug.Graph(module, parallel="fsdp")
    assert optiplug.Graph(module).parallel == "ddp"
    with pytest.raises(HyperparameterError, match="parallel"):
        TrainConfig(parallel="zero")
    with pytest.raises(HyperparameterError, match="--parallel fsdp runs gloo"):
        TrainConfig(parallel="fsdp", device="meta")


TINY = [
    "--layers", "1", "--d-model", "32", "--heads", "2", "--block-size", "32",
    "--batch-size", "8", "--max-chars", "100000", "--sample-chars", "40",
    "--eval-windows", "16", "--impl", "loop", "--threads", "1", "--quiet", "--steps", "8",
]  # fmt: skip


def losses(out: str) -> dict[str, float]:
    return {
        name: float(re.search(rf"^{name}\s+([\d.]+)", out, re.MULTILINE).group(1))
        for name in ("train", "validation")
    }


def test_train_command_runs_fsdp_in_two_processes_and_resumes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The float32 run differs from one process by summation order only, as under
    # DDP (tests/test_train.py compares those two with the same bound). It stops at
    # step 4 with a (sharded) checkpoint and resumes to step 8.
    assert main(["train", *TINY]) == 0
    single = losses(capfd.readouterr().out)
    run = str(tmp_path / "run")
    fsdp = ["--nproc", "2", "--parallel", "fsdp"]
    assert main(["train", *TINY, *fsdp, "--stop-at", "4", "--save", run]) == 0
    out = capfd.readouterr().out
    assert "sharding: FSDP2 (fully_shard) over 2 process(es)" in out
    assert out.count("step 4/4") == 1  # rank 0 alone logs, though every rank evaluates
    assert main(["train", "--resume", run, "--quiet", "--sample-chars", "40"]) == 0
    out = capfd.readouterr().out
    assert "to step 8 (resumed at step 4)" in out and "sharding: FSDP2" in out
    for name, value in losses(out).items():
        assert value == pytest.approx(single[name], abs=2e-3)


def test_train_command_refuses_fsdp_with_compare(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *TINY, "--parallel", "fsdp", "--compare", "adamw,lion"]) == 2
    assert "drop --parallel fsdp" in capsys.readouterr().err

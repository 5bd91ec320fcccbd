"""Graph under torch.distributed: 2 gloo processes on this machine (tests/ddp_worker.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.distributed.is_available(), reason="torch.distributed unavailable"
    ),
]

WORKER = Path(__file__).with_name("ddp_worker.py")
sys.path.insert(0, str(WORKER.parent))
import ddp_worker  # noqa: E402
from rank_processes import run_ranks  # noqa: E402
from rounding import assert_within_rounding, identity_order  # noqa: E402


def run_two_ranks(
    out: Path, steps: int, *extra: str, timeout: float
) -> list[tuple[int | None, str]]:
    """The DDP worker on 2 ranks: ``(returncode, stderr)`` per rank."""
    return run_ranks(WORKER, 2, [str(out), str(steps), *extra], timeout)


def single_process_reference(
    steps: int,
    accumulate: int = 1,
    clip: float | None = None,
    dtype: torch.dtype = torch.float32,
    order: Callable[[int], torch.Tensor] = identity_order,
) -> tuple[list[torch.Tensor], float | None]:
    """The same training on the global batches (both ranks' samples) in one process.

    ``dtype`` and ``order`` (a permutation of each global batch's rows) change
    only the rounding; :mod:`rounding` measures the tolerance from them.
    Returns the parameters and, with ``clip``, the last step's norm before clipping.
    """
    model = ddp_worker.model().to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = ddp_worker.Lines()
    inputs, targets = data.x.to(dtype), data.y.to(dtype)
    global_batch = 8 * accumulate  # 2 ranks x 4 samples x micro-batches
    norm = None
    for step in range(steps):
        start = (step * global_batch) % len(data)
        rows = start + order(global_batch)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]).backward()
        if clip is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        optimizer.step()
    return [p.detach() for p in model.parameters()], norm


@pytest.mark.parametrize(("accumulate", "clip"), [(1, None), (2, None), (2, 1.0)])
def test_two_ranks_agree_and_equal_single_process_training(
    tmp_path: Path, accumulate: int, clip: float | None
) -> None:
    steps = 12
    clipping = ("--clip", str(clip)) if clip is not None else ()
    results = run_two_ranks(
        tmp_path, steps, "--accumulate", str(accumulate), *clipping, timeout=120
    )
    assert [code for code, _ in results] == [0, 0], results
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert all(torch.equal(p, q) for p, q in zip(rank0, rank1, strict=True))
    # the all-reduce sums the ranks' gradients in another order than one process
    # does: equal up to the float32 rounding spread of this training, measured here
    assert_within_rounding(
        rank0,
        lambda dtype, order: single_process_reference(steps, accumulate, clip, dtype, order)[0],
        start=list(ddp_worker.model().parameters()),
    )
    # clipping runs at the step, on the all-reduced gradients: one norm on every rank,
    # the global batch's (and it did clip)
    norms = [(tmp_path / f"norm{rank}.txt").read_text() for rank in (0, 1)]
    assert norms[0] == norms[1]
    if clip is not None:
        assert_within_rounding(
            [torch.tensor(float(norms[0]))],
            lambda dtype, order: [
                torch.tensor(single_process_reference(steps, accumulate, clip, dtype, order)[1])
            ],
        )
        assert float(norms[0]) > clip
    # micro-batches before the last of each accumulation skip the all-reduce (DDP no_sync)
    assert int((tmp_path / "syncs0.txt").read_text()) == steps


def test_ranks_agree_on_the_measured_implementation(tmp_path: Path) -> None:
    """Fused and loop SGD differ by an ulp: ranks that chose alone drifted apart."""
    results = run_two_ranks(tmp_path, 2, timeout=120)
    assert [code for code, _ in results] == [0, 0], results
    choice0, choice1 = (json.loads((tmp_path / f"choice{r}.json").read_text()) for r in (0, 1))
    assert choice0["graph_impl"] == choice1["graph_impl"]
    # the slowest rank's times, all-reduced: identical floats on both ranks
    assert choice0["agreed"] == choice1["agreed"] != {}
    (winner, timings), *_ = choice0["agreed"].values()
    assert winner == choice0["graph_impl"] == min(timings, key=timings.get)
    # outside a Graph, several ranks measure nothing and take the declared priority
    for choice in (choice0, choice1):
        assert choice["bare_impl"] == "fused" and choice["bare_measured"] == 0


def test_killed_rank_fails_the_job_cleanly_and_last_checkpoint_loads(tmp_path: Path) -> None:
    started = time.monotonic()
    results = run_two_ranks(tmp_path, 1000, "--die-after", "6", "--save-every", "3", timeout=90)
    elapsed = time.monotonic() - started
    (code0, err0), (code1, _) = results
    assert code1 == -9  # rank 1 was killed
    assert code0 not in (0, None), err0  # rank 0 failed instead of hanging
    assert elapsed < 60
    import optiplug

    graph = optiplug.Graph(ddp_worker.model())
    graph.set_optimizer("sgd", lr=0.05, momentum=0.9)
    graph.load(tmp_path / "ckpt")
    assert graph.training_step == 6

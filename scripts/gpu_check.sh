#!/usr/bin/env bash
# The GPU check: every CUDA test, optiplug-fused's CUDA-graph and device runs,
# its (BLOCK, num_warps) sweep, benchmarks/bench_cuda.py, low-precision state's
# step time against torchao (benchmarks/bench_state_precision.py) and a
# one-GPU NCCL FSDP run, in one go, ending with one summary table
# (docs/performance.md).
#
#   bash scripts/gpu_check.sh          # from the repository root, on a CUDA machine
#
# It installs core/ and plugins/* into a fresh --target folder (no network
# needed; torch and triton must already be importable) and puts that folder on
# PYTHONPATH. Logs go to $OUT if set, else to a new temporary folder.
#
# Environment: PYTHON (the interpreter; default python3), OUT (the log folder),
# GPU_CHECK_BUDGET (seconds for the whole check; default 500: each step's
# timeout is cut to what is left of it).
#
# Exit status: 0 every step passed; 1 a step failed; 2 no CUDA device (or no
# torch), found before anything is installed or run.
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-500}
START=$SECONDS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

# ------------------------------------------------ a CUDA device, before any install
probe=$("$PY" - 2>&1 <<'EOF'
import sys
try:
    import torch
except Exception as error:
    print(f"torch cannot be imported ({type(error).__name__}: {error})")
    sys.exit(2)
if not torch.cuda.is_available():
    print(f"torch.cuda.is_available() is False (torch {torch.__version__})")
    sys.exit(2)
print(torch.cuda.get_device_name())
EOF
)
found=$?
if ((found == 2)); then
    echo "gpu_check: no CUDA device: $probe; nothing was run." >&2
    exit 2
elif ((found != 0)); then
    echo "gpu_check: cannot look for a CUDA device ($PY exited $found): $probe" >&2
    exit 2
fi

LOG=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/optiplug-gpu-check.XXXXXX")}
mkdir -p "$LOG" || exit 1
echo "gpu_check: logs in $LOG"

STEPS=() RESULTS=() TIMES=()
FAILED=0
record() {  # record STEP RESULT SECONDS; a result starting with "fail" fails the check
    STEPS+=("$1") RESULTS+=("$2") TIMES+=("$3")
    [[ $2 == fail* ]] && FAILED=1
    echo "gpu_check: $1: $2 (${3}s)"
}
limit() {  # a step's timeout: at most $1 seconds, within what is left of the budget
    local rest=$((BUDGET - (SECONDS - START) - 15))
    ((rest < 10)) && rest=10
    echo $((rest < $1 ? rest : $1))
}
heading() { printf '\n======== %s\n' "$1"; }

# ------------------------------------------------ 1. device and versions
heading "device"
t=$SECONDS
{
    if command -v nvidia-smi >/dev/null; then
        timeout 20 nvidia-smi -L
    fi
    "$PY" - <<'EOF'
import platform

import torch

try:
    import triton

    triton_version = triton.__version__
except Exception as error:  # reported, not fatal: the tests say what it breaks
    triton_version = f"not importable ({type(error).__name__}: {error})"
major, minor = torch.cuda.get_device_capability()
nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else "unavailable"
print(f"device: {torch.cuda.get_device_name()} (sm_{major}{minor}), {torch.cuda.device_count()} visible")
print(f"python {platform.python_version()}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
      f"triton {triton_version}; NCCL {nccl}")
EOF
} 2>&1 | tee "$LOG/env.txt"
if ((PIPESTATUS[0] == 0)); then
    record "device" "pass ($probe)" $((SECONDS - t))
else
    record "device" "fail (see env.txt)" $((SECONDS - t))
fi

# ------------------------------------------------ 2. install optiplug and its plugins
heading "install"
t=$SECONDS
SITE=$(mktemp -d "${TMPDIR:-/tmp}/optiplug-site.XXXXXX")
# built from a copy, so the build leaves nothing (build/, *.egg-info) in the checkout
SOURCES=$(mktemp -d "${TMPDIR:-/tmp}/optiplug-sources.XXXXXX")
{
    cp -R core plugins "$SOURCES/" &&
        timeout "$(limit 120)" "$PY" -m pip install -q --no-deps --no-build-isolation --no-index \
            --target "$SITE" "$SOURCES/core" "$SOURCES"/plugins/* &&
        PYTHONPATH="$SITE" "$PY" - <<'EOF'
import optiplug
import optiplug_fused

print("optiplug", optiplug.__version__, "from", optiplug.__file__)
print("optiplug_fused from", optiplug_fused.__file__)
for name in ("adamw", "lion"):
    records = optiplug.default_registry().implementations(name)
    print(name, ", ".join(f"{r.name}: {r.unavailable_reason() or 'available'}" for r in records))
EOF
} >"$LOG/install.log" 2>&1
installed=$?
cat "$LOG/install.log"
if ((installed == 0)); then
    export PYTHONPATH="$SITE"
    record "install" "pass" $((SECONDS - t))
else
    record "install" "fail (see install.log)" $((SECONDS - t))
fi

# pytest, hypothesis and pytest-xdist: installed if missing (the machine may have no network)
have_pytest=1
if ((installed == 0)) && ! "$PY" -c 'import pytest, hypothesis, xdist' 2>/dev/null; then
    echo "gpu_check: pytest, hypothesis or pytest-xdist is missing: installing them"
    if ! timeout "$(limit 90)" "$PY" -m pip install -q --retries 1 --timeout 15 \
        pytest hypothesis pytest-xdist >>"$LOG/install.log" 2>&1; then
        echo "gpu_check: could not install them (no network?): running what does not need them"
    fi
    "$PY" -c 'import pytest, hypothesis' 2>/dev/null || have_pytest=0
fi
PYTEST_OPTIONS=(-q -p no:cacheprovider -m "slow or not slow" -k cuda)
if "$PY" -c 'import xdist' 2>/dev/null; then
    PYTEST_OPTIONS+=(-n 0)
else  # the project's addopts name xdist's options: replace them
    PYTEST_OPTIONS+=(-o "addopts=-ra --strict-markers")
fi

# ------------------------------------------------ 3. every CUDA test
# Selected with `-k cuda`: the tests parametrised with a "cuda" device, the
# ones named after it, and those marked `cuda` (their outcome depends on a
# CUDA device being present), slow ones included, in the test files that
# mention cuda at all (tests/test_fused_tables.py has its own step, next).
heading "CUDA tests"
t=$SECONDS
if ((installed != 0)); then
    record "CUDA tests" "skip (install failed)" 0
elif ((have_pytest == 0)); then
    record "CUDA tests" "fail (pytest or hypothesis missing, no network to install them)" 0
else
    FILES=()
    for file in tests/test_*.py; do
        [[ $file == tests/test_fused_tables.py ]] && continue
        grep -q cuda "$file" && FILES+=("$file")
    done
    echo "files: ${FILES[*]}"
    timeout "$(limit 240)" "$PY" -m pytest "${PYTEST_OPTIONS[@]}" "${FILES[@]}" 2>&1 |
        tee "$LOG/cuda-tests.log"
    rc=${PIPESTATUS[0]}
    counts=$(grep -E '^=*.* in [0-9.]+s' "$LOG/cuda-tests.log" | tail -n 1 |
        grep -oE '[0-9]+ (passed|failed|errors?|skipped|xfailed|xpassed)' | paste -sd, - |
        sed 's/,/, /g')
    if ((rc == 0)); then
        record "CUDA tests" "pass (${counts:-no counts})" $((SECONDS - t))
    elif ((rc == 124 || rc == 137)); then
        record "CUDA tests" "fail (timed out; see cuda-tests.log)" $((SECONDS - t))
    elif ((rc == 5)); then
        record "CUDA tests" "fail (no test selected)" $((SECONDS - t))
    else
        record "CUDA tests" "fail (${counts:-exit $rc}; see cuda-tests.log)" $((SECONDS - t))
    fi
fi

# ------------------------------------------------ 3b. optiplug-fused: CUDA graphs, devices
# tests/test_fused_tables.py's CUDA tests: no host sync in a step (sync debug
# mode "error"), torch's whole-network CUDA-graph recipe captured and replayed
# against eager steps, a replay across an in-place table rebuild, and, when
# two devices are visible, a bucket on cuda:1 while cuda:0 is current.
heading "CUDA graphs, devices"
t=$SECONDS
if ((installed != 0)); then
    record "CUDA graphs, devices" "skip (install failed)" 0
elif ((have_pytest == 0)); then
    record "CUDA graphs, devices" "fail (pytest or hypothesis missing)" 0
else
    timeout "$(limit 120)" "$PY" -m pytest "${PYTEST_OPTIONS[@]}" -rA tests/test_fused_tables.py \
        2>&1 | tee "$LOG/fused-graphs.log"
    rc=${PIPESTATUS[0]}
    devices=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null)
    counts=$(grep -E '^=*.* in [0-9.]+s' "$LOG/fused-graphs.log" | tail -n 1 |
        grep -oE '[0-9]+ (passed|failed|errors?|skipped)' | paste -sd, - | sed 's/,/, /g')
    result="${counts:-no counts}; ${devices:-?} devices"
    if ((rc == 0)); then
        record "CUDA graphs, devices" "pass ($result)" $((SECONDS - t))
    elif ((rc == 124 || rc == 137)); then
        record "CUDA graphs, devices" "fail (timed out; see fused-graphs.log)" $((SECONDS - t))
    else
        record "CUDA graphs, devices" "fail ($result; see fused-graphs.log)" $((SECONDS - t))
    fi
fi

# ------------------------------------------------ 3c. optiplug-fused launch sweep
# (BLOCK, num_warps) of the update kernels, timed on this device for AdamW
# bf16 and fp32 (optiplug_fused.tuning.sweep); the fastest goes in the summary.
heading "launch sweep"
t=$SECONDS
if ((installed != 0)); then
    record "launch sweep" "skip (install failed)" 0
else
    timeout "$(limit 100)" "$PY" benchmarks/bench_cuda.py --sweep --sets "" --steps 20 2>&1 |
        tee "$LOG/launch-sweep.txt"
    rc=${PIPESTATUS[0]}
    best=$(grep -oE 'float32 BLOCK=[0-9]+ num_warps=[0-9]+' "$LOG/launch-sweep.txt" | head -n 1)
    if ((rc == 0)) && [[ -n $best ]]; then
        record "launch sweep" "pass (best $best)" $((SECONDS - t))
    elif ((rc == 124 || rc == 137)); then
        record "launch sweep" "fail (timed out; see launch-sweep.txt)" $((SECONDS - t))
    else
        record "launch sweep" "fail (exit $rc; see launch-sweep.txt)" $((SECONDS - t))
    fi
fi

# ------------------------------------------------ 4. bench_cuda.py
# adamw on every parameter set: the sets the targets name, and the ratios
# against torch's fused AdamW measured in the same run (lion has no torch kernel).
heading "bench_cuda.py"
t=$SECONDS
if ((installed != 0)); then
    record "bench_cuda.py" "skip (install failed)" 0
else
    timeout "$(limit 150)" "$PY" benchmarks/bench_cuda.py --sets a,b,c,d --algorithms adamw \
        --steps 20 2>&1 | tee "$LOG/bench_cuda.txt"
    rc=${PIPESTATUS[0]}
    tables=$(grep -c '^adamw, (' "$LOG/bench_cuda.txt")
    skipped=$(grep -c ': skipped (' "$LOG/bench_cuda.txt")
    if ((rc == 124 || rc == 137)); then
        record "bench_cuda.py" "fail (timed out after $tables of 4 sets)" $((SECONDS - t))
    elif ((rc != 0)); then
        record "bench_cuda.py" "fail (exit $rc; see bench_cuda.txt)" $((SECONDS - t))
    elif ((skipped > 0)); then
        record "bench_cuda.py" "fail ($skipped optimizers not measured)" $((SECONDS - t))
    else
        record "bench_cuda.py" "pass ($tables sets measured)" $((SECONDS - t))
    fi
fi

# ------------------------------------------------ 4b. low-precision state on CUDA
# AdamW with int8, int4 and bf16 state (the decode, torch's fused CUDA step,
# encode path) against torch's fused fp32 step and torchao's AdamW8bit and
# AdamW4bit, paired steps of the same run; the CUDA codes' equality with the
# CPU's is among the CUDA tests above (tests/test_state_precision_cuda.py).
heading "state precision"
t=$SECONDS
if ((installed != 0)); then
    record "state precision" "skip (install failed)" 0
else
    timeout "$(limit 150)" "$PY" benchmarks/bench_state_precision.py --device cuda --rounds 3 \
        2>&1 | tee "$LOG/state-precision.txt"
    rc=${PIPESTATUS[0]}
    int8=$(awk '/^adamw int8 /{print $4}' "$LOG/state-precision.txt")
    peer=$(awk '/^torchao AdamW8bit /{print $4}' "$LOG/state-precision.txt")
    if ((rc == 124 || rc == 137)); then
        record "state precision" "fail (timed out; see state-precision.txt)" $((SECONDS - t))
    elif ((rc != 0)) || [[ -z $int8 ]]; then
        record "state precision" "fail (exit $rc; see state-precision.txt)" $((SECONDS - t))
    else
        record "state precision" "pass (int8 ${int8}x fp32 fused, AdamW8bit ${peer:-?}x)" \
            $((SECONDS - t))
    fi
fi

# ------------------------------------------------ 5. one-GPU NCCL FSDP run
# Graph(parallel="fsdp") over a process group of one rank on the NCCL backend
# (`optiplug train --parallel fsdp` runs gloo on the CPU only): fp32, then
# FSDP2 bf16 mixed precision; passes if both finish and every loss is finite.
heading "FSDP (NCCL, 1 GPU)"
t=$SECONDS
if ((installed != 0)); then
    record "FSDP (NCCL, 1 GPU)" "skip (install failed)" 0
else
    timeout "$(limit 120)" "$PY" - <<'EOF' 2>&1 | tee "$LOG/fsdp-smoke.log"
import datetime
import math
import sys
import tempfile

import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Dataset

import optiplug

BACKEND, DEVICE, STEPS = "nccl", "cuda", 20


class Pairs(Dataset):
    """256 fixed (x, y) pairs of a noisy linear map."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(256, 32, generator=generator)
        weight = torch.randn(32, 1, generator=generator)
        self.y = self.x @ weight + 0.01 * torch.randn(256, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


def run(precision: str | None) -> bool:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128)]
    model = torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Linear(128, 1))
    # the two larger Linear layers are their own units, the root holds the last
    built = optiplug.Graph(
        model, device=DEVICE, parallel="fsdp", fsdp_min_params=1000, precision=precision
    )
    built.set_optimizer("adamw", lr=1e-2)
    built.set_data_loader(DataLoader(Pairs(), batch_size=32, shuffle=True), forward_input="x")
    losses: list[float] = []
    epoch = 0
    while built.training_step < STEPS:
        for batch in built.epoch(epoch):
            out = built.forward_batch(batch).float()
            loss = torch.nn.functional.mse_loss(out, built.targets(batch)["y"])
            built.backward(loss)
            built.step()
            losses.append(loss.item())
            if built.training_step >= STEPS:
                break
        epoch += 1
    param = built.parameters()[0]
    sharded = isinstance(param, DTensor) and param.device.type == DEVICE
    finite = all(math.isfinite(value) for value in losses)
    print(
        f"precision {precision or 'fp32'}: {built.training_step} steps, impl "
        f"{getattr(built.optimizer, 'impl', '?')}, parameters "
        f"{type(param).__name__} on {param.device}, loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    )
    if not sharded:
        print("  FAIL: the parameters are not DTensor shards on the device")
    if not finite:
        print(f"  FAIL: non-finite loss: {losses}")
    return sharded and finite


def main() -> int:
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as scratch:
        torch.distributed.init_process_group(
            BACKEND,
            init_method=f"file://{scratch}/rendezvous",
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=60),
        )
        try:
            print(f"backend {torch.distributed.get_backend()}, world size 1")
            ok = [run(precision) for precision in (None, "bf16")]
        finally:
            torch.distributed.destroy_process_group()
    print("FSDP smoke: " + ("pass" if all(ok) else "FAIL"))
    return 0 if all(ok) else 1


sys.exit(main())
EOF
    rc=${PIPESTATUS[0]}
    if ((rc == 0)); then
        record "FSDP (NCCL, 1 GPU)" "pass (fp32 and bf16, 20 steps each)" $((SECONDS - t))
    elif ((rc == 124 || rc == 137)); then
        record "FSDP (NCCL, 1 GPU)" "fail (timed out; see fsdp-smoke.log)" $((SECONDS - t))
    else
        record "FSDP (NCCL, 1 GPU)" "fail (exit $rc; see fsdp-smoke.log)" $((SECONDS - t))
    fi
fi

# ------------------------------------------------ summary
rm -rf "$SITE" "$SOURCES"
highlights=$(grep -E '^adamw, \(|^  (torch AdamW fused|optiplug adamw triton) |triton vs torch' \
    "$LOG/bench_cuda.txt" 2>/dev/null)
sweep=$(grep -E '^launch sweep|^ +BLOCK|^ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+$' \
    "$LOG/launch-sweep.txt" 2>/dev/null)
if [[ -n $sweep ]]; then
    heading "launch sweep: AdamW ms per step for each (BLOCK, num_warps) (whole: launch-sweep.txt)"
    echo "$sweep"
fi
if [[ -n $highlights ]]; then
    heading "bench_cuda.py: triton and torch's fused AdamW, same run (whole tables: bench_cuda.txt)"
    echo "$highlights"
fi
{
    heading "GPU check summary ($probe; logs in $LOG)"
    printf '%-20s | %-58s | %7s\n' step result seconds
    printf '%-20s-+-%-58s-+-%7s\n' "" "" "" | tr ' ' '-'
    for i in "${!STEPS[@]}"; do
        printf '%-20s | %-58s | %7s\n' "${STEPS[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}"
    done
    printf 'total %ss: %s\n' $((SECONDS - START)) "$( ((FAILED)) && echo FAILED || echo passed)"
} | tee "$LOG/summary.txt"
exit "$FAILED"

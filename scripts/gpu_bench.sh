#!/usr/bin/env bash
# The GPU benchmark run of issue 39, items 5-7: one prepared script for one H100 / H200.
#
#   scripts/gpu_bench.sh [--tiny] [OUT]        (run from anywhere; OUT defaults to $OUT, else
#                                               ./gpu_bench_out)
#
# Writes five files under OUT (the device tool brings back at most 8, 2 folder levels):
#   env.txt          date, GPU, driver, torch / CUDA / triton / PML / torchvision versions, commit
#   bench.md         the op-count proxy on CUDA, then FastAP / mAP_Q, RankedList and the memory
#                    bank, each by backend (cpu, gpu, triton) beside PML and the matmul floor,
#                    with kernels, host syncs and device-to-host copies per call
#   bench.json       every result of bench.md, machine-readable (one key per script)
#   train_step.md    ResNet-50 training step (batch 256, 224 px, bf16 autocast, Adam) and the
#   train_step.json  loss's share of it, per loss
# The part `graph` (GPU_BENCH_PARTS=graph; not in the default list) writes the CUDA-graph tables
# into bench.md / bench.json instead: FastAP / mAP_Q (gpu, triton) and RankedList (gpu), each
# backend beside its twin captured with torch.cuda.make_graphed_callables (gpu+graph,
# triton+graph), PML and the floor, at N = 1024, 4096, 16384, in about 2 minutes
# (docs/performance.md, CUDA graphs).
# Each part runs with a time limit (`timeout`) and a --budget-s inside it (cases that would start
# later are skipped and named), one case over --time-guard 5 s is skipped, and a case that fails
# is printed with its traceback while the rest go on: the script always finishes and writes its
# files. About 4 to 5 minutes on one H100 (GPU parts about 4 minutes, plus process start-ups).
# --tiny: toy sizes on the CPU (the whole script in about a minute; tests/test_benchmarks.py).
# GPU_BENCH_COMMIT=<sha>: the commit env.txt names (the device copy's .git may be stale).
#
# A bare device image lacks PML and friends: wheels made here by ../shared/tools/device-wheels.sh
# into .device-wheels (carried with the call) are installed first when that folder exists.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tiny=0
if [ "${1:-}" = "--tiny" ]; then tiny=1; shift; fi
out="${1:-${OUT:-$PWD/gpu_bench_out}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
parts="$(mktemp -d)"  # the JSON of each part, merged into OUT/bench.json at the end
trap 'rm -rf "$parts"' EXIT
cd "$root"

if [ -d .device-wheels ] && compgen -G ".device-wheels/*.whl" > /dev/null; then
    echo "== installing .device-wheels"
    "$python" -m pip install -q --no-index --no-deps --no-compile .device-wheels/*.whl \
        || echo "!! wheel install failed (exit $?); going on with what is installed"
fi

if [ "$tiny" = 1 ]; then
    device=cpu backends=cpu,gpu bank_backends=gpu,cpu sizes=32,64 big="" pml_max=32 cpu_max=64
    n_ops=64 graph_sizes=32,64 graph_hist=gpu graph_rll=gpu
    memory=(--memory 64 --batch 8 --dim 8)
    timing=(--warmup 0 --repeats 1 --rounds 1)
    train=(--arch resnet18 --image-size 16 --batch 8 --steps 1 --warmup 0)
    limit() { echo 120; }
else
    device=cuda backends=cpu,gpu,triton bank_backends=gpu,triton,cpu
    sizes=256,1024,4096,16384 big=65536 pml_max=16384
    cpu_max=16384 n_ops=4096 graph_sizes=1024,4096,16384 graph_hist=gpu,triton graph_rll=gpu,triton
    memory=(--memory 65536 --batch 256 --dim 128)
    timing=(--warmup 2 --repeats 20 --rounds 1)
    train=(--arch resnet50 --image-size 224 --batch 256 --steps 10 --warmup 3)
    limit() { echo "$1"; }
fi

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    # The device copy's .git is not the working tree's (on the lent machine rev-parse printed a
    # stale commit): GPU_BENCH_COMMIT, set by the caller to the tree's commit, wins; otherwise
    # the .git that travelled is named as such.
    if [ -n "${GPU_BENCH_COMMIT:-}" ]; then
        echo "commit: $GPU_BENCH_COMMIT (GPU_BENCH_COMMIT)"
    else
        echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)" \
            "(the .git that travelled; may be stale)"
    fi
    echo "mode: $([ "$tiny" = 1 ] && echo 'tiny (CPU, toy sizes)' || echo full)"
    "$python" - <<'EOF'
import importlib
import platform

import torch

print("python:", platform.python_version())
print("torch:", torch.__version__, "| CUDA (torch built with):", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device:", torch.cuda.get_device_name(0), f"| {p.total_memory / 2**30:.1f} GiB",
          f"| {p.multi_processor_count} SMs | capability {p.major}.{p.minor}")
else:
    print("device: no CUDA device")
for name in ("triton", "pytorch_metric_learning", "torchvision", "numpy"):
    try:
        print(f"{name}:", importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: not importable ({type(e).__name__}: {e})")
EOF
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        nvidia-smi | grep -m1 "CUDA Version" || true  # the driver's CUDA version
    fi
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# run LIMIT_S NAME COMMAND...: one part, its output appended to OUT/bench.md (and shown)
run() {
    local limit_s="$1" name="$2"
    shift 2
    echo "== $name (limit ${limit_s} s)" | tee -a "$out/bench.md"
    local start=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit_s" "$python" "$@" 2>&1 \
        | grep -v '^USDT:' | tee -a "$out/bench.md"
    local code=${PIPESTATUS[0]}
    echo "-- $name: exit $code after $((SECONDS - start)) s" | tee -a "$out/bench.md"
    echo | tee -a "$out/bench.md"
}

common=(--device "$device" --in-process --time-guard 5 "${timing[@]}" --backends "$backends")
pairwise=(--sizes "$sizes" $big --pml-max "$pml_max" --cpu-backend-max "$cpu_max")

: > "$out/bench.md"
# GPU_BENCH_PARTS (default: ops hist rll bank train) picks parts for a short lease; graph (the
# CUDA-graph rows) runs only when named. GPU_BENCH_LIMITS="ops hist rll bank train graph"
# overrides the time limits (seconds; graph's is split 5/8 FastAP, 3/8 RankedList).
want() { case " ${GPU_BENCH_PARTS:-ops hist rll bank train} " in *" $1 "*) return 0 ;; esac; return 1; }
read -r l_ops l_hist l_rll l_bank l_train l_graph <<< "${GPU_BENCH_LIMITS:-60 110 75 60 110 120}"
l_graph="${l_graph:-120}"
want ops && run "$(limit "$l_ops")" "op counts (CPU proxy, here on $device)" benchmarks/op_counts.py \
    --device "$device" --n "$n_ops" --backends "$backends" --json "$parts/op_counts.json"
want hist && run "$(limit "$l_hist")" "FastAP / mAP_Q" benchmarks/bench_histogram_ap.py \
    "${pairwise[@]}" "${common[@]}" --budget-s $((l_hist * 3 / 4)) --json "$parts/bench_histogram_ap.json"
want rll && run "$(limit "$l_rll")" "RankedList" benchmarks/bench_ranked_list.py \
    "${pairwise[@]}" "${common[@]}" --budget-s $((l_rll * 3 / 5)) --json "$parts/bench_ranked_list.json"
# the memory bank's cases run backend by backend: gpu and triton first, so that the budget, if
# it runs out, cuts the cpu backend's rows
want bank && run "$(limit "$l_bank")" "memory bank" benchmarks/bench_memory_bank.py \
    "${memory[@]}" "${common[@]}" --backends "$bank_backends" --budget-s $((l_bank * 3 / 5)) --json "$parts/bench_memory_bank.json"
# graph: each backend but cpu beside its CUDA-graph twin (on the CPU, --tiny: "skipped: needs
# CUDA"), with the ungraphed row, PML and the floor of the same run
graph=(--sizes "$graph_sizes" --pml-max "$pml_max" --cpu-backend-max "$cpu_max" "${common[@]}" --cuda-graph)
want graph && run "$(limit $((l_graph * 5 / 8)))" "CUDA graphs: FastAP / mAP_Q" benchmarks/bench_histogram_ap.py \
    "${graph[@]}" --backends "$graph_hist" --budget-s $((l_graph * 5 / 8 * 3 / 4)) --json "$parts/graph_histogram_ap.json"
want graph && run "$(limit $((l_graph * 3 / 8)))" "CUDA graphs: RankedList" benchmarks/bench_ranked_list.py \
    "${graph[@]}" --backends "$graph_rll" --budget-s $((l_graph * 3 / 8 * 3 / 4)) --json "$parts/graph_ranked_list.json"

if want train; then
    echo "== training step (limit $(limit "$l_train") s)"
    timeout --signal=INT --kill-after=15 "$(limit "$l_train")" "$python" \
        benchmarks/bench_train_step.py --device "$device" "${train[@]}" --backends "$backends" \
        --budget-s $((l_train * 2 / 3)) --json "$out/train_step.json" 2>&1 | grep -v '^USDT:' \
        | tee "$out/train_step.md"
    echo "-- training step: exit ${PIPESTATUS[0]}" | tee -a "$out/train_step.md"
fi

"$python" - "$parts" "$out/bench.json" <<'EOF'
import json
import sys
from pathlib import Path

parts, merged = Path(sys.argv[1]), {}
for path in sorted(parts.glob("*.json")):
    try:
        merged[path.stem] = json.loads(path.read_text())
    except ValueError as e:
        merged[path.stem] = {"error": f"unreadable: {e}"}
Path(sys.argv[2]).write_text(json.dumps(merged, indent=1) + "\n")
print("bench.json:", ", ".join(merged) or "no part wrote results")
EOF
echo "== done: $(ls "$out" | tr '\n' ' ')"

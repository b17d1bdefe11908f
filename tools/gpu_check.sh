#!/usr/bin/env bash
# GPU check of the cuda_nccl runtime, for a machine with NVIDIA GPUs, CUDA and
# NCCL. Under 10 minutes:
#   1. builds (release, CPSCHED_CUDA=ON) the tool, the plugins it needs and
#      the GPU tests, and runs the tests labelled gpu;
#   2. for 1, 2 and all local GPUs (one process per GPU, env launch):
#      causal_document at 8192 tokens per rank (configs/quickstart.yaml's
#      histogram pack), binary_greedy placement,
#      a) the self-check against the sim runtime (heads 16:2, D 128, so the
#         CPU reference stays small), then
#      b) the standard heads 64:8, D 128, timed: forward and backward time per
#         rank and achieved TFLOP/s (rank 0 prints the table).
# Exits 77 (skipped) when no GPU is visible, 1 when a step fails.
#   tools/gpu_check.sh                 build folder build/gpu-check
#   BUILD_DIR=... tools/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi): skipped"
  exit 77
fi
ngpu=$(nvidia-smi -L | grep -c '^GPU ' || true)
if [[ "$ngpu" -lt 1 ]]; then
  echo "gpu_check: no NVIDIA GPU listed by nvidia-smi: skipped"
  exit 77
fi
echo "gpu_check: $ngpu GPU(s):"
nvidia-smi -L | sed 's/^/  /'

build="${BUILD_DIR:-build/gpu-check}"
jobs="$(nproc)"
start=$(date +%s)
echo "== build ($build, release, CPSCHED_CUDA=ON)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPSCHED_CUDA=ON -DCPSCHED_BUILD_TESTS=ON \
  -DCPSCHED_BUILD_BENCHMARKS=OFF >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep "cpsched: CUDA/NCCL" "$build.configure.log" || true
cmake --build "$build" -j "$jobs" --target cpsched cpsched_cuda_nccl cpsched_sim cpsched_binary_greedy \
  cuda_nccl_gpu_kernels cuda_nccl_gpu_nccl
echo "   built in $(( $(date +%s) - start )) s"

echo "== GPU tests"
(cd "$build" && ctest -L gpu --output-on-failure --timeout 300)

tool="$build/bin/cpsched"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# run_ranks N NAME ARGS...: N processes, one per GPU, env launch; rank 0's
# executor report is printed; fails when any rank fails.
run_ranks() {
  local n="$1" name="$2"
  shift 2
  local pids=() r
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r CPSCHED_NCCL_ID_FILE="$tmp/id.$name" CPSCHED_RUN_ID="$name.$$" \
      timeout 240 "$tool" run configs/quickstart.yaml \
      --set problem.cp_size="$n" --set problem.seqlen_per_rank=8192 \
      --set solver.name=binary_greedy --set executor.name=cuda_nccl "$@" \
      >"$tmp/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for ((r = 0; r < n; r++)); do
    if ! wait "${pids[$r]}"; then
      failed=1
      echo "   rank $r failed:"
      tail -n 20 "$tmp/$name.rank$r.log" | sed 's/^/     /'
    fi
  done
  sed -n '/^executor/,$p' "$tmp/$name.rank0.log" | sed 's/^/   /'
  return $failed
}

counts=(1)
[[ "$ngpu" -ge 2 ]] && counts+=(2)
[[ "$ngpu" -gt 2 ]] && counts+=("$ngpu")
status=0
for n in "${counts[@]}"; do
  echo "== $n GPU(s): self-check against the sim runtime (heads 16:2, D 128)"
  run_ranks "$n" "check$n" --set "problem.heads={q: 16, kv: 2, dim: 128, dtype: bf16}" \
    --set "executor.params={cuda_nccl: {check: true, warmup: 0, iterations: 1}}" || status=1
  echo "== $n GPU(s): timing, heads 64:8, D 128"
  run_ranks "$n" "time$n" --set "problem.heads={q: 64, kv: 8, dim: 128, dtype: bf16}" \
    --set "executor.params={cuda_nccl: {warmup: 1, iterations: 3}}" || status=1
done
echo "gpu_check: $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $(( $(date +%s) - start )) s"
exit $status

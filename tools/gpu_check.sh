#!/usr/bin/env bash
# GPU check of the cuda_nccl runtime and of cpsched.torch on CUDA tensors, for
# a machine with NVIDIA GPUs, CUDA and NCCL. Under 10 minutes:
#   1. builds (release, CPSCHED_CUDA=ON) the tool, the plugins it needs and
#      the GPU tests (skipped with --no-build: BUILD_DIR was built elsewhere);
#   2. the GPU tests (kernels against their CPU twins and the sim, loopback
#      pipelines of 1-4 ranks on device 0, device mask ingestion, NCCL) and
#      the device top-k counting benchmark;
#   3. for 1, 2 and all local GPUs (one process per GPU, env launch):
#      causal_document at 8192 tokens per rank (configs/quickstart.yaml's
#      histogram pack), binary_greedy placement,
#      a) the self-check against the sim runtime (heads 16:2, D 128, so the
#         CPU reference stays small), then
#      b) the standard heads 64:8, D 128, timed: forward and backward time per
#         rank and achieved TFLOP/s (rank 0 prints the table), for
#         causal_document and the plain causal mask;
#   4. loopback (launch: loopback, P ranks as threads on device 0): the
#      default solver's plans for P = 2, 4, 8 at 8192 tokens per rank
#      (causal_document), the plain masks, DSA and NSA, each self-checked;
#   5. where python3 imports torch (with CUDA) and cpsched: the CUDA tests of
#      cpsched.torch and its kernel benchmark (python/bench/bench_torch_cuda.py).
# Exits 77 (skipped) when no GPU is visible, 1 when a step fails.
#   tools/gpu_check.sh                       build folder build/gpu-check
#   BUILD_DIR=... tools/gpu_check.sh [--no-build]
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
if [[ "${1:-}" == "--no-build" ]]; then
  echo "== prebuilt: $build"
  [[ -x "$build/bin/cpsched" ]] || { echo "gpu_check: --no-build, but $build/bin/cpsched is missing"; exit 1; }
else
  echo "== build ($build, release, CPSCHED_CUDA=ON)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPSCHED_CUDA=ON -DCPSCHED_BUILD_TESTS=ON \
    -DCPSCHED_BUILD_BENCHMARKS=OFF >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
  grep "cpsched: CUDA/NCCL" "$build.configure.log" || true
  cmake --build "$build" -j "$jobs" --target cpsched cpsched_cuda_nccl cpsched_sim cpsched_binary_greedy \
    cuda_nccl_gpu_kernels cuda_nccl_gpu_nccl bench_gpu_topk_count
  echo "   built in $(( $(date +%s) - start )) s"
fi

status=0
# step NAME COMMAND...: runs it, 77 counts as skipped, any other failure fails the check (and the rest runs).
step() {
  local name="$1" rc=0
  shift
  echo "== $name"
  local t0=$(date +%s)
  "$@" || rc=$?
  case $rc in
    0) echo "   $name: passed ($(( $(date +%s) - t0 )) s)" ;;
    77) echo "   $name: skipped" ;;
    *) echo "   $name: FAILED (exit $rc)"; status=1 ;;
  esac
}
for t in cuda_nccl_gpu_kernels cuda_nccl_gpu_nccl; do
  if [[ ! -x "$build/bin/$t" ]]; then echo "== $t: not built"; status=1; continue; fi
  step "GPU test $t" timeout 300 "$build/bin/$t"
done
[[ -x "$build/bin/bench_gpu_topk_count" ]] &&
  step "device top-k counting benchmark" timeout 120 "$build/bin/bench_gpu_topk_count"

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
for n in "${counts[@]}"; do
  step "$n GPU(s): self-check against the sim runtime (causal_document, heads 16:2, D 128)" \
    run_ranks "$n" "check$n" --set "problem.heads={q: 16, kv: 2, dim: 128, dtype: bf16}" \
    --set "executor.params={cuda_nccl: {check: true, warmup: 0, iterations: 1}}"
  for kind in causal_document causal; do
    step "$n GPU(s): timing, $kind, heads 64:8, D 128" \
      run_ranks "$n" "time$n$kind" --set problem.mask.kind=$kind --set "problem.heads={q: 64, kv: 8, dim: 128, dtype: bf16}" \
      --set "executor.params={cuda_nccl: {warmup: 1, iterations: 3}}"
  done
done

# loopback: one process, P ranks as threads on device 0 (transfers through host memory), the
# default solver's plans at real sizes, checked against the sim runtime.
loopback() {
  local log="$tmp/loopback.log"
  timeout 300 "$tool" run "$@" --set executor.name=cuda_nccl \
    --set "executor.params={cuda_nccl: {launch: loopback, check: true, warmup: 0, iterations: 1}}" >"$log" 2>&1
  local rc=$?
  sed -n '/^executor/,$p' "$log" | grep -E "self-check|max|passed|FAILED|error" | sed 's/^/   /'
  [[ $rc -eq 0 ]] || tail -n 20 "$log" | sed 's/^/     /'
  return $rc
}
heads16="problem.heads={q: 16, kv: 2, dim: 128, dtype: bf16}"
for P in 2 4 8; do
  step "loopback P=$P: causal_document, 8192 tokens per rank, default solver, self-check" \
    loopback configs/quickstart.yaml --set problem.cp_size=$P --set problem.seqlen_per_rank=8192 --set "$heads16"
done
for kind in causal full sliding_window; do
  step "loopback P=4: $kind, 2048 tokens per rank, self-check" \
    loopback configs/quickstart.yaml --set problem.cp_size=4 --set problem.seqlen_per_rank=2048 \
    --set problem.mask.kind=$kind --set "$heads16"
done
step "loopback P=8: dsa (configs/dsa.yaml, heads 16:1, D 128), self-check" \
  loopback configs/dsa.yaml --set "problem.heads={q: 16, kv: 1, dim: 128, dtype: bf16}"
step "loopback P=4: nsa (configs/nsa.yaml, heads 16:4, D 128), self-check" \
  loopback configs/nsa.yaml --set problem.cp_size=4 --set "problem.heads={q: 16, kv: 4, dim: 128, dtype: bf16}"

if python3 -c "import torch, cpsched; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  step "cpsched.torch on CUDA tensors (pytest)" timeout 240 python3 -m pytest -q -p no:cacheprovider \
    python/tests/test_torch_cuda.py
  step "cpsched.torch kernel benchmark" timeout 240 python3 python/bench/bench_torch_cuda.py
else
  echo "== cpsched.torch on CUDA: skipped (python3 does not import torch with CUDA and cpsched)"
fi
echo "gpu_check: $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $(( $(date +%s) - start )) s"
exit $status

#!/usr/bin/env bash
# GPU check of the cuda_nccl runtime (and of cpsched.torch on CUDA tensors),
# for a machine with NVIDIA GPUs (H100 / H200: sm_90), CUDA, NCCL and cuDNN.
# About 8 minutes on one GPU. Everything it prints also goes to a log file.
#   1. builds (release, CPSCHED_CUDA=ON, CPSCHED_CUDNN=ON, sm_90 only) the tool,
#      its plugins, the GPU tests and benchmarks (skipped with --no-build:
#      BUILD_DIR was built elsewhere, e.g. by tools/gpu_bundle.sh);
#   2. the GPU tests (ctest -L gpu: kernels and index kernels against their
#      CPU twins and the sim, cuDNN's SDPA against its twin per mask form,
#      whole plans on cuDNN and on the runtime's kernels, NCCL);
#   3. self-checks against the sim runtime: P = 1 (one process, env launch;
#      attention auto, then the runtime's kernels only), loopback P = 2 / 4 / 8
#      (causal_document, 8192 tokens per rank), the plain masks (causal, full,
#      sliding_window), DSA (MLA's shared latent, 576 / 512, 16 query heads;
#      P = 1 and loopback P = 8) and NSA; with 2+ GPUs, one process per GPU (NCCL);
#   4. the kernel table (bench_gpu_attention): causal, causal_document,
#      full_document and sliding_window at 8k / 16k / 32k tokens per rank,
#      heads 64:8, D 128, bf16, forward and backward TFLOP/s of (a) cuDNN's
#      SDPA called directly on the same batches, (b) the runtime at P = 1,
#      (c) each rank's compute alone at loopback P = 8, each beside the kernel
#      model's prediction (the h100 / h200 profile by the GPU's name); DSA's
#      MLA index kernels on configs/dsa.yaml's shapes (128:1, 576 / 512, 16k
#      and 32k tokens);
#   5. the device top-k counting benchmark; where python3 imports torch with
#      CUDA and cpsched, python/bench/gpu_check_torch.sh: cpsched.torch's CUDA
#      tests, loopback P = 2-8 and kernel benchmark (its log and table in
#      <log>.torch/; TORCH_STEP_TIMEOUT, default 240 s per step).
# Exits 77 (skipped) when no GPU is visible, 1 when a step fails.
#   tools/gpu_check.sh                       build folder build/gpu-check
#   BUILD_DIR=... tools/gpu_check.sh --no-build
#   GPU_CHECK_LOG=file (default build/gpu_check.<date>.log), TABLE_SIZES="8192 16384 32768",
#   TABLE_P8_SIZES (default TABLE_SIZES), TABLE_MASKS="causal causal_document full_document sliding_window"
set -euo pipefail
cd "$(dirname "$0")/.."

no_build=0
for a in "$@"; do
  case "$a" in
    --no-build) no_build=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$a' (--no-build, --help)"; exit 2 ;;
  esac
done

mkdir -p build
log="${GPU_CHECK_LOG:-build/gpu_check.$(date +%Y%m%d-%H%M%S).log}"
# Everything printed from here on also goes to the log.
exec > >(tee -a "$log") 2>&1
echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), log $log, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

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
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | sed 's/^/  /' || true

build="${BUILD_DIR:-build/gpu-check}"
jobs="$(nproc)"
start=$(date +%s)
if [[ $no_build -eq 1 ]]; then
  echo "== prebuilt: $build"
  [[ -x "$build/bin/cpsched" ]] || { echo "gpu_check: --no-build, but $build/bin/cpsched is missing"; exit 1; }
else
  echo "== build ($build, release, CPSCHED_CUDA=ON, CPSCHED_CUDNN=ON, sm_90)"
  tools/install_deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPSCHED_CUDA=ON -DCPSCHED_CUDNN=ON \
    -DCPSCHED_CUDA_ARCHITECTURES=90 -DCPSCHED_BUILD_TESTS=ON -DCPSCHED_BUILD_BENCHMARKS=OFF \
    >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
  grep "cpsched: CUDA/NCCL\|cpsched: cuDNN" "$build.configure.log" || true
  cmake --build "$build" -j "$jobs" --target cpsched cpsched_cuda_nccl cpsched_sim cpsched_binary_greedy \
    cpsched_balanced_bytes cuda_nccl_gpu_kernels cuda_nccl_gpu_nccl cuda_nccl_gpu_cudnn bench_gpu_topk_count \
    bench_gpu_attention
  echo "   built in $(( $(date +%s) - start )) s"
fi

status=0
# step NAME COMMAND...: runs it, 77 counts as skipped, any other failure fails the check (and the rest runs).
step() {
  local name="$1" rc=0
  shift
  echo "== $name"
  local t0
  t0=$(date +%s)
  "$@" || rc=$?
  case $rc in
    0) echo "   $name: passed ($(( $(date +%s) - t0 )) s)" ;;
    77) echo "   $name: skipped" ;;
    *) echo "   $name: FAILED (exit $rc, $(( $(date +%s) - t0 )) s)"; status=1 ;;
  esac
}

# 2. GPU tests: ctest where the build folder has its test files, else the binaries themselves.
gpu_tests() {
  if [[ -f "$build/CTestTestfile.cmake" ]] && command -v ctest >/dev/null; then
    ctest --test-dir "$build" -L gpu --output-on-failure --timeout 300
    return
  fi
  local t rc=0
  for t in cuda_nccl_gpu_kernels cuda_nccl_gpu_cudnn cuda_nccl_gpu_nccl; do
    if [[ ! -x "$build/bin/$t" ]]; then echo "   $t: not built"; rc=1; continue; fi
    echo "-- $t"
    local r=0
    timeout 300 "$build/bin/$t" || r=$?
    [[ $r -eq 0 || $r -eq 77 ]] || rc=1
  done
  return $rc
}
step "GPU tests (ctest -L gpu)" gpu_tests

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
  sed -n '/^executor/,$p' "$tmp/$name.rank0.log" | grep -v "^ *$" | head -n 40 | sed 's/^/   /'
  return $failed
}

heads16="problem.heads={q: 16, kv: 2, dim: 128, dtype: bf16}"
# 3. Self-checks against the sim runtime.
step "P=1 (env launch): self-check, causal_document, heads 16:2, D 128, attention auto" \
  run_ranks 1 check1 --set "$heads16" --set "executor.params={cuda_nccl: {check: true, warmup: 0, iterations: 1}}"
step "P=1 (env launch): self-check, the runtime's own kernels only (attention: kernels)" \
  run_ranks 1 check1k --set "$heads16" \
  --set "executor.params={cuda_nccl: {check: true, attention: kernels, warmup: 0, iterations: 1}}"
if [[ "$ngpu" -ge 2 ]]; then
  step "$ngpu GPUs (one process each, NCCL): self-check, causal_document" \
    run_ranks "$ngpu" "check$ngpu" --set "$heads16" \
    --set "executor.params={cuda_nccl: {check: true, warmup: 0, iterations: 1}}"
fi

# loopback: one process, P ranks as threads on device 0 (transfers through host memory), checked against the sim.
loopback() {
  local log="$tmp/loopback.log"
  local rc=0
  timeout 300 "$tool" run "$@" --set executor.name=cuda_nccl \
    --set "executor.params={cuda_nccl: {launch: loopback, check: true, warmup: 0, iterations: 1}}" >"$log" 2>&1 || rc=$?
  sed -n '/^executor/,$p' "$log" | grep -E "self-check|attention \(all|SDPA graphs|FAILED|error" | sed 's/^/   /'
  [[ $rc -eq 0 ]] || tail -n 20 "$log" | sed 's/^/     /'
  return $rc
}
for P in 2 4 8; do
  step "loopback P=$P: causal_document, 8192 tokens per rank, default solver, self-check" \
    loopback configs/quickstart.yaml --set problem.cp_size=$P --set problem.seqlen_per_rank=8192 --set "$heads16"
done
for kind in causal full sliding_window; do
  step "loopback P=4: $kind, 2048 tokens per rank, self-check" \
    loopback configs/quickstart.yaml --set problem.cp_size=4 --set problem.seqlen_per_rank=2048 \
    --set problem.mask.kind=$kind --set "$heads16"
done
# DSA as configs/dsa.yaml has it: MLA's shared latent (576 / 512) on the MLA
# index kernels; 16 query heads and fewer tokens, so that the sim's CPU
# reference stays within minutes (its FLOPs about those of the D 128 check before).
step "loopback P=1: dsa (configs/dsa.yaml, MLA 576 / 512 shared latent, heads 16:1, 2048 tokens), self-check" \
  loopback configs/dsa.yaml --set problem.cp_size=1 --set problem.seqlen_per_rank=2048 --set problem.heads.q=16
step "loopback P=8: dsa (configs/dsa.yaml, MLA 576 / 512 shared latent, heads 16:1, 1024 tokens per rank), self-check" \
  loopback configs/dsa.yaml --set problem.seqlen_per_rank=1024 --set problem.heads.q=16
step "loopback P=4: nsa (configs/nsa.yaml, heads 16:4, D 128), self-check" \
  loopback configs/nsa.yaml --set problem.cp_size=4 --set "problem.heads={q: 16, kv: 4, dim: 128, dtype: bf16}"

# 4. The kernel table.
sizes="${TABLE_SIZES:-8192 16384 32768}"
p8="${TABLE_P8_SIZES:-$sizes}"
masks="${TABLE_MASKS:-causal causal_document full_document sliding_window}"
csv="${log%.log}.kernel_table.csv"
# The kernel model the table's times are set beside: the profile of this GPU.
hw=h100_8x_nvlink
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | grep -q H200 && hw=h200_8x_nvlink
if [[ -x "$build/bin/bench_gpu_attention" ]]; then
  step "kernel table: (a) cuDNN direct, (b) runtime P=1, (c) each rank alone at loopback P=8; DSA's MLA index kernels" \
    timeout 480 "$build/bin/bench_gpu_attention" --masks "${masks// /,}" --sizes "${sizes// /,}" \
    --p8-sizes "${p8// /,}" --heads 64:8 --dim 128 --iterations 3 --hardware "$hw" --csv "$csv"
else
  echo "== kernel table: bench_gpu_attention not built"; status=1
fi
[[ -x "$build/bin/bench_gpu_topk_count" ]] &&
  step "device top-k counting benchmark" timeout 120 "$build/bin/bench_gpu_topk_count"

# 5. cpsched.torch on CUDA tensors: its CUDA tests, loopback P = 2-8 and kernel benchmark
#    (python/bench/gpu_check_torch.sh; exits 77 where python3 has no CUDA torch and cpsched).
step "cpsched.torch: CUDA tests, loopback P = 2-8, kernel benchmark" \
  env PYTHON=python3 STEP_TIMEOUT="${TORCH_STEP_TIMEOUT:-240}" python/bench/gpu_check_torch.sh "${log%.log}.torch"
echo "gpu_check: $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $(( $(date +%s) - start )) s; log $log"
exit $status

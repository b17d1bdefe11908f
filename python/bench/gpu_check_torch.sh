#!/usr/bin/env bash
# GPU check of cpsched.torch (docs/torch.md, "On a GPU"), for a machine with an NVIDIA GPU (H100 / H200) and a python that
# imports torch with CUDA and cpsched. Everything it prints also goes to OUT_DIR/gpu_check_torch.log; the
# benchmark's table also to OUT_DIR/bench_torch_cuda.txt.
#   1. the CUDA tests (python/tests/test_torch_cuda.py, loopback excluded): every backend (torch, aten:
#      PyTorch's FA2 ops, flash where flash-attn imports, flex eager and compiled, triton: the index kernels)
#      against the dense reference; the Triton index kernels against the torch gather kernel on DSA's shapes;
#      CUDA graphs' replay against eager;
#   2. the loopback runs: P = 2, 4 and 8 ranks of a plan as threads on this one GPU (every kernel real, the
#      collectives device copies) against a dense reference computed on the GPU;
#   3. python -m cpsched.torch.calibrate: the FA2 kernels over a grid of shapes, fitted into a measured profile,
#      OUT_DIR/<h100|h200>_measured.yaml (CALIBRATE_ARGS: extra arguments);
#   4. python/bench/bench_torch_cuda.py (each time beside the measured profile's prediction): FA2 varlen
#      direct, FlexAttention compiled direct, cpsched.torch per backend at P = 1, each rank at loopback P = 8,
#      DSA's Triton kernel, host time per call eager and with graphs (BENCH_ARGS: extra arguments, e.g.
#      "--tokens 16384 --masks causal_document");
#   5. python/bench/check_kernel_model.py: bench_step_time's plans at P = 8 and 64 in loopback, each rank's
#      kernels against the measured profile's prediction (within 15 %; CHECK_ARGS: extra arguments).
# Exits 77 (skipped) when python cannot use a CUDA device, 1 when a step fails (the others still run).
#   python/bench/gpu_check_torch.sh [OUT_DIR]      default OUT_DIR build/gpu_check_torch
#   PYTHON=python3 (the interpreter), STEP_TIMEOUT=600 (seconds per step), STEPS="tests loopback calibrate bench
#   check" (the steps to run; e.g. STEPS="calibrate check" for the kernel model alone, a few minutes)
set -uo pipefail
cd "$(dirname "$0")/../.."

out="${1:-build/gpu_check_torch}"
py="${PYTHON:-python3}"
limit="${STEP_TIMEOUT:-600}"
steps="${STEPS:-tests loopback calibrate bench check}"
for s in $steps; do
  case "$s" in tests|loopback|calibrate|bench|check) ;; *)
    echo "gpu_check_torch: STEPS: unknown step '$s' (tests loopback calibrate bench check)"; exit 2 ;;
  esac
done
mkdir -p "$out"
log="$out/gpu_check_torch.log"
exec > >(tee -a "$log") 2>&1
echo "gpu_check_torch: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), log $log, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

if ! "$py" -c "import torch, cpsched.torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  echo "gpu_check_torch: $py does not import torch with a CUDA device and cpsched: skipped"
  exit 77
fi
"$py" - <<'EOF'
import torch
print(f"  torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()} "
      f"(sm{''.join(map(str, torch.cuda.get_device_capability()))}), FA2 ops: "
      f"{torch.backends.cuda.is_flash_attention_available()}")
try:
    import triton
    print(f"  triton {triton.__version__}")
except ImportError:
    print("  triton: not installed (the Triton index tests skip)")
try:
    import flash_attn
    print(f"  flash-attn {flash_attn.__version__}")
except ImportError:
    print("  flash-attn: not installed (the flash backend's tests skip; auto uses aten)")
EOF

status=0
# step KEY NAME COMMAND...: runs it under the step timeout where STEPS holds KEY; 77 counts as skipped, any other
# failure fails the check.
step() {
  local key="$1" name="$2"; shift 2
  [[ " $steps " == *" $key "* ]] || return 0
  local t0; t0=$(date +%s)
  echo "== $name"
  timeout "$limit" "$@"
  local rc=$?
  case $rc in
    0) echo "   $name: ok ($(( $(date +%s) - t0 )) s)" ;;
    77) echo "   $name: skipped" ;;
    124) echo "   $name: FAILED (timed out after $limit s)"; status=1 ;;
    *) echo "   $name: FAILED (exit $rc, $(( $(date +%s) - t0 )) s)"; status=1 ;;
  esac
}

step tests "cpsched.torch CUDA tests (backends, Triton index kernels, graphs)" \
  "$py" -m pytest -q -p no:cacheprovider -rs python/tests/test_torch_cuda.py -k "not loopback"
step loopback "cpsched.torch loopback P = 2, 4, 8 on one GPU against the dense reference" \
  "$py" -m pytest -v -p no:cacheprovider python/tests/test_torch_cuda.py -k loopback
# The kernel model measured (issue 48): the profile goes to OUT_DIR; commit it as configs/hardware/<gpu>_measured.yaml.
gpu=$("$py" -c "import torch; print('h200' if 'H200' in torch.cuda.get_device_name() else 'h100')")
measured="$out/${gpu}_measured.yaml"
# shellcheck disable=SC2086  # CALIBRATE_ARGS is a list of arguments
step calibrate "kernel model measured (python -m cpsched.torch.calibrate -> $measured)" \
  "$py" -m cpsched.torch.calibrate --out "$measured" ${CALIBRATE_ARGS:-}
hw=(); [[ -s "$measured" ]] && hw=(--hardware "$measured")
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
step bench "cpsched.torch kernel benchmark (bench_torch_cuda.py)" \
  "$py" python/bench/bench_torch_cuda.py --out "$out/bench_torch_cuda.txt" "${hw[@]}" ${BENCH_ARGS:-}
# shellcheck disable=SC2086  # CHECK_ARGS is a list of arguments
step check "each rank's kernels against the kernel model, bench_step_time's plans at P = 8 and 64 (check_kernel_model.py)" \
  "$py" python/bench/check_kernel_model.py --out "$out/check_kernel_model.txt" "${hw[@]}" ${CHECK_ARGS:-}

echo "gpu_check_torch: $([[ $status == 0 ]] && echo passed || echo FAILED), log $log"
exit $status

#!/usr/bin/env bash
# Builds the CUDA/NCCL runtime on this machine and packs what tools/gpu_check.sh
# needs into one folder, for a GPU machine that has the driver, CUDA's
# runtime, NCCL and Python with torch, but not this project's build
# dependencies (yaml-cpp, fmt, Boost, GLPK):
#   bin/ lib/          the tool, the GPU tests, libcpsched and the plugins
#   site/cpsched/      the Python package (module built for $GPU_PYTHON)
#   syslib/            the shared libraries of this machine the binaries need
#                      (CUDA's runtime among them), except the C/C++ runtime,
#                      the CUDA driver, NCCL, cuDNN and NVRTC, which must be
#                      the GPU machine's (cuDNN loads its engines at run time;
#                      PyTorch's images carry cuDNN 9 and NVRTC as pip wheels)
#   run.sh             on the GPU machine, from the repository root:
#                        BUNDLE/run.sh   (runs tools/gpu_check.sh --no-build)
#
#   tools/gpu_bundle.sh [BUNDLE]      default .gpu (ignored by git only where
#                                     you add it to .git/info/exclude)
# Environment: CUDA_ARCH (default 90), GPU_PYTHON (a Python of the GPU
# machine's version with nanobind, for the module; unset: no Python package).
# run.sh puts the bundle's libraries on LD_LIBRARY_PATH, ahead of the
# binaries' build RPATH, and finds the GPU machine's NCCL.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
bundle="$(realpath -m "${1:-.gpu}")"
build="$root/build/gpu"
arch="${CUDA_ARCH:-90}"

py_args=()
if [[ -n "${GPU_PYTHON:-}" ]]; then
  py_args=(-DCPSCHED_PYTHON=ON "-DPython_EXECUTABLE=$GPU_PYTHON")
fi
tools/install_deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCPSCHED_CUDA=ON -DCPSCHED_CUDNN=ON -DCPSCHED_CUDA_ARCHITECTURES="$arch" \
  -DCPSCHED_BUILD_TESTS=ON -DCPSCHED_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON "${py_args[@]}" >/dev/null
targets=(cpsched cpsched_cuda_nccl cpsched_sim cpsched_binary_greedy cpsched_balanced_bytes cpsched_static cpsched_usp
         cpsched_owner cuda_nccl_gpu_kernels cuda_nccl_gpu_nccl cuda_nccl_gpu_cudnn bench_gpu_topk_count
         bench_gpu_attention)
[[ -n "${GPU_PYTHON:-}" ]] && targets+=(cpsched_python)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/build/lib" "$bundle/syslib"
cp -a "$build/bin" "$bundle/build/"
cp -a "$build"/lib/*.so* "$bundle/build/lib/"
cp -a "$build/lib/cpsched" "$bundle/build/lib/"
if [[ -n "${GPU_PYTHON:-}" ]]; then
  cmake --install "$build" --component python --prefix "$bundle/site" >/dev/null
  cp -r python/cpsched/*.py python/cpsched/torch "$bundle/site/cpsched/"
fi
find "$bundle" -name '*.so*' -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
find "$bundle/build/bin" -type f -exec strip --strip-unneeded {} + 2>/dev/null || true

# The libraries this machine resolved for the binaries, less the C/C++
# runtime (the GPU machine's own is newer), CUDA's driver API and NCCL (the
# GPU machine's must match its driver), cuDNN and NVRTC (hundreds of MB, and
# cuDNN dlopens its engine libraries beside itself: the GPU machine's), and our own.
ldd "$bundle"/build/bin/* "$bundle"/build/lib/*.so "$bundle"/build/lib/cpsched/plugins/*.so 2>/dev/null |
  awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libnccl|libcudnn[a-z_]*|libnvrtc[a-z_.-]*)\.so' |
  grep -v "$build" | while read -r lib; do cp -L "$lib" "$bundle/syslib/"; done

cat >"$bundle/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs tools/gpu_check.sh on this bundle's prebuilt tree (made by tools/gpu_bundle.sh), from the repository root.
set -euo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
[[ -x tools/gpu_check.sh ]] || { echo "run.sh: run it from the repository root"; exit 1; }
# This machine's NCCL, cuDNN 9 and NVRTC: system folders, then the pip wheels of its Python (PyTorch's).
site="$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)"
found() { find /usr/local /usr/lib /opt $site -name "$1" 2>/dev/null | head -n 1 || true; }
extra=""
for lib in libnccl.so.2 libcudnn.so.9 libnvrtc.so.13; do
  p="$(found "$lib")"
  if [[ -n "$p" ]]; then extra="$extra:$(dirname "$p")"; else echo "run.sh: $lib not found on this machine"; fi
done
# Searched before the binaries' build RPATH: the bundle's own libraries, then this machine's.
export LD_LIBRARY_PATH="$bundle/build/lib:$bundle/syslib$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[[ -d "$bundle/site" ]] && export PYTHONPATH="$bundle/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if ldd "$bundle"/build/bin/* "$bundle"/build/lib/cpsched/plugins/*.so | grep "not found"; then
  echo "run.sh: libraries missing (above)"
  exit 1
fi
BUILD_DIR="$bundle/build" exec tools/gpu_check.sh --no-build
EOF
chmod +x "$bundle/run.sh"
echo "gpu_bundle: $bundle ($(du -sh "$bundle" | cut -f1)); on the GPU machine, from the repository root: ${bundle#"$root"/}/run.sh"

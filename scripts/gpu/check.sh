#!/usr/bin/env bash
# Runs the GPU checks from a bundle made by scripts/gpu/bundle.sh (packed as one or more .tar.xz
# files in BUNDLE_DIR, e.g. the programs apart from the models, so a rebuild re-packs less) on a
# machine with an NVIDIA GPU, its driver and the CUDA 13 libraries: the CUDA executor's test
# (every listed ONNX node test and the shared models against the CPU executor), the device-side
# AES-GCM test and bench when built, RunBatch through the device path against the CPU executor,
# the whole appliance on the shared models with the executor chosen automatically (so CUDA) in
# PCIe mode emulated (the device path and its GCM kernels end to end), and cc-tax on the CUDA and
# on the CPU executor; and the LLM engine on CUDA (gpu_llm_test against the references and the
# CPU engine, cloister-llm's conformance check, where --executor auto picks cuda, generation
# through the appliance with the worker on CUDA (llm_appliance_test), and cloister-bench llm-cuda on a synthetic 1 B model, written on the machine by
# bench/make_synthetic_llama.py). The programs keep the paths they were built with, so those are recreated
# as links first.
#
#   scripts/gpu/check.sh BUNDLE_DIR LOG_DIR [STEP ...]
# STEPs (default all): info executor transfer sanitizer batch appliance cctax coalescing llm
# llmbench
#
# From a session with a device (the carry is at most 64 MiB, so bundle only the steps' data):
#   here:       scripts/gpu/bundle.sh build build-gpu/b info llm llmbench   (about 36 MB packed)
#   on device:  scripts/gpu/check.sh build-gpu "$OUT/logs" info llm llmbench   (carry: build-gpu)
# Never run it on a development machine: it replaces BUILD_DIR/bin with the bundle's.
set -uo pipefail

bundle=${1:?usage: check.sh BUNDLE_DIR LOG_DIR [STEP ...]}
logs=${2:?usage: check.sh BUNDLE_DIR LOG_DIR [STEP ...]}
shift 2
steps=${*:-info executor transfer sanitizer batch appliance cctax coalescing llm llmbench}
mkdir -p "$logs"
root=$(mktemp -d)
for archive in "$bundle"/*.tar.xz; do tar -xJf "$archive" -C "$root"; done
# shellcheck disable=SC1091
. "$root/manifest"

# The build's paths, as links into the unpacked bundle and this checkout.
repo=$(pwd)
if [ "$repo" != "$source_dir" ]; then
  mkdir -p "$source_dir"
  for entry in "$repo"/*; do ln -sfn "$entry" "$source_dir/$(basename "$entry")"; done
fi
mkdir -p "$build_dir" "$(dirname "$shared_dir")" "$(dirname "$node_tests")"
rm -rf "$build_dir/bin"
ln -sfn "$root/bin" "$build_dir/bin"
[ -e "$shared_dir" ] || ln -sfn "$root/shared" "$shared_dir"
[ -e "$node_tests" ] || ln -sfn "$root/node" "$node_tests"

# cuBLAS and the CUDA runtime from the machine's toolkit or its Python wheels.
cuda_libs=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
cudart=$(find /usr/local /usr/lib /opt -name 'libcudart.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$root/lib:$(dirname "${cuda_libs:-/nonexistent/x}"):$(dirname "${cudart:-/nonexistent/x}"):${LD_LIBRARY_PATH:-}"
bin="$build_dir/bin"

summary=()
step() {  # step NAME TIMEOUT COMMAND...: runs, logs to LOG_DIR/NAME.log, records the outcome
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - start))")")
  tail -n 25 "$logs/$name.log"
}
wants() { [[ " $steps " == *" $1 "* ]]; }

if wants info; then
  nvidia-smi
  nvidia-smi -q | grep -iE 'product name|driver version|cuda version|conf|cc mode|ready state' || true
  echo "cuBLAS: ${cuda_libs:-not found}; cudart: ${cudart:-not found}"
  ldd "$bin/gpu_executor_test" | grep -E 'not found|cublas|cudart' || true
fi
if wants executor; then
  step gpu_executor_test 300 "$bin/gpu_executor_test"
fi
if wants transfer && [ -x "$bin/gpu_transfer_test" ]; then
  step gpu_transfer_test 120 "$bin/gpu_transfer_test"
fi
if wants sanitizer && [ -x "$bin/gpu_transfer_test" ] && command -v compute-sanitizer >/dev/null; then
  step gpu_transfer_memcheck 180 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$bin/gpu_transfer_test" --gtest_filter='*emulated*:*Tamper*'
fi
if wants batch && [ -x "$bin/batch_runner_gpu_test" ]; then
  step batch_runner_gpu_test 120 "$bin/batch_runner_gpu_test"
fi
if wants appliance; then
  step models_test 240 "$bin/models_test"
fi
if wants cctax; then
  step cc_tax_cuda 150 "$bin/cloister-bench" cc-tax --json --executor cuda --iterations 20
fi
if wants coalescing; then
  for mode in off emulated; do
    step "coalescing_gpu_$mode" 150 "$bin/cloister-bench" coalescing --json --device gpu \
      --mode "$mode" --iterations 20
  done
  step coalescing_cpu_emulated 150 "$bin/cloister-bench" coalescing --json --iterations 20
fi
if wants llm && [ -x "$bin/gpu_llm_test" ]; then
  step gpu_llm_test 240 "$bin/gpu_llm_test"
  if [ -x "$bin/cloister-llm" ]; then
    step llm_conformance_cuda 240 python3 "$repo/tests/conformance/llm/check_cloister_llm.py" \
      "$bin/cloister-llm" "$shared_dir/models/llm/tiny-llama"
  fi
  # Generation through cloisterd with the worker on the CUDA executor, so on the CUDA LLM engine.
  if [ -x "$bin/llm_appliance_test" ]; then
    step llm_appliance_cuda 300 env CLOISTER_TEST_EXECUTOR=cuda "$bin/llm_appliance_test"
  fi
fi
if wants llmbench; then
  # BF16 and F32 on the 1 B model at 1 and 32 sequences; the tiny model for scale.
  step llm_cuda_bench 420 "$bin/cloister-bench" llm-cuda --json --models synthetic-1b,tiny \
    --precisions bf16,f32 --sequences 1,32 --repeats 3
fi
printf '%s\n' "${summary[@]}"

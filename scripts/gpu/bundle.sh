#!/usr/bin/env bash
# Packs what the GPU checks need into one folder, for a GPU machine that has the NVIDIA driver
# and the CUDA 13 libraries (cuBLAS) but none of the project's build dependencies: the
# programs of a build (stripped), the shared libraries they load apart from glibc, libstdc++ and
# CUDA's, the shared models, the ONNX node tests the GPU test lists, and a manifest of the paths
# the programs were built with (scripts/gpu/check.sh recreates them there).
#
#   scripts/gpu/bundle.sh BUILD_DIR OUT_DIR [STEP ...]
#
# With STEPs (check.sh's names), only the data those steps read is packed: `info llm llmbench`
# needs no ONNX model or node test, which keeps the bundle under the device's 64 MiB carry.
# The GGUF twin of tiny-llama is never packed (no GPU check runs llama.cpp).
set -euo pipefail

build=${1:?usage: bundle.sh BUILD_DIR OUT_DIR [STEP ...]}
out=${2:?usage: bundle.sh BUILD_DIR OUT_DIR [STEP ...]}
shift 2
onnx_data=true
if [ $# -gt 0 ]; then
  onnx_data=false
  for step in "$@"; do
    case "$step" in
      info|llm|llmbench) ;;
      executor|transfer|sanitizer|batch|appliance|cctax|coalescing) onnx_data=true ;;
      *) echo "bundle.sh: unknown step '$step'" >&2; exit 2 ;;
    esac
  done
fi
cache="$build/CMakeCache.txt"
[ -f "$cache" ] || { echo "bundle.sh: no CMakeCache.txt in $build" >&2; exit 2; }
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$cache"; }

source_dir=$(cache_value CMAKE_HOME_DIRECTORY)
shared_dir=$(cache_value CLOISTER_SHARED_DIR)
node_tests=$(cache_value CLOISTER_ONNX_NODE_TESTS)
build_dir=$(cd "$build" && pwd)

programs=(gpu_executor_test gpu_transfer_test batch_runner_gpu_test cloister-bench cloister-enclave cloisterd cloister
          tensor-to-npy models_test onnx-conformance gpu_llm_test cloister-llm llm_appliance_test
          cloister-audit)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/shared/models" "$out/node"
for program in "${programs[@]}"; do
  [ -x "$build/bin/$program" ] || continue
  strip -o "$out/bin/$program" "$build/bin/$program"
done

# Every library a program loads, except the C and C++ runtimes (the target has its own, newer)
# and CUDA's (the target's driver and toolkit provide them).
for program in "$out"/bin/*; do
  ldd "$program" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r library; do
  case "$(basename "$library")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnvidia-ml.so*) ;;
    *) cp -L "$library" "$out/lib/" ;;
  esac
done

if $onnx_data; then
  for model in ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx ocr/ch_PP-OCRv4_rec_infer.onnx \
               ocr/ppocr_keys_v1.txt vad/silero_vad_op18_ifless.onnx \
               bert_mini/bert_mini_l4_h256.onnx; do
    mkdir -p "$out/shared/models/$(dirname "$model")"
    cp "$shared_dir/models/$model" "$out/shared/models/$model"
  done
  cp -r "$shared_dir/models/testdata" "$shared_dir/models/samples" "$out/shared/models/"
  while read -r name; do
    case "$name" in test_*) [ -d "$node_tests/$name" ] && cp -r "$node_tests/$name" "$out/node/" ;; esac
  done <"$source_dir/enclave/runtime/node_tests.txt"
fi
mkdir -p "$out/shared/models/llm/tiny-llama"
for file in "$shared_dir/models/llm/tiny-llama"/*; do
  case "$(basename "$file")" in *.gguf) ;; *) cp -r "$file" "$out/shared/models/llm/tiny-llama/" ;; esac
done

cat >"$out/manifest" <<EOF
source_dir=$source_dir
build_dir=$build_dir
shared_dir=$shared_dir
node_tests=$node_tests
EOF
du -sh "$out"
# Packed for the trip: the programs and libraries apart from the data, which seldom changes.
tar -C "$out" -cf - bin lib manifest | xz -T0 -6 >"$out.programs.tar.xz"
tar -C "$out" -cf - shared node | xz -T0 -6 >"$out.data.tar.xz"
ls -la "$out".*.tar.xz

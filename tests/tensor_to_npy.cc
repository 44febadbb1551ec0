// tensor-to-npy: converts an ONNX TensorProto file (as in the backend test data) to a .npy
// file for `cloister infer --input NAME=FILE.npy`.
#include <cstdio>
#include <string>

#include "sdk/npy.h"
#include "tests/support/tensor_files.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tensor-to-npy TENSOR.pb OUT.npy\n");
    return 2;
  }
  std::string name;
  auto array = cloister::testing::ReadTensorProtoFile(argv[1], &name);
  if (!array.ok()) {
    std::fprintf(stderr, "tensor-to-npy: %s\n", std::string(array.status().message()).c_str());
    return 2;
  }
  auto st = cloister::sdk::WriteNpyFile(argv[2], *array);
  if (!st.ok()) {
    std::fprintf(stderr, "tensor-to-npy: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("%s -> %s (tensor '%s')\n", argv[1], argv[2], name.c_str());
  return 0;
}

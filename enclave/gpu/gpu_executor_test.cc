// Checks the CUDA executor against the CPU one: every ONNX node test this runtime passes
// (enclave/runtime/node_tests.txt) and every shared model, run on both executors, outputs equal
// within 1e-3 absolute + 1e-3 relative. Without a CUDA device those tests skip with the reason;
// the executor selection tests run everywhere.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/file.h"
#include "enclave/gpu/cuda_executor.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/model.h"
#include "enclave/runtime/onnx_tensor.h"
#include "gtest/gtest.h"

namespace cloister::gpu {
namespace {

namespace fs = std::filesystem;
using runtime::Executor;
using runtime::FindExecutor;
using runtime::LoadOptions;
using runtime::Model;
using runtime::Tensor;

constexpr double kAbsoluteTolerance = 1e-3;
constexpr double kRelativeTolerance = 1e-3;

bool HaveDevice() {
  absl::StatusOr<int> count = CudaDeviceCount();
  return count.ok() && *count > 0;
}

TEST(SelectionTest, UnknownExecutorListsTheBuiltOnes) {
  absl::StatusOr<const Executor*> executor = FindExecutor("tpu");
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(executor.status().message(), "cuda"))
      << executor.status().message();
}

TEST(SelectionTest, CudaIsChosenOnlyWithADevice) {
  absl::StatusOr<const Executor*> cuda = FindExecutor("cuda");
  absl::StatusOr<const Executor*> automatic = FindExecutor("auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  if (HaveDevice()) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ((*cuda)->name(), "cuda");
    EXPECT_EQ((*automatic)->name(), "cuda");
  } else {
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StartsWith(cuda.status().message(), "no CUDA device: "))
        << cuda.status().message();
    EXPECT_EQ((*automatic)->name(), "cpu");
    absl::StatusOr<const Executor*> strict = FindExecutor("cuda-strict");
    EXPECT_FALSE(strict.ok());
  }
}

// Loads `path` on `executor`.
absl::StatusOr<std::unique_ptr<Model>> LoadOn(const std::string& path, const Executor* executor) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  LoadOptions options;
  options.executor = executor;
  return Model::Load(AsBytes(*bytes), options);
}

// The inputs of one test_data_set folder, named by the model's inputs in order.
absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> ReadInputs(const Model& model,
                                                                       const fs::path& set) {
  std::vector<std::pair<std::string, Tensor>> inputs;
  for (size_t i = 0; i < model.inputs().size(); ++i) {
    const fs::path file = set / absl::StrCat("input_", i, ".pb");
    absl::StatusOr<std::string> bytes = ReadFile(file.string());
    if (!bytes.ok()) return bytes.status();
    onnx::TensorProto proto;
    if (!proto.ParseFromString(*bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(file.string(), " is not a TensorProto"));
    }
    absl::StatusOr<Tensor> tensor = runtime::TensorFromProto(proto);
    if (!tensor.ok()) return tensor.status();
    inputs.emplace_back(model.inputs()[i].name, std::move(tensor).value());
  }
  return inputs;
}

double ValueAt(const Tensor& tensor, int64_t i) {
  switch (tensor.dtype()) {
    case runtime::DataType::kFloat:
      return tensor.data<float>()[i];
    case runtime::DataType::kDouble:
      return tensor.data<double>()[i];
    case runtime::DataType::kInt32:
      return tensor.data<int32_t>()[i];
    case runtime::DataType::kInt64:
      return static_cast<double>(tensor.data<int64_t>()[i]);
    case runtime::DataType::kBool:
      return tensor.data<bool>()[i] ? 1 : 0;
    case runtime::DataType::kUint8:
      return tensor.data<uint8_t>()[i];
    case runtime::DataType::kInt8:
      return tensor.data<int8_t>()[i];
    default: {
      // Other types compare bytewise through this path: exact equality.
      const auto* bytes = static_cast<const unsigned char*>(tensor.raw_data());
      const size_t size = runtime::ElementSize(tensor.dtype());
      double value = 0;
      for (size_t b = 0; b < size; ++b) value = value * 256 + bytes[i * size + b];
      return value;
    }
  }
}

// Empty when `cuda` matches `cpu` within the tolerance.
std::string Difference(const Tensor& cpu, const Tensor& cuda) {
  if (cpu.dtype() != cuda.dtype() || cpu.shape() != cuda.shape()) {
    return absl::StrCat("type/shape ", runtime::TypeName(cuda.dtype()), " ",
                        runtime::ShapeToString(cuda.shape()), " vs cpu ",
                        runtime::TypeName(cpu.dtype()), " ", runtime::ShapeToString(cpu.shape()));
  }
  for (int64_t i = 0; i < cpu.count(); ++i) {
    const double want = ValueAt(cpu, i), got = ValueAt(cuda, i);
    if (std::isnan(want) && std::isnan(got)) continue;
    if (std::isinf(want) && want == got) continue;
    if (!(std::fabs(got - want) <= kAbsoluteTolerance + kRelativeTolerance * std::fabs(want))) {
      return absl::StrCat("element ", i, ": cuda ", got, " vs cpu ", want);
    }
  }
  return "";
}

// Runs every test_data_set of `dir` through `model_path` on both executors; empty on a match.
std::string CompareExecutors(const std::string& model_path, const fs::path& dir,
                             const Executor* cuda) {
  auto cpu_model = LoadOn(model_path, &runtime::CpuExecutor());
  if (!cpu_model.ok()) return absl::StrCat("cpu load: ", cpu_model.status().message());
  auto cuda_model = LoadOn(model_path, cuda);
  if (!cuda_model.ok()) return absl::StrCat("cuda load: ", cuda_model.status().message());
  std::vector<fs::path> sets;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0) {
      sets.push_back(entry.path());
    }
  }
  if (sets.empty()) return "no test_data_set_* folders";
  for (const fs::path& set : sets) {
    auto inputs = ReadInputs(**cpu_model, set);
    if (!inputs.ok()) return absl::StrCat(set.filename().string(), ": ", inputs.status().message());
    auto want = (*cpu_model)->Run(*inputs);
    if (!want.ok()) return absl::StrCat("cpu run: ", want.status().message());
    // Twice on the device: the second run reuses (scrubbed) pooled memory.
    for (int round = 0; round < 2; ++round) {
      auto got = (*cuda_model)->Run(*inputs);
      if (!got.ok()) return absl::StrCat("cuda run: ", got.status().message());
      if (got->size() != want->size()) return "output counts differ";
      for (size_t o = 0; o < got->size(); ++o) {
        EXPECT_FALSE((*got)[o].second.on_device());
        std::string difference = Difference((*want)[o].second, (*got)[o].second);
        if (!difference.empty()) {
          return absl::StrCat(set.filename().string(), " output '", (*want)[o].first, "' run ",
                              round, ": ", difference);
        }
      }
    }
  }
  return "";
}

class GpuExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<const Executor*> cuda = FindExecutor("cuda");
    if (!cuda.ok()) {
      GTEST_SKIP() << "skipping CUDA-vs-CPU comparison: " << cuda.status().message();
    }
    cuda_ = *cuda;
  }
  const Executor* cuda_ = nullptr;
};

TEST_F(GpuExecutorTest, EveryListedNodeTestMatchesTheCpu) {
  const fs::path root = CLOISTER_NODE_TESTS_DIR;
  if (!fs::exists(root)) GTEST_SKIP() << "ONNX node tests not installed at " << root;
  std::ifstream list(CLOISTER_NODE_TEST_LIST);
  ASSERT_TRUE(list.good());
  std::string name;
  int compared = 0, failed = 0;
  while (std::getline(list, name)) {
    if (name.rfind("test_", 0) != 0) continue;
    const fs::path dir = root / name;
    const std::string failure = CompareExecutors((dir / "model.onnx").string(), dir, cuda_);
    ++compared;
    if (!failure.empty()) {
      ++failed;
      ADD_FAILURE() << name << ": " << failure;
    }
  }
  std::printf("compared %d node tests on cpu and cuda, %d differ\n", compared, failed);
  EXPECT_GT(compared, 300);
}

TEST_F(GpuExecutorTest, SharedModelsMatchTheCpu) {
  const fs::path models = fs::path(CLOISTER_SHARED_DIR) / "models";
  const std::pair<const char*, const char*> cases[] = {
      {"ch_ppocr_mobile_v2.0_cls", "ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx"},
      {"ch_PP-OCRv4_rec", "ocr/ch_PP-OCRv4_rec_infer.onnx"},
      {"silero_vad_op18_ifless", "vad/silero_vad_op18_ifless.onnx"},
      {"bert_mini_l4_h256", "bert_mini/bert_mini_l4_h256.onnx"},
  };
  for (const auto& [name, file] : cases) {
    const std::string failure =
        CompareExecutors((models / file).string(), models / "testdata" / name, cuda_);
    EXPECT_EQ(failure, "") << name;
  }
}

// A node without a device kernel fails a strict load, naming the node and operator.
TEST_F(GpuExecutorTest, StrictLoadNamesANodeWithoutDeviceKernel) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(13);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::NodeProto* node = graph->add_node();
  node->set_op_type("CumSum");
  node->set_name("running_total");
  node->add_input("x");
  node->add_input("axis");
  node->add_output("y");
  onnx::TensorProto* axis = graph->add_initializer();
  axis->set_name("axis");
  axis->set_data_type(onnx::TensorProto::INT64);
  axis->add_int64_data(0);
  for (const char* name : {"x", "y"}) {
    onnx::ValueInfoProto* value = name[0] == 'x' ? graph->add_input() : graph->add_output();
    value->set_name(name);
    auto* type = value->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto::FLOAT);
    type->mutable_shape()->add_dim()->set_dim_value(4);
  }
  const std::string bytes = model.SerializeAsString();
  absl::StatusOr<const Executor*> strict = FindExecutor("cuda-strict");
  ASSERT_TRUE(strict.ok()) << strict.status();
  LoadOptions options;
  options.executor = *strict;
  auto loaded = Model::Load(AsBytes(bytes), options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "running_total"));
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "CumSum"));
  // The default executor runs it with an explicit host fallback, matching the CPU.
  options.executor = cuda_;
  auto fallback = Model::Load(AsBytes(bytes), options);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  auto x = Tensor::FromVector<float>({4}, {1, 2, 3, 4});
  ASSERT_TRUE(x.ok());
  auto result = (*fallback)->Run({{"x", *x}});
  ASSERT_TRUE(result.ok()) << result.status();
  const float* y = (*result)[0].second.data<float>();
  EXPECT_EQ(y[3], 10.f);
}

}  // namespace
}  // namespace cloister::gpu

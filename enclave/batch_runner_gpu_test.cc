// RunBatch through a device executor's own batch path (pcie/batch_path.h; enclave/gpu registers
// the CUDA one): the inputs cross in one transfer into device memory (decrypted there by the GCM
// kernels in mode emulated), the CUDA executor computes on views of that device buffer, the
// outputs are gathered on the device and cross back in one transfer. Every request gets exactly
// the results the CPU executor gives it through the host path, in each PCIe mode, coalesced or
// not; ciphertext modified in flight either way refuses the batch. Needs a GPU (label gpu): the
// device tests skip without one, saying why. The DevicePathSelection tests run everywhere.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "enclave/batch_request_for_test.h"
#include "enclave/batch_runner.h"
#include "enclave/pcie/batch_path.h"
#include "enclave/pcie/transfer_path.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "gtest/gtest.h"
#include "tests/support/neg_add_model.h"

namespace cloister::enclave {
namespace {

using pcie::PcieMode;

bool HaveCuda() { return runtime::FindExecutor("cuda").ok(); }

// (The CPU executor's host path and unknown names: batch_runner_test, which every build runs.)
TEST(DevicePathSelection, CudaHasADevicePathThatNeedsADevice) {
  for (const char* name : {"cuda", "cuda-strict"}) {
    // One registration: the executor's name finds its path too.
    auto factory = runtime::FindBatchPathFactory(name);
    ASSERT_TRUE(factory.ok()) << factory.status();
    EXPECT_TRUE(*factory != nullptr) << name;
    auto path = pcie::NewBatchPath(name, PcieMode::kEmulated, {});
    if (HaveCuda()) {
      ASSERT_TRUE(path.ok()) << path.status();
      ASSERT_NE(*path, nullptr) << name;
      EXPECT_TRUE((*path)->executor_memory_on_device());
      EXPECT_EQ((*path)->mode(), PcieMode::kEmulated);
    } else {
      ASSERT_FALSE(path.ok()) << name;
      EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition) << path.status();
    }
  }
}

const std::vector<float> kWeights = {0.5f, -1.0f, 2.0f, 4.0f};

class GpuBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cuda = runtime::FindExecutor("cuda");
    if (!cuda.ok()) GTEST_SKIP() << "skipping RunBatch on a GPU: " << cuda.status().message();
    cuda_ = *cuda;
    cuda_model_ = Load(testing::NegAndAddModel(kWeights), cuda_);
    cpu_model_ = Load(testing::NegAndAddModel(kWeights), &runtime::CpuExecutor());
    auto host = pcie::TransferPath::Create(PcieMode::kOff, {});
    ASSERT_TRUE(host.ok()) << host.status();
    host_path_ = *std::move(host);
  }

  static std::unique_ptr<runtime::Model> Load(const onnx::ModelProto& proto,
                                              const runtime::Executor* executor) {
    const std::string bytes = proto.SerializeAsString();
    runtime::LoadOptions options;
    options.executor = executor;
    auto model = runtime::Model::Load(AsBytes(bytes), options);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  }

  std::unique_ptr<pcie::BatchPath> DevicePath(PcieMode mode, pcie::TransferOptions options = {}) {
    auto path = pcie::NewBatchPath(cuda_->name(), mode, std::move(options));
    EXPECT_TRUE(path.ok()) << path.status();
    if (!path.ok()) return nullptr;
    EXPECT_TRUE((*path)->executor_memory_on_device());
    return *std::move(path);
  }

  // A request of `rows` rows of `columns` floats drawn from `seed`.
  BatchRequest Request(uint32_t seed, int64_t rows, int64_t columns = 4) {
    return FloatRowsRequest(storage_.emplace_back(runtime::RandomFloats(rows * columns, seed)),
                            rows, columns);
  }

  // Every reply of `got` equals the same request's reply in `want`, byte for byte (Neg and Add
  // are exact on both executors), or both are the same error.
  static void ExpectSameReplies(const BatchOutcome& want, const BatchOutcome& got) {
    ASSERT_EQ(want.replies.size(), got.replies.size());
    for (size_t r = 0; r < want.replies.size(); ++r) {
      ASSERT_EQ(want.replies[r].ok(), got.replies[r].ok()) << "request " << r;
      if (!want.replies[r].ok()) {
        EXPECT_EQ(want.replies[r].status().code(), got.replies[r].status().code());
        continue;
      }
      ASSERT_EQ(want.replies[r]->outputs_size(), got.replies[r]->outputs_size());
      for (int o = 0; o < want.replies[r]->outputs_size(); ++o) {
        const auto& a = want.replies[r]->outputs(o);
        const auto& b = got.replies[r]->outputs(o);
        EXPECT_EQ(a.name(), b.name());
        EXPECT_EQ(a.datatype(), b.datatype());
        EXPECT_EQ(std::vector<int64_t>(a.shape().begin(), a.shape().end()),
                  std::vector<int64_t>(b.shape().begin(), b.shape().end()));
        EXPECT_EQ(a.raw(), b.raw()) << "request " << r << " output " << a.name();
      }
    }
  }

  const runtime::Executor* cuda_ = nullptr;
  std::unique_ptr<runtime::Model> cuda_model_, cpu_model_;
  std::unique_ptr<pcie::TransferPath> host_path_;
  std::vector<std::vector<float>> storage_;
};

TEST_F(GpuBatchTest, CoalescedRequestsGetTheCpuResultsInEveryMode) {
  std::vector<BatchRequest> requests;
  const std::vector<int64_t> rows = {1, 3, 1, 2, 5};
  for (size_t i = 0; i < rows.size(); ++i) requests.push_back(Request(10 + i, rows[i]));
  auto want = RunBatch(*cpu_model_, *host_path_, requests);
  ASSERT_TRUE(want.ok()) << want.status();
  for (PcieMode mode : {PcieMode::kOff, PcieMode::kDriver, PcieMode::kEmulated}) {
    SCOPED_TRACE(pcie::PcieModeName(mode));
    int crossings = 0;
    pcie::TransferOptions options;
    options.in_flight_hook_for_test = [&](std::span<uint8_t>) { ++crossings; };
    std::unique_ptr<pcie::BatchPath> path = DevicePath(mode, options);
    ASSERT_NE(path, nullptr);
    // Twice: the second batch reuses the pooled (scrubbed) device blocks.
    for (int round = 0; round < 2; ++round) {
      auto got = RunBatch(*cuda_model_, *path, requests);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->coalesced);
      EXPECT_EQ(got->model_runs, 1);
      EXPECT_EQ(got->input_size, want->input_size);
      EXPECT_EQ(got->output_size, want->output_size);
      ExpectSameReplies(*want, *got);
    }
    // In mode emulated the sealed batch crosses once each way per batch.
    EXPECT_EQ(crossings, mode == PcieMode::kEmulated ? 4 : 0);
  }
}

TEST_F(GpuBatchTest, RequestsThatCannotRunTogetherRunOneByOneOnTheDevice) {
  std::vector<BatchRequest> requests = {Request(1, 2), Request(2, 1, /*columns=*/3), Request(3, 3)};
  requests[2].requested_outputs = {"z"};
  auto want = RunBatch(*cpu_model_, *host_path_, requests);
  ASSERT_TRUE(want.ok()) << want.status();
  std::unique_ptr<pcie::BatchPath> path = DevicePath(PcieMode::kEmulated);
  ASSERT_NE(path, nullptr);
  auto got = RunBatch(*cuda_model_, *path, requests);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->coalesced);
  EXPECT_EQ(got->model_runs, 3);
  ASSERT_FALSE(got->replies[1].ok());  // three columns where the model takes four
  EXPECT_EQ(got->replies[1].status().code(), absl::StatusCode::kInvalidArgument);
  ExpectSameReplies(*want, *got);
}

// A model whose output is a constant and another that passes its input through: their device
// results share a buffer with the model or with the batch's input, are gathered all the same,
// and the constant is intact for the next batch.
TEST_F(GpuBatchTest, OutputsSharingAConstantOrTheInputAreGatheredAndLeftIntact) {
  runtime::GraphBuilder builder(17);
  builder.Input("x", onnx::TensorProto::FLOAT, {-1, 4});
  builder.FloatInitializer("w", {4}, kWeights);
  builder.Node("Identity", {"w"}, {"constant"});
  builder.Node("Identity", {"x"}, {"passed"});
  builder.Output("constant", onnx::TensorProto::FLOAT, std::vector<int64_t>{4});
  builder.Output("passed", onnx::TensorProto::FLOAT, std::vector<int64_t>{-1, 4});
  const onnx::ModelProto proto = builder.proto();
  std::unique_ptr<runtime::Model> cuda_model = Load(proto, cuda_);
  std::unique_ptr<runtime::Model> cpu_model = Load(proto, &runtime::CpuExecutor());
  ASSERT_NE(cuda_model, nullptr);
  ASSERT_NE(cpu_model, nullptr);
  std::unique_ptr<pcie::BatchPath> path = DevicePath(PcieMode::kEmulated);
  ASSERT_NE(path, nullptr);
  for (int round = 0; round < 2; ++round) {
    std::vector<BatchRequest> requests = {Request(20 + round, 2), Request(30 + round, 1)};
    auto want = RunBatch(*cpu_model, *host_path_, requests);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = RunBatch(*cuda_model, *path, requests);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameReplies(*want, *got);
  }
}

TEST_F(GpuBatchTest, CiphertextModifiedInFlightEitherWayRefusesTheBatch) {
  std::vector<BatchRequest> requests = {Request(1, 2), Request(2, 2)};
  for (int tampered_crossing : {1, 2}) {  // 1: on its way to the device, 2: on its way back
    SCOPED_TRACE(tampered_crossing == 1 ? "to the device" : "to the host");
    int crossing = 0;
    pcie::TransferOptions options;
    options.in_flight_hook_for_test = [&](std::span<uint8_t> sealed) {
      if (++crossing == tampered_crossing) sealed[sealed.size() / 2] ^= 0x01;
    };
    std::unique_ptr<pcie::BatchPath> path = DevicePath(PcieMode::kEmulated, options);
    ASSERT_NE(path, nullptr);
    auto got = RunBatch(*cuda_model_, *path, requests);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_EQ(crossing, tampered_crossing) << "the model must not run on refused inputs";
  }
}

}  // namespace
}  // namespace cloister::enclave

// RunBatch's grouping: coalesced requests run as up to one model run per pool thread, each
// over a contiguous group of about equal rows, and every request still gets exactly its own
// rows back; requests that cannot run together run one by one, and one the model refuses fails
// alone. And which batch path an executor's batches take (the device ones: batch_runner_gpu_test).
#include "enclave/batch_runner.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/task_pool.h"
#include "enclave/batch_request_for_test.h"
#include "enclave/pcie/batch_path.h"
#include "enclave/pcie/transfer_path.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "gtest/gtest.h"
#include "tests/support/neg_add_model.h"

namespace cloister::enclave {
namespace {

TEST(BatchPathSelection, TheCpuExecutorTakesTheHostPath) {
  auto factory = runtime::FindBatchPathFactory(runtime::CpuExecutor().name());
  ASSERT_TRUE(factory.ok()) << factory.status();
  EXPECT_TRUE(*factory == nullptr);  // it computes in host memory
  auto path = pcie::NewBatchPath("cpu", pcie::PcieMode::kEmulated, {});
  ASSERT_TRUE(path.ok()) << path.status();
  const auto* host = dynamic_cast<const pcie::HostBatchPath*>(path->get());
  ASSERT_NE(host, nullptr);
  EXPECT_FALSE(host->executor_memory_on_device());
  EXPECT_EQ(host->mode(), pcie::PcieMode::kEmulated);
  EXPECT_EQ(host->transfer().mode(), pcie::PcieMode::kEmulated);
}

TEST(BatchPathSelection, AnUnknownExecutorHasNoPath) {
  auto factory = runtime::FindBatchPathFactory("tpu");
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(factory.status().message().find("unknown executor 'tpu'"), std::string::npos)
      << factory.status();
  auto path = pcie::NewBatchPath("tpu", pcie::PcieMode::kOff, {});
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status(), factory.status());
}

const std::vector<float> kWeights = {0.5f, -1.0f, 2.0f, 4.0f};

class BatchRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string bytes = testing::NegAndAddModel(kWeights).SerializeAsString();
    auto model = runtime::Model::Load(AsBytes(bytes));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    auto path = pcie::TransferPath::Create(pcie::PcieMode::kOff, {});
    ASSERT_TRUE(path.ok()) << path.status();
    path_ = *std::move(path);
  }

  // A request of `rows` rows of `columns` floats, row r of request `id` holding id * 100 + r.
  BatchRequest Request(int id, int64_t rows, int64_t columns = 4) {
    auto& values = storage_.emplace_back();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < columns; ++c) values.push_back(static_cast<float>(id * 100 + r));
    }
    return FloatRowsRequest(values, rows, columns);
  }

  // Checks request `id`'s reply: y = -x and z = x + w over its own rows only.
  static void ExpectOwnRows(const absl::StatusOr<api::v1::InferReplyPayload>& reply, int id,
                            int64_t rows) {
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->outputs_size(), 2);
    for (const auto& output : reply->outputs()) {
      ASSERT_EQ(output.shape_size(), 2);
      EXPECT_EQ(output.shape(0), rows) << output.name();
      ASSERT_EQ(output.raw().size(), rows * kWeights.size() * sizeof(float));
      std::vector<float> got(rows * kWeights.size());
      std::memcpy(got.data(), output.raw().data(), output.raw().size());
      for (int64_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < kWeights.size(); ++c) {
          const float x = static_cast<float>(id * 100 + r);
          const float want = output.name() == "y" ? -x : x + kWeights[c];
          EXPECT_EQ(got[r * kWeights.size() + c], want) << output.name() << " request " << id;
        }
      }
    }
  }

  std::unique_ptr<runtime::Model> model_;
  std::unique_ptr<pcie::TransferPath> path_;
  std::vector<std::vector<float>> storage_;
};

TEST_F(BatchRunnerTest, CoalescedRequestsRunInOneGroupPerPoolThread) {
  const std::vector<int64_t> rows = {1, 3, 1, 1, 2};
  std::vector<BatchRequest> requests;
  for (size_t i = 0; i < rows.size(); ++i) requests.push_back(Request(i, rows[i]));

  auto serial = RunBatch(*model_, *path_, requests);
  ASSERT_TRUE(serial.ok()) << serial.status();
  EXPECT_TRUE(serial->coalesced);
  EXPECT_EQ(serial->model_runs, 1);

  TaskPool pool(2);
  auto grouped = RunBatch(*model_, *path_, requests, &pool);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_TRUE(grouped->coalesced);
  EXPECT_EQ(grouped->model_runs, 2);  // rows {1, 3} and {1, 1, 2}: 4 each
  EXPECT_EQ(grouped->input_size, serial->input_size);
  EXPECT_EQ(grouped->output_size, serial->output_size);
  for (size_t i = 0; i < rows.size(); ++i) {
    ExpectOwnRows(serial->replies[i], i, rows[i]);
    ExpectOwnRows(grouped->replies[i], i, rows[i]);
  }

  // More threads than requests: one request per run, and the batch no longer counts as
  // coalesced.
  TaskPool wide(8);
  std::vector<BatchRequest> two = {Request(7, 2), Request(8, 5)};
  auto apart = RunBatch(*model_, *path_, two, &wide);
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_FALSE(apart->coalesced);
  EXPECT_EQ(apart->model_runs, 2);
  ExpectOwnRows(apart->replies[0], 7, 2);
  ExpectOwnRows(apart->replies[1], 8, 5);
}

TEST_F(BatchRunnerTest, RequestsThatCannotRunTogetherRunAloneAndFailAlone) {
  std::vector<BatchRequest> requests = {Request(1, 2), Request(2, 1, /*columns=*/3), Request(3, 3)};
  requests[2].requested_outputs = {"z"};
  TaskPool pool(2);
  auto ran = RunBatch(*model_, *path_, requests, &pool);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_FALSE(ran->coalesced);
  EXPECT_EQ(ran->model_runs, 3);
  ExpectOwnRows(ran->replies[0], 1, 2);
  ASSERT_FALSE(ran->replies[1].ok());  // three columns where the model takes four
  EXPECT_EQ(ran->replies[1].status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ran->replies[2].ok()) << ran->replies[2].status();
  ASSERT_EQ(ran->replies[2]->outputs_size(), 1);
  EXPECT_EQ(ran->replies[2]->outputs(0).name(), "z");
  EXPECT_EQ(ran->replies[2]->outputs(0).shape(0), 3);
}

// A run past its deadline stops between steps: a request alone, and a coalesced group, whose
// run stops at the latest of its requests' deadlines and is not run again request by request.
TEST_F(BatchRunnerTest, RunsPastTheirDeadlineStopWithDeadlineExceeded) {
  FakeClock clock;  // the deadlines' own clock: nothing here waits for real time
  std::vector<BatchRequest> alone = {Request(1, 2)};
  alone[0].deadline = Deadline::At(clock.Now() - absl::Seconds(1), &clock);
  auto late = RunBatch(*model_, *path_, alone);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->replies[0].status().code(), absl::StatusCode::kDeadlineExceeded)
      << late->replies[0].status();

  std::vector<BatchRequest> group = {Request(1, 2), Request(2, 3), Request(3, 1)};
  group[0].deadline = Deadline::At(clock.Now() - absl::Seconds(2), &clock);
  group[1].deadline = Deadline::At(clock.Now() - absl::Seconds(1), &clock);  // latest, past too
  group[2].deadline = Deadline::At(clock.Now() - absl::Seconds(3), &clock);
  auto stopped = RunBatch(*model_, *path_, group);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->model_runs, 1);
  for (const auto& reply : stopped->replies) {
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  }

  // One deadline still ahead: the shared run goes on for everyone.
  group[1].deadline = Deadline::At(clock.Now() + absl::Hours(1), &clock);
  auto ran = RunBatch(*model_, *path_, group);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_TRUE(ran->coalesced);
  ExpectOwnRows(ran->replies[0], 1, 2);
  ExpectOwnRows(ran->replies[1], 2, 3);
  ExpectOwnRows(ran->replies[2], 3, 1);
}

// Requests with no inputs have no rows to put together: each runs alone (and the model, which
// takes one, refuses each).
TEST_F(BatchRunnerTest, RequestsWithoutInputsRunAlone) {
  std::vector<BatchRequest> requests(3);
  for (TaskPool* pool : {static_cast<TaskPool*>(nullptr), new TaskPool(2)}) {
    std::unique_ptr<TaskPool> owned(pool);
    auto ran = RunBatch(*model_, *path_, requests, pool);
    ASSERT_TRUE(ran.ok()) << ran.status();
    EXPECT_FALSE(ran->coalesced);
    EXPECT_EQ(ran->model_runs, 3);
    for (const auto& reply : ran->replies) {
      EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << reply.status();
    }
  }
}

// A model that centres each column on its mean over all rows given: its output rows depend on
// the other rows. Coalescing a tenant's requests into one run would answer each with values
// that depend on the others, so they run one by one and each gets what it would get alone.
TEST_F(BatchRunnerTest, AModelThatMixesRowsRunsRequestByRequest) {
  runtime::GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {-1, 4}).IntInitializer("rows", {1}, {0});
  builder.Node("ReduceMean", {"x", "rows"}, {"mean"}, "mean");
  builder.Node("Sub", {"x", "mean"}, {"y"});
  builder.Output("y");
  builder.proto().mutable_opset_import(0)->set_version(18);  // ReduceMean takes its axes as input
  const std::string bytes = builder.Bytes();
  auto centring = runtime::Model::Load(AsBytes(bytes));
  ASSERT_TRUE(centring.ok()) << centring.status();
  ASSERT_FALSE((*centring)->row_independence().independent);
  EXPECT_EQ((*centring)->row_independence().reason,
            "node 'mean' (ReduceMean) reduces over the row axis");

  const std::vector<BatchRequest> requests = {Request(1, 2), Request(2, 3)};
  TaskPool pool(2);
  auto ran = RunBatch(**centring, *path_, requests, &pool);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_FALSE(ran->coalesced);
  EXPECT_EQ(ran->model_runs, 2);
  // Request r's rows are r * 100 + row: centred on their own mean they are row - (rows - 1) / 2
  // whatever the other request holds.
  for (size_t r = 0; r < requests.size(); ++r) {
    ASSERT_TRUE(ran->replies[r].ok()) << ran->replies[r].status();
    const auto& output = ran->replies[r]->outputs(0);
    const int64_t rows = requests[r].inputs[0].shape[0];
    ASSERT_EQ(output.raw().size(), rows * 4 * sizeof(float));
    std::vector<float> got(rows * 4);
    std::memcpy(got.data(), output.raw().data(), output.raw().size());
    for (int64_t row = 0; row < rows; ++row) {
      for (int c = 0; c < 4; ++c) {
        EXPECT_FLOAT_EQ(got[row * 4 + c], static_cast<float>(row) - (rows - 1) / 2.0f)
            << "request " << r << " row " << row;
      }
    }
  }
}

}  // namespace
}  // namespace cloister::enclave

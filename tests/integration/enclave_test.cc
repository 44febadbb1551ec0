// The enclave's checks, exercised in-process through the boundary calls exactly as cloisterd
// sends them, with a client built from the same crypto the SDK uses. These are the refusals
// the host (or anyone in the middle) can provoke: replays, flipped bits, tampered or truncated
// models, another tenant's or identity's session, batches that mix tenants or models, and a
// wrapped model key under another measurement. Also: batches cross the PCIe path in one
// transfer each way in every mode, a modified emulated transfer refuses the batch, and every
// batch's signed usage receipt verifies and adds up to the requests sent.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>

#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/channel.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "enclave/enclave.h"
#include "enclave/pcie/batch_path.h"
#include "enclave/runtime/executor.h"
#include "gtest/gtest.h"
#include "host/audit/audit_log.h"
#include "host/receipts/receipt_log.h"
#include "tests/support/enclave_tenant.h"
#include "tests/support/process.h"
#include "tests/support/tensor_files.h"

namespace cloister::testing {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using boundary::v1::ForwardedRequest;

const std::string kShared = CLOISTER_SHARED_DIR;
const std::string kClsModel = kShared + "/models/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
const std::string kClsData = kShared + "/models/testdata/ch_ppocr_mobile_v2.0_cls";

Bytes TestMeasurement(std::string_view label) { return crypto::Sha384(AsBytes(label)); }

// The enclave's tenant side (tests/support/enclave_tenant.h), with gtest checks and the
// classifier's inputs.
class TestClient : public EnclaveTenant {
 public:
  TestClient(enclave::Enclave* enclave, std::string tenant, const attest::v1::Policy& policy,
             absl::Time at = absl::Now())
      : EnclaveTenant(enclave, std::move(tenant), policy, at) {
    EXPECT_TRUE(attestation().ok()) << attestation();
  }

  ::testing::AssertionResult Open() {
    const absl::Status opened = EnclaveTenant::Open();
    if (!opened.ok()) return ::testing::AssertionFailure() << opened;
    return ::testing::AssertionSuccess();
  }

  ForwardedRequest InferItem(const std::string& name, int set) {
    auto input = ReadTensorProtoFile(absl::StrCat(kClsData, "/test_data_set_", set, "/input_0.pb"));
    api::v1::InferRequestPayload payload;
    auto* t = payload.add_inputs();
    t->set_name("x");
    t->set_datatype(input->datatype);
    for (int64_t d : input->shape) t->add_shape(d);
    t->set_raw(ToString(input->data));
    return Seal(crypto::MessageKind::kInfer, Handle(name), payload);
  }
};

class EnclaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("cloister-enclave-test");
    enclave_ = MakeEnclave(TestMeasurement("enclave under test"));
    ASSERT_NE(enclave_, nullptr);
    auto policy = attest::LoadPolicyFile(dir_ + "/dev-policy.yaml");
    ASSERT_TRUE(policy.ok()) << policy.status();
    policy_ = *policy;
    auto model = ReadFile(kClsModel);
    ASSERT_TRUE(model.ok());
    model_bytes_ = *model;
  }

  std::unique_ptr<enclave::Enclave> MakeEnclave(
      Bytes measurement, const std::function<void(enclave::EnclaveOptions&)>& tweak = {}) {
    enclave::EnclaveOptions options;
    if (tweak) tweak(options);
    options.sim_dir = dir_ + "/sim";
    options.dev_policy_out = dir_ + "/dev-policy.yaml";
    options.measurement = std::move(measurement);
    options.clock = &clock_;
    auto made = enclave::Enclave::Create(std::move(options));
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? std::move(*made) : nullptr;
  }

  // The statistics of the enclave's host transfer path (its batches take one on the CPU).
  enclave::pcie::TransferPath::Stats HostTransferStats() {
    auto path = enclave_->transfer_path();
    EXPECT_TRUE(path.ok()) << path.status();
    return path.ok() ? (*path)->stats() : enclave::pcie::TransferPath::Stats();
  }

  std::unique_ptr<TestClient> Client(const std::string& tenant) {
    auto client = std::make_unique<TestClient>(enclave_.get(), tenant, policy_);
    EXPECT_TRUE(client->Open());
    return client;
  }

  // Uploads the classifier as `name`; returns the host's copy of the call and result.
  boundary::v1::LoadModelResult Upload(TestClient& client, const std::string& name) {
    HostToEnclave call = client.LoadCall(name, model_bytes_);
    EnclaveToHost reply = enclave_->Handle(call);
    EXPECT_EQ(reply.status().code(), 0) << reply.status().message();
    EXPECT_TRUE(client.OpenReply(crypto::MessageKind::kLoadModel, call.load_model().request(),
                                 reply.load_model().reply()).ok());
    EXPECT_FALSE(reply.load_model().wrapped_model_key().empty());
    last_upload_ = call;
    return reply.load_model();
  }

  EnclaveToHost InferBatch(const std::string& tenant, const std::string& handle,
                           const std::vector<ForwardedRequest>& items) {
    HostToEnclave call;
    auto* batch = call.mutable_infer_batch();
    batch->set_tenant_id(tenant);
    batch->set_model_handle(handle);
    for (const auto& item : items) *batch->add_items() = item;
    return enclave_->Handle(call);
  }

  FakeClock clock_{absl::Now()};
  std::string dir_;
  std::unique_ptr<enclave::Enclave> enclave_;
  attest::v1::Policy policy_;
  std::string model_bytes_;
  HostToEnclave last_upload_;
};

TEST_F(EnclaveTest, BatchedInferenceMatchesReferenceOutputs) {
  auto client = Client("alpha");
  Upload(*client, "cls");
  std::vector<ForwardedRequest> items = {client->InferItem("cls", 0), client->InferItem("cls", 1)};
  EnclaveToHost reply = InferBatch("alpha", client->Handle("cls"), items);
  ASSERT_EQ(reply.status().code(), 0) << reply.status().message();
  ASSERT_EQ(reply.infer_batch().replies_size(), 2);
  for (int set = 0; set < 2; ++set) {
    std::string body;
    ASSERT_TRUE(client->OpenReply(crypto::MessageKind::kInfer, items[set],
                                  reply.infer_batch().replies(set), &body).ok());
    api::v1::InferReplyPayload payload;
    ASSERT_TRUE(payload.ParseFromString(body));
    ASSERT_EQ(payload.outputs_size(), 1);
    auto expected = ReadTensorProtoFile(absl::StrCat(kClsData, "/test_data_set_", set, "/output_0.pb"));
    sdk::NpyArray actual{payload.outputs(0).datatype(),
                         {payload.outputs(0).shape().begin(), payload.outputs(0).shape().end()},
                         Bytes(payload.outputs(0).raw().begin(), payload.outputs(0).raw().end())};
    EXPECT_EQ(CompareArrays(actual, *expected), "") << "set " << set;
  }
}

// The host sends how long each request may still run; a run that outlives it stops, and the
// request's sealed answer says DEADLINE_EXCEEDED. A run shared by several requests stops at the
// latest of their deadlines: a generous one lets the whole run finish.
TEST_F(EnclaveTest, RunsStopAtTheDeadlineTheHostSends) {
  auto client = Client("alpha");
  Upload(*client, "cls");
  ForwardedRequest late = client->InferItem("cls", 0);
  late.mutable_time_left()->set_seconds(0);  // already past: the run stops before its first step
  EnclaveToHost stopped = InferBatch("alpha", client->Handle("cls"), {late});
  ASSERT_EQ(stopped.status().code(), 0) << stopped.status().message();
  absl::Status status =
      client->OpenReply(crypto::MessageKind::kInfer, late, stopped.infer_batch().replies(0));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("deadline"), std::string::npos) << status;

  std::vector<ForwardedRequest> items = {client->InferItem("cls", 0), client->InferItem("cls", 1)};
  items[0].mutable_time_left()->set_nanos(-1);
  items[1].mutable_time_left()->set_seconds(5 * 60);
  EnclaveToHost shared = InferBatch("alpha", client->Handle("cls"), items);
  ASSERT_EQ(shared.status().code(), 0) << shared.status().message();
  for (int set = 0; set < 2; ++set) {
    std::string body;
    EXPECT_TRUE(client
                    ->OpenReply(crypto::MessageKind::kInfer, items[set],
                                shared.infer_batch().replies(set), &body)
                    .ok());
    api::v1::InferReplyPayload payload;
    ASSERT_TRUE(payload.ParseFromString(body));
    EXPECT_EQ(payload.outputs_size(), 1) << "set " << set;
  }
}

TEST_F(EnclaveTest, ReplayedRequestIsRefused) {
  auto client = Client("alpha");
  Upload(*client, "cls");
  ForwardedRequest item = client->InferItem("cls", 0);
  EnclaveToHost first = InferBatch("alpha", client->Handle("cls"), {item});
  ASSERT_TRUE(client->OpenReply(crypto::MessageKind::kInfer, item, first.infer_batch().replies(0)).ok());
  EnclaveToHost replay = InferBatch("alpha", client->Handle("cls"), {item});
  absl::Status st = client->OpenReply(crypto::MessageKind::kInfer, item, replay.infer_batch().replies(0));
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("replay"), std::string::npos) << st;
}

TEST_F(EnclaveTest, BitFlippedRequestIsRefusedAndChangesNothing) {
  auto client = Client("alpha");
  Upload(*client, "cls");
  ForwardedRequest item = client->InferItem("cls", 0);
  for (size_t bit : {0ul, 1000ul, item.ciphertext().size() * 8 - 1}) {
    ForwardedRequest flipped = item;
    (*flipped.mutable_ciphertext())[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EnclaveToHost reply = InferBatch("alpha", client->Handle("cls"), {flipped});
    ASSERT_EQ(reply.status().code(), 0);
    EXPECT_NE(reply.infer_batch().replies(0).status().code(), 0) << "bit " << bit;
  }
  // Changing the request id or the sequence number breaks authentication too.
  ForwardedRequest other_id = item;
  other_id.set_request_id("someone-else");
  EXPECT_NE(InferBatch("alpha", client->Handle("cls"), {other_id}).infer_batch().replies(0).status().code(), 0);
  // The untouched message still opens: the failures changed no state.
  EnclaveToHost reply = InferBatch("alpha", client->Handle("cls"), {item});
  EXPECT_TRUE(client->OpenReply(crypto::MessageKind::kInfer, item, reply.infer_batch().replies(0)).ok());
}

TEST_F(EnclaveTest, TamperedOrTruncatedModelIsRefusedWithoutWrappedKey) {
  auto client = Client("alpha");
  // Bytes that fail authentication are DATA_LOSS, as for any sealed message; a ciphertext of
  // the wrong size for the declared model is refused before decryption as INVALID_ARGUMENT.
  struct Case {
    const char* what;
    std::function<void(Bytes&)> damage;
    absl::StatusCode code;
  };
  std::vector<Case> cases = {
      {"flipped chunk byte", [](Bytes& c) { c[crypto::kChunkedHeaderSize + 100] ^= 1; },
       absl::StatusCode::kDataLoss},
      {"flipped commitment", [](Bytes& c) { c[30] ^= 1; }, absl::StatusCode::kDataLoss},
      {"truncated", [](Bytes& c) { c.resize(c.size() - 5000); },
       absl::StatusCode::kInvalidArgument},
      {"last chunk dropped", [](Bytes& c) { c.resize(c.size() - (c.size() - 56) % 16400); },
       absl::StatusCode::kInvalidArgument},
  };
  for (const auto& test_case : cases) {
    HostToEnclave call = client->LoadCall("cls", model_bytes_, test_case.damage);
    EnclaveToHost reply = enclave_->Handle(call);
    ASSERT_EQ(reply.status().code(), 0) << test_case.what;
    EXPECT_TRUE(reply.load_model().wrapped_model_key().empty()) << test_case.what;
    absl::Status st = client->OpenReply(crypto::MessageKind::kLoadModel, call.load_model().request(),
                                        reply.load_model().reply());
    EXPECT_EQ(st.code(), test_case.code) << test_case.what << ": " << st;
  }
  // Nothing was loaded: the name is still free.
  Upload(*client, "cls");
}

TEST_F(EnclaveTest, AnotherIdentityCannotUseListOrDeleteTheModel) {
  auto owner = Client("alpha");
  auto intruder = Client("alpha");  // same tenant, another identity key
  Upload(*owner, "cls");
  // The intruder addresses the owner's model handle directly.
  ForwardedRequest item = intruder->InferItem("cls", 0);
  item = intruder->Seal(crypto::MessageKind::kInfer, owner->Handle("cls"), api::v1::InferRequestPayload());
  EnclaveToHost reply = InferBatch("alpha", owner->Handle("cls"), {item});
  absl::Status st = intruder->OpenReply(crypto::MessageKind::kInfer, item, reply.infer_batch().replies(0));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_EQ(st.message(), "model not found");

  api::v1::DeleteModelRequest del;
  del.set_name("cls");
  HostToEnclave call;
  call.mutable_delete_model()->set_tenant_id("alpha");
  *call.mutable_delete_model()->mutable_request() =
      intruder->Seal(crypto::MessageKind::kDeleteModel, "", del);
  EnclaveToHost deleted = enclave_->Handle(call);
  EXPECT_FALSE(deleted.delete_model().model_deleted());
  st = intruder->OpenReply(crypto::MessageKind::kDeleteModel, call.delete_model().request(),
                           deleted.delete_model().reply());
  EXPECT_EQ(st.message(), "model not found");

  HostToEnclave list;
  list.mutable_list_models()->set_tenant_id("alpha");
  *list.mutable_list_models()->mutable_request() =
      intruder->Seal(crypto::MessageKind::kListModels, "", api::v1::ListModelsRequest());
  EnclaveToHost listed = enclave_->Handle(list);
  std::string body;
  ASSERT_TRUE(intruder->OpenReply(crypto::MessageKind::kListModels, list.list_models().request(),
                                  listed.list_models().reply(), &body).ok());
  api::v1::ListModelsReply models;
  ASSERT_TRUE(models.ParseFromString(body));
  EXPECT_EQ(models.models_size(), 0);
}

TEST_F(EnclaveTest, StatsReportModelMemoryByHandleAndTheDeviceWhenThereIsOne) {
  HostToEnclave stats_call;
  stats_call.mutable_get_stats();
  EnclaveToHost empty = enclave_->Handle(stats_call);
  ASSERT_EQ(empty.status().code(), 0) << empty.status().message();
  ASSERT_TRUE(empty.has_get_stats());
  EXPECT_EQ(empty.get_stats().models_size(), 0);
  EXPECT_FALSE(empty.get_stats().has_device_memory());  // the CPU executor: no device

  auto alpha = Client("alpha");
  Upload(*alpha, "cls");
  auto beta = Client("beta");
  Upload(*beta, "other");
  EnclaveToHost two = enclave_->Handle(stats_call);
  ASSERT_EQ(two.status().code(), 0) << two.status().message();
  std::map<std::string, uint64_t> sizes;
  for (const auto& model : two.get_stats().models()) sizes[model.model_handle()] = model.size();
  EXPECT_EQ(sizes, (std::map<std::string, uint64_t>{{alpha->Handle("cls"), model_bytes_.size()},
                                                    {beta->Handle("other"), model_bytes_.size()}}));

  // Deleted models are no longer counted.
  api::v1::DeleteModelRequest del;
  del.set_name("cls");
  HostToEnclave delete_call;
  delete_call.mutable_delete_model()->set_tenant_id("alpha");
  *delete_call.mutable_delete_model()->mutable_request() =
      alpha->Seal(crypto::MessageKind::kDeleteModel, "", del);
  ASSERT_TRUE(enclave_->Handle(delete_call).delete_model().model_deleted());
  EnclaveToHost one = enclave_->Handle(stats_call);
  ASSERT_EQ(one.get_stats().models_size(), 1);
  EXPECT_EQ(one.get_stats().models(0).model_handle(), beta->Handle("other"));

  // With a device behind the executor, its memory; a device that cannot be read is an error.
  enclave_ = MakeEnclave(TestMeasurement("enclave under test"), [](enclave::EnclaveOptions& o) {
    o.device_memory = [] { return enclave::DeviceMemoryInfo{.total_size = 1000, .used_size = 300}; };
  });
  ASSERT_NE(enclave_, nullptr);
  EnclaveToHost device = enclave_->Handle(stats_call);
  ASSERT_EQ(device.status().code(), 0) << device.status().message();
  ASSERT_TRUE(device.get_stats().has_device_memory());
  EXPECT_EQ(device.get_stats().device_memory().total_size(), 1000u);
  EXPECT_EQ(device.get_stats().device_memory().used_size(), 300u);
  enclave_ = MakeEnclave(TestMeasurement("enclave under test"), [](enclave::EnclaveOptions& o) {
    o.device_memory = []() -> absl::StatusOr<enclave::DeviceMemoryInfo> {
      return absl::UnavailableError("no CUDA device");
    };
  });
  ASSERT_NE(enclave_, nullptr);
  EnclaveToHost broken = enclave_->Handle(stats_call);
  EXPECT_EQ(broken.status().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(broken.status().message(), "no CUDA device");
  EXPECT_FALSE(broken.has_get_stats());
}

TEST_F(EnclaveTest, HostCannotMixTenantsOrModelsInABatch) {
  auto alpha = Client("alpha");
  auto beta = Client("beta");
  Upload(*alpha, "cls");
  ForwardedRequest a = alpha->InferItem("cls", 0);
  ForwardedRequest b = beta->Seal(crypto::MessageKind::kInfer, alpha->Handle("cls"), api::v1::InferRequestPayload());
  EnclaveToHost mixed = InferBatch("alpha", alpha->Handle("cls"), {a, b});
  EXPECT_EQ(mixed.status().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(mixed.status().message().find("different tenants"), std::string::npos);
  EXPECT_EQ(mixed.infer_batch().replies_size(), 0);

  ForwardedRequest other_model = alpha->InferItem("other", 0);
  EnclaveToHost two_models = InferBatch("alpha", alpha->Handle("cls"), {a, other_model});
  EXPECT_EQ(two_models.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));

  // The host naming another tenant for a session is refused like an unknown session.
  EnclaveToHost wrong_tenant = InferBatch("beta", alpha->Handle("cls"), {a});
  EXPECT_EQ(wrong_tenant.status().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  // Refused whole: nothing crossed to the executor and no usage was counted.
  EXPECT_EQ(HostTransferStats().to_device_transfers, 0u);
  EXPECT_FALSE(wrong_tenant.infer_batch().has_receipt());
  // And the genuine request still runs (a is unused so far).
  EnclaveToHost ok = InferBatch("alpha", alpha->Handle("cls"), {a});
  EXPECT_TRUE(alpha->OpenReply(crypto::MessageKind::kInfer, a, ok.infer_batch().replies(0)).ok());
}

TEST_F(EnclaveTest, RestartedEnclaveReloadsOnlyWithTheSameMeasurement) {
  auto client = Client("alpha");
  boundary::v1::LoadModelResult loaded = Upload(*client, "cls");
  HostToEnclave reload;
  reload.mutable_reload_model()->set_model_handle(client->Handle("cls"));
  reload.mutable_reload_model()->set_wrapped_model_key(loaded.wrapped_model_key());
  reload.mutable_reload_model()->set_model_ciphertext(last_upload_.load_model().model_ciphertext());

  auto same = MakeEnclave(TestMeasurement("enclave under test"));
  EXPECT_EQ(same->Handle(reload).status().code(), 0);

  auto changed = MakeEnclave(TestMeasurement("a modified enclave"));
  EnclaveToHost refused = changed->Handle(reload);
  EXPECT_EQ(refused.status().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));

  // A wrapped key moved to another handle does not open either.
  HostToEnclave moved = reload;
  moved.mutable_reload_model()->set_model_handle(std::string(32, 'a'));
  EXPECT_NE(same->Handle(moved).status().code(), 0);
}

TEST_F(EnclaveTest, SessionOverStaleEvidenceOrWithBadSignatureIsRefused) {
  TestClient client(enclave_.get(), "alpha", policy_);
  // A hello sealed to the right key but for evidence the enclave never produced.
  auto setup = crypto::HpkeSetupSender(crypto::kSessionSuite, client.verdict().enclave_hpke_public_key,
                                       crypto::SessionHpkeInfo(Bytes(32, 7)));
  HostToEnclave call;
  call.mutable_open_session()->set_tenant_id("alpha");
  call.mutable_open_session()->set_hpke_enc(ToString(setup->enc));
  call.mutable_open_session()->set_sealed_hello("x");
  call.mutable_open_session()->set_evidence_digest(ToString(Bytes(32, 7)));
  EnclaveToHost reply = enclave_->Handle(call);
  EXPECT_EQ(reply.status().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  // Garbage where the hello should be, over the real evidence.
  call.mutable_open_session()->set_evidence_digest(ToString(client.verdict().evidence_digest));
  reply = enclave_->Handle(call);
  EXPECT_NE(reply.status().code(), 0);
  // An unparseable boundary call.
  EXPECT_NE(enclave_->Handle(HostToEnclave()).status().code(), 0);
}

TEST_F(EnclaveTest, EvidenceIsRefreshedAndOlderEvidenceStillOpensSessions) {
  TestClient before(enclave_.get(), "alpha", policy_, clock_.Now());
  clock_.Advance(absl::Hours(2));
  TestClient after(enclave_.get(), "alpha", policy_, clock_.Now());
  EXPECT_NE(before.verdict().evidence_digest, after.verdict().evidence_digest);
  EXPECT_TRUE(after.Open());
  EXPECT_TRUE(before.Open());  // a client that attested just before the refresh
}

// The three PCIe modes deliver the same, correct outputs, with one transfer each way per batch.
TEST_F(EnclaveTest, EveryPcieModeMovesTheBatchInOneTransferEachWay) {
  for (auto mode : {enclave::pcie::PcieMode::kOff, enclave::pcie::PcieMode::kDriver,
                    enclave::pcie::PcieMode::kEmulated}) {
    SCOPED_TRACE(std::string(enclave::pcie::PcieModeName(mode)));
    enclave_ = MakeEnclave(TestMeasurement("enclave under test"),
                           [mode](enclave::EnclaveOptions& options) {
                             options.pcie_mode = mode;
                             options.pcie_options.chunk_size = 64 << 10;  // several chunks
                             options.run_threads = 2;  // the two requests run side by side
                           });
    ASSERT_NE(enclave_, nullptr);
    auto client = Client("alpha");
    Upload(*client, "cls");
    std::vector<ForwardedRequest> items = {client->InferItem("cls", 0), client->InferItem("cls", 1)};
    EnclaveToHost reply = InferBatch("alpha", client->Handle("cls"), items);
    ASSERT_EQ(reply.status().code(), 0) << reply.status().message();
    for (int set = 0; set < 2; ++set) {
      std::string body;
      ASSERT_TRUE(client->OpenReply(crypto::MessageKind::kInfer, items[set],
                                    reply.infer_batch().replies(set), &body).ok());
      api::v1::InferReplyPayload payload;
      ASSERT_TRUE(payload.ParseFromString(body));
      auto expected = ReadTensorProtoFile(absl::StrCat(kClsData, "/test_data_set_", set, "/output_0.pb"));
      sdk::NpyArray actual{payload.outputs(0).datatype(),
                           {payload.outputs(0).shape().begin(), payload.outputs(0).shape().end()},
                           Bytes(payload.outputs(0).raw().begin(), payload.outputs(0).raw().end())};
      EXPECT_EQ(CompareArrays(actual, *expected), "") << "set " << set;
    }
    auto stats = HostTransferStats();
    EXPECT_EQ(stats.to_device_transfers, 1u);
    EXPECT_EQ(stats.to_host_transfers, 1u);
    EXPECT_EQ(stats.to_device_size, 2u * 3 * 48 * 192 * 4);  // both requests' inputs
    if (mode == enclave::pcie::PcieMode::kEmulated) {
      EXPECT_GE(stats.chunks_sealed, 5u);  // 221184 input bytes in 64 KiB chunks, plus outputs
    } else {
      EXPECT_EQ(stats.chunks_sealed, 0u);
    }
  }
}

// An executor registered with a batch path of its own, as enclave/gpu registers CUDA's: the CPU
// kernels under another name, and a path that counts what it carries over a host path.
class CountingPath final : public enclave::pcie::BatchPath {
 public:
  explicit CountingPath(std::unique_ptr<enclave::pcie::HostBatchPath> host)
      : host_(std::move(host)) {}
  enclave::pcie::PcieMode mode() const override { return host_->mode(); }
  int threads() const override { return host_->threads(); }
  bool executor_memory_on_device() const override { return false; }
  absl::StatusOr<enclave::pcie::PathBuffer> AcquireHostStaging(size_t size) override {
    return host_->AcquireHostStaging(size);
  }
  absl::StatusOr<enclave::pcie::PathBuffer> ToDevice(ByteSpan host) override {
    ++to_device;
    return host_->ToDevice(host);
  }
  absl::StatusOr<enclave::pcie::PathBuffer> GatherToDevice(
      size_t size, std::span<const enclave::pcie::GatherPiece> pieces) override {
    ++to_device;
    return host_->GatherToDevice(size, pieces);
  }
  absl::StatusOr<enclave::pcie::PathBuffer> AcquireDeviceStaging(size_t size) override {
    return host_->AcquireDeviceStaging(size);
  }
  absl::Status GatherOnDevice(const enclave::pcie::PathBuffer& staging,
                              std::span<const enclave::pcie::GatherPiece> pieces) override {
    return host_->GatherOnDevice(staging, pieces);
  }
  absl::StatusOr<enclave::pcie::PathBuffer> ToHost(
      const enclave::pcie::PathBuffer& device) override {
    ++to_host;
    return host_->ToHost(device);
  }

  static inline std::atomic<int> to_device = 0;
  static inline std::atomic<int> to_host = 0;

 private:
  std::unique_ptr<enclave::pcie::HostBatchPath> host_;
};

class ExecutorWithItsOwnPath final : public runtime::Executor {
 public:
  std::string_view name() const override { return "own-path-for-test"; }
  const runtime::KernelRegistry& kernels() const override {
    return runtime::CpuExecutor().kernels();
  }
};

const runtime::Executor* ExecutorWithItsOwnPathInstance() {
  static const ExecutorWithItsOwnPath* const executor = new ExecutorWithItsOwnPath();
  return executor;
}

// Registers it (once) the way an optional target does, and returns it.
const runtime::Executor* RegisterExecutorWithItsOwnPath() {
  static const bool registered = [] {
    runtime::RegisterExecutorProvider(
        std::string(ExecutorWithItsOwnPathInstance()->name()),
        [] { return absl::StatusOr<const runtime::Executor*>(ExecutorWithItsOwnPathInstance()); },
        [](enclave::pcie::PcieMode mode, const enclave::pcie::TransferOptions& options)
            -> absl::StatusOr<std::unique_ptr<enclave::pcie::BatchPath>> {
          ASSIGN_OR_RETURN(auto host, enclave::pcie::HostBatchPath::Create(mode, options));
          return std::unique_ptr<enclave::pcie::BatchPath>(new CountingPath(std::move(host)));
        });
    return true;
  }();
  (void)registered;
  return ExecutorWithItsOwnPathInstance();
}

// One registration serves the executor and its batches: the enclave finds the path registered
// with its executor and takes it, so it has no host transfer path of its own to report.
TEST_F(EnclaveTest, BatchesTakeThePathRegisteredWithTheirExecutor) {
  const runtime::Executor* executor = RegisterExecutorWithItsOwnPath();
  enclave_ = MakeEnclave(
      TestMeasurement("enclave under test"),
      [executor](enclave::EnclaveOptions& options) { options.load_options.executor = executor; });
  ASSERT_NE(enclave_, nullptr);
  auto path = enclave_->transfer_path();
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition) << path.status();
  EXPECT_NE(path.status().message().find("no host transfer path"), std::string::npos)
      << path.status();

  auto client = Client("alpha");
  Upload(*client, "cls");
  const int to_device = CountingPath::to_device, to_host = CountingPath::to_host;
  ForwardedRequest item = client->InferItem("cls", 0);
  EnclaveToHost reply = InferBatch("alpha", client->Handle("cls"), {item});
  ASSERT_EQ(reply.status().code(), 0) << reply.status().message();
  EXPECT_TRUE(
      client->OpenReply(crypto::MessageKind::kInfer, item, reply.infer_batch().replies(0)).ok());
  EXPECT_EQ(CountingPath::to_device - to_device, 1);
  EXPECT_EQ(CountingPath::to_host - to_host, 1);
}

TEST_F(EnclaveTest, RunThreadsOutOfRangeAreRefused) {
  for (int threads : {0, 65}) {
    enclave::EnclaveOptions options;
    options.sim_dir = dir_ + "/sim";
    options.measurement = TestMeasurement("enclave under test");
    options.run_threads = threads;
    auto made = enclave::Enclave::Create(std::move(options));
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.status().message(),
              absl::StrCat("run threads must be from 1 to 64, not ", threads));
  }
}

// The host flips one ciphertext byte of a batch on its way to the executor: the batch is
// refused whole, nothing runs, and no usage is counted.
TEST_F(EnclaveTest, FlippedByteOnTheEmulatedPcieBusRefusesTheBatch) {
  auto flips = std::make_shared<int>(0);
  auto armed = std::make_shared<bool>(false);
  enclave_ = MakeEnclave(TestMeasurement("enclave under test"),
                         [flips, armed](enclave::EnclaveOptions& options) {
                           options.pcie_mode = enclave::pcie::PcieMode::kEmulated;
                           options.pcie_options.in_flight_hook_for_test =
                               [flips, armed](std::span<uint8_t> bounce) {
                                 if (!*armed) return;
                                 *armed = false;
                                 bounce[bounce.size() / 2] ^= 0x04;
                                 ++*flips;
                               };
                         });
  auto client = Client("alpha");
  Upload(*client, "cls");
  *armed = true;
  EnclaveToHost refused = InferBatch("alpha", client->Handle("cls"),
                                     {client->InferItem("cls", 0), client->InferItem("cls", 1)});
  EXPECT_EQ(*flips, 1);
  EXPECT_EQ(refused.status().code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_NE(refused.status().message().find("failed authentication"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(refused.infer_batch().replies_size(), 0);
  auto stats = HostTransferStats();
  EXPECT_EQ(stats.authentication_failures, 1u);
  EXPECT_EQ(stats.to_device_transfers, 0u);
  EXPECT_EQ(stats.to_host_transfers, 0u);  // no outputs: the model never ran

  // The path is intact for the next batch, whose receipt is the enclave's first.
  ForwardedRequest item = client->InferItem("cls", 0);
  EnclaveToHost ok = InferBatch("alpha", client->Handle("cls"), {item});
  ASSERT_EQ(ok.status().code(), 0) << ok.status().message();
  EXPECT_TRUE(client->OpenReply(crypto::MessageKind::kInfer, item, ok.infer_batch().replies(0)).ok());
  auto receipt = host::VerifyUsageReceipt(enclave_->signing_public_key(), ok.infer_batch().receipt());
  ASSERT_TRUE(receipt.ok()) << receipt.status();
  EXPECT_EQ(receipt->sequence(), 1u);
  EXPECT_EQ(receipt->cumulative().requests(), 1u);
  EXPECT_EQ(receipt->pcie_mode(), "emulated");
}

// Every batch returns a receipt signed with the key of the enclave's evidence; a tampered one
// fails; the cumulative counters add up to exactly what each tenant sent and received.
TEST_F(EnclaveTest, UsageReceiptsVerifyAndAddUpToTheRequestsSent) {
  auto alpha = Client("alpha");
  auto beta = Client("beta");
  Upload(*alpha, "cls");
  Upload(*beta, "cls");
  EXPECT_EQ(alpha->verdict().enclave_signing_public_key, enclave_->signing_public_key());
  const Bytes key = alpha->verdict().enclave_signing_public_key;
  struct Sent {
    uint64_t batches = 0, requests = 0, failed = 0, input_size = 0, output_size = 0;
  };
  std::map<std::string, Sent> sent;
  uint64_t last_sequence = 0;
  auto run = [&](TestClient& client, std::vector<ForwardedRequest> items, int malformed) {
    EnclaveToHost reply = InferBatch(client.tenant(), client.Handle("cls"), items);
    ASSERT_EQ(reply.status().code(), 0) << reply.status().message();
    Sent& s = sent[client.tenant()];
    ++s.batches;
    const uint64_t failed_before = s.failed;
    for (size_t i = 0; i < items.size(); ++i) {
      std::string body;
      absl::Status st = client.OpenReply(crypto::MessageKind::kInfer, items[i],
                                         reply.infer_batch().replies(i), &body);
      if (!st.ok()) {
        ++s.failed;
        continue;
      }
      ++s.requests;
      s.input_size += 3 * 48 * 192 * 4;
      api::v1::InferReplyPayload payload;
      ASSERT_TRUE(payload.ParseFromString(body));
      for (const auto& output : payload.outputs()) s.output_size += output.raw().size();
    }
    EXPECT_EQ(s.failed - failed_before, static_cast<uint64_t>(malformed));
    auto receipt = host::VerifyUsageReceipt(key, reply.infer_batch().receipt());
    ASSERT_TRUE(receipt.ok()) << receipt.status();
    EXPECT_EQ(receipt->sequence(), ++last_sequence);
    EXPECT_EQ(receipt->tenant_id(), client.tenant());
    EXPECT_EQ(receipt->model_handle(), client.Handle("cls"));
    EXPECT_EQ(receipt->pcie_mode(), "off");
    EXPECT_EQ(receipt->batch().requests() + receipt->batch().failed_requests(), items.size());
    EXPECT_EQ(receipt->cumulative().batches(), s.batches);
    EXPECT_EQ(receipt->cumulative().requests(), s.requests);
    EXPECT_EQ(receipt->cumulative().failed_requests(), s.failed);
    EXPECT_EQ(receipt->cumulative().input_size(), s.input_size);
    EXPECT_EQ(receipt->cumulative().output_size(), s.output_size);
    EXPECT_GT(receipt->cumulative().execution_ns(), 0u);

    // The host cannot alter a receipt: any flipped byte, or the signature of another key, fails.
    boundary::v1::SignedUsageReceipt tampered = reply.infer_batch().receipt();
    (*tampered.mutable_receipt())[tampered.receipt().size() / 2] ^= 0x01;
    EXPECT_EQ(host::VerifyUsageReceipt(key, tampered).status().code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_FALSE(host::VerifyUsageReceipt(crypto::GenerateEd25519().public_key,
                                          reply.infer_batch().receipt()).ok());
  };
  run(*alpha, {alpha->InferItem("cls", 0), alpha->InferItem("cls", 1)}, 0);
  run(*beta, {beta->InferItem("cls", 0)}, 0);
  // A malformed request counts as failed, not as run.
  ForwardedRequest malformed = alpha->Seal(crypto::MessageKind::kInfer, alpha->Handle("cls"),
                                     api::v1::InferRequestPayload());
  run(*alpha, {alpha->InferItem("cls", 0), malformed}, 1);
  run(*beta, {beta->InferItem("cls", 1), beta->InferItem("cls", 0)}, 0);
  EXPECT_EQ(sent["alpha"].requests, 3u);
  EXPECT_EQ(sent["alpha"].failed, 1u);
  EXPECT_EQ(sent["beta"].requests, 3u);
}

}  // namespace
}  // namespace cloister::testing

namespace cloister::testing {
namespace {

// The enclave signs audit checkpoints with its evidence key; the host's audit log and its
// verifier accept exactly those signatures (host/audit/audit_log.h).
TEST_F(EnclaveTest, EnclaveSignsAuditCheckpointsTheVerifierAccepts) {
  std::string path = dir_ + "/audit/audit.jsonl";
  auto log = host::AuditLog::Open(path, &clock_);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Record(host::audit_event::kSessionOpened, "alpha").ok());
  ASSERT_TRUE((*log)->Record(host::audit_event::kModelUploaded, "alpha", {{"handle", "h"}}).ok());
  auto signer = [this](ByteSpan digest,
                       uint64_t sequence) -> absl::StatusOr<boundary::v1::SignedAuditCheckpoint> {
    HostToEnclave call;
    call.mutable_sign_audit_checkpoint()->set_chain_digest(ToString(digest));
    call.mutable_sign_audit_checkpoint()->set_sequence(sequence);
    EnclaveToHost reply = enclave_->Handle(call);
    if (reply.status().code() != 0) return absl::InternalError(reply.status().message());
    return reply.sign_audit_checkpoint().signed_();
  };
  ASSERT_TRUE((*log)->Checkpoint(signer).ok());
  auto report = host::VerifyAuditLog(path, {enclave_->signing_public_key()});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->signed_entries, 2u);
  ASSERT_EQ(report->checkpoints.size(), 1u);
  EXPECT_EQ(report->checkpoints[0].signed_at, clock_.Now());

  // Bad input from the host gets an error and no signature.
  HostToEnclave short_digest;
  short_digest.mutable_sign_audit_checkpoint()->set_chain_digest("too short");
  short_digest.mutable_sign_audit_checkpoint()->set_sequence(1);
  EnclaveToHost refused = enclave_->Handle(short_digest);
  EXPECT_EQ(refused.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(refused.has_sign_audit_checkpoint());
  HostToEnclave zero_sequence;
  zero_sequence.mutable_sign_audit_checkpoint()->set_chain_digest(std::string(32, 'd'));
  EXPECT_EQ(enclave_->Handle(zero_sequence).status().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace cloister::testing

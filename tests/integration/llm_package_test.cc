// An LLM checkpoint folder uploaded end to end through the in-process enclave, as cloisterd
// relays it: the SDK packs the shared tiny model folder, the enclave reads the package with the
// strict reader, loads it with the LLM engine, reports its kind and digest (SHA-256 of the
// package), lists it, and refuses Infer on it. Refused, changing nothing: a package whose
// safetensors header lies, one whose tar header lies, and weights over the memory budget.
#include <string>

#include "absl/strings/str_cat.h"
#include "attest/policy.h"
#include "base/clock.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "enclave/enclave.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/model_package.h"
#include "sdk/model_dir.h"
#include "tests/support/enclave_tenant.h"
#include "tests/support/temp_dir.h"

namespace cloister::testing {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using ::testing::HasSubstr;

const std::string kTinyLlama = std::string(CLOISTER_SHARED_DIR) + "/models/llm/tiny-llama";
constexpr uint64_t kMaxPackage = uint64_t{256} << 20;

class LlmPackageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("cloister-llm-package-test");
    enclave::EnclaveOptions options;
    options.sim_dir = dir_ + "/sim";
    options.dev_policy_out = dir_ + "/dev-policy.yaml";
    options.measurement = crypto::Sha384(AsBytes("llm package test"));
    options.clock = &clock_;
    auto made = enclave::Enclave::Create(std::move(options));
    ASSERT_TRUE(made.ok()) << made.status();
    enclave_ = *std::move(made);
    auto policy = attest::LoadPolicyFile(dir_ + "/dev-policy.yaml");
    ASSERT_TRUE(policy.ok()) << policy.status();
    tenant_ = std::make_unique<EnclaveTenant>(enclave_.get(), "alpha", *policy);
    ASSERT_TRUE(tenant_->attestation().ok()) << tenant_->attestation();
    ASSERT_TRUE(tenant_->Open().ok());
    auto package = sdk::PackModelDir(kTinyLlama, kMaxPackage);
    ASSERT_TRUE(package.ok()) << package.status();
    package_ = ToString(*package);
  }

  // Uploads `bytes` as `name` with `budget` bytes of quota left; the enclave's sealed answer
  // (its status and, when loaded, the model) and whether the host got a wrapped key to store.
  struct Uploaded {
    absl::Status status;
    api::v1::ModelInfo model;
    bool stored = false;
  };
  Uploaded Upload(const std::string& name, const std::string& bytes, uint64_t budget = 0) {
    HostToEnclave call = tenant_->LoadCall(name, bytes);
    call.mutable_load_model()->set_model_memory_budget(budget);
    EnclaveToHost reply = enclave_->Handle(call);
    EXPECT_EQ(reply.status().code(), 0) << reply.status().message();
    Uploaded uploaded;
    std::string body;
    uploaded.status =
        tenant_->OpenReply(crypto::MessageKind::kLoadModel, call.load_model().request(),
                           reply.load_model().reply(), &body);
    api::v1::LoadModelReply loaded;
    if (uploaded.status.ok() && loaded.ParseFromString(body)) uploaded.model = loaded.model();
    uploaded.stored = !reply.load_model().wrapped_model_key().empty();
    EXPECT_EQ(uploaded.stored, uploaded.status.ok()) << uploaded.status;
    return uploaded;
  }

  std::vector<api::v1::ModelInfo> List() {
    HostToEnclave call;
    call.mutable_list_models()->set_tenant_id("alpha");
    *call.mutable_list_models()->mutable_request() =
        tenant_->Seal(crypto::MessageKind::kListModels, "", api::v1::ListModelsRequest());
    EnclaveToHost reply = enclave_->Handle(call);
    std::string body;
    absl::Status opened =
        tenant_->OpenReply(crypto::MessageKind::kListModels, call.list_models().request(),
                           reply.list_models().reply(), &body);
    EXPECT_TRUE(opened.ok()) << opened;
    api::v1::ListModelsReply models;
    EXPECT_TRUE(models.ParseFromString(body));
    return {models.models().begin(), models.models().end()};
  }

  // The list as text, to compare before and after a refusal.
  std::string ListText() {
    std::string text;
    for (const auto& model : List()) absl::StrAppend(&text, model.ShortDebugString(), "\n");
    return text;
  }

  // The shared package with its model.safetensors changed by `edit`, packed again.
  std::string PackageWithWeights(const std::function<void(std::string&)>& edit) {
    auto members = package::ReadModelPackage(AsBytes(package_));
    EXPECT_TRUE(members.ok()) << members.status();
    std::string weights = ToString(members->at("model.safetensors"));
    edit(weights);
    (*members)["model.safetensors"] = AsBytes(weights);
    auto packed = package::PackModel(*members);
    EXPECT_TRUE(packed.ok()) << packed.status();
    return ToString(*packed);
  }

  FakeClock clock_{absl::Now()};
  std::string dir_;
  std::unique_ptr<enclave::Enclave> enclave_;
  std::unique_ptr<EnclaveTenant> tenant_;
  std::string package_;
};

TEST_F(LlmPackageTest, UploadsListsAndRefusesInfer) {
  ASSERT_TRUE(package::IsModelPackage(AsBytes(package_)));
  Uploaded uploaded = Upload("tiny", package_);
  ASSERT_TRUE(uploaded.status.ok()) << uploaded.status;
  const std::string digest = HexEncode(crypto::Sha256(AsBytes(package_)));
  EXPECT_EQ(uploaded.model.name(), "tiny");
  EXPECT_EQ(uploaded.model.kind(), api::v1::MODEL_KIND_LLM);
  EXPECT_EQ(uploaded.model.digest(), digest);
  EXPECT_EQ(uploaded.model.size(), package_.size());
  EXPECT_EQ(uploaded.model.inputs_size(), 0);

  std::vector<api::v1::ModelInfo> models = List();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].name(), "tiny");
  EXPECT_EQ(models[0].kind(), api::v1::MODEL_KIND_LLM);
  EXPECT_EQ(models[0].digest(), digest);

  // Infer on it: refused, with the reason sealed to the tenant.
  api::v1::InferRequestPayload payload;
  api::v1::Tensor* input = payload.add_inputs();
  input->set_name("x");
  input->set_datatype("INT32");
  input->add_shape(1);
  input->set_raw(std::string(4, '\0'));
  boundary::v1::ForwardedRequest item =
      tenant_->Seal(crypto::MessageKind::kInfer, tenant_->Handle("tiny"), payload);
  HostToEnclave call;
  call.mutable_infer_batch()->set_tenant_id("alpha");
  call.mutable_infer_batch()->set_model_handle(tenant_->Handle("tiny"));
  *call.mutable_infer_batch()->add_items() = item;
  EnclaveToHost reply = enclave_->Handle(call);
  ASSERT_EQ(reply.infer_batch().replies_size(), 1);
  absl::Status refused =
      tenant_->OpenReply(crypto::MessageKind::kInfer, item, reply.infer_batch().replies(0));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), "model 'tiny' is a generative model: use Generate");
}

TEST_F(LlmPackageTest, APackageWhoseSafetensorsHeaderLiesIsRefusedAndChangesNothing) {
  ASSERT_TRUE(Upload("tiny", package_).status.ok());
  const std::string before = ListText();
  // lm_head.weight claims bytes up to 9048576, past the end of the file's ~8.1 MB of data.
  std::string liar = PackageWithWeights([](std::string& weights) {
    const std::string honest = "\"data_offsets\":[0,1048576]";
    size_t at = weights.find(honest);
    ASSERT_NE(at, std::string::npos);
    weights.replace(at, honest.size(), "\"data_offsets\":[0,9048576]");
  });
  Uploaded refused = Upload("liar", liar);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_THAT(refused.status.message(), HasSubstr("model refused: "));
  EXPECT_THAT(refused.status.message(), HasSubstr("lm_head.weight"));
  EXPECT_FALSE(refused.stored);
  EXPECT_EQ(ListText(), before);
  // The same lie under the name of the loaded model changes nothing either.
  EXPECT_FALSE(Upload("tiny", liar).stored);
  EXPECT_EQ(ListText(), before);
}

TEST_F(LlmPackageTest, APackageWhoseArchiveHeaderLiesIsRefused) {
  // config.json's header claims more bytes than the package holds (checksum kept valid).
  std::string liar = package_;
  liar.replace(124, 11, "77777777777");
  std::fill(liar.begin() + 148, liar.begin() + 156, ' ');
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += static_cast<uint8_t>(liar[i]);
  char checksum[8];
  std::snprintf(checksum, sizeof(checksum), "%06o", sum);
  liar.replace(148, 7, std::string(checksum, 6) + '\0');
  Uploaded refused = Upload("liar", liar);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status.message(),
              HasSubstr("model package: member 0 'config.json': size of 8589934591 bytes runs "
                        "past the end"));
  EXPECT_TRUE(List().empty());
  // A package with a member that is not a checkpoint file (a symbolic link entry).
  std::string link = package_;
  link[156] = '2';
  Uploaded linked = Upload("link", link);
  EXPECT_THAT(linked.status.message(), HasSubstr("header checksum mismatch"));
  EXPECT_TRUE(List().empty());
}

TEST_F(LlmPackageTest, WeightsOverTheMemoryBudgetAreRefused) {
  // The weights need about 8 MB: a budget of 1 MiB is not enough, the package size is.
  Uploaded refused = Upload("tiny", package_, uint64_t{1} << 20);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted) << refused.status;
  EXPECT_THAT(refused.status.message(), HasSubstr("over the limit of 1048576"));
  EXPECT_TRUE(List().empty());
  Uploaded loaded = Upload("tiny", package_, package_.size());
  EXPECT_TRUE(loaded.status.ok()) << loaded.status;
}

TEST_F(LlmPackageTest, OnnxModelsGetTheirKindAndDigestToo) {
  std::string onnx =
      std::string(CLOISTER_SHARED_DIR) + "/models/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
  auto bytes = ReadFile(onnx);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_FALSE(package::IsModelPackage(AsBytes(*bytes)));
  Uploaded uploaded = Upload("cls", *bytes);
  ASSERT_TRUE(uploaded.status.ok()) << uploaded.status;
  EXPECT_EQ(uploaded.model.kind(), api::v1::MODEL_KIND_ONNX);
  EXPECT_EQ(uploaded.model.digest(), HexEncode(crypto::Sha256(AsBytes(*bytes))));
}

}  // namespace
}  // namespace cloister::testing

// Huge declared sizes at the enclave itself: sealed requests whose tensors declare shapes that
// would need terabytes (or overflow 64 bits), and a sealed load request that declares a 1 TiB
// model, are refused from the declaration alone, and the enclave's memory does not grow. The
// SDK refuses such tensors before sealing them, so a hostile client is modelled here by a
// session built directly from the channel crypto; the enclave runs in this process, whose
// VmRSS and VmHWM are the enclave's.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "base/clock.h"
#include "base/file.h"
#include "crypto/channel.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/hpke.h"
#include "crypto/keys.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "enclave/enclave.h"
#include "gtest/gtest.h"
#include "tests/resources/process_memory.h"
#include "tests/support/process.h"
#include "tests/support/tensor_files.h"

namespace cloister::testing {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using boundary::v1::ForwardedRequest;

const std::string kClsModel =
    std::string(CLOISTER_SHARED_DIR) + "/models/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx";
const std::string kClsInput =
    std::string(CLOISTER_SHARED_DIR) +
    "/models/testdata/ch_ppocr_mobile_v2.0_cls/test_data_set_0/input_0.pb";

// A tenant that attests the in-process enclave, opens a session and seals whatever it likes.
class HostileTenant {
 public:
  HostileTenant(enclave::Enclave& enclave, const attest::v1::Policy& policy)
      : enclave_(enclave), identity_(crypto::GenerateEd25519()) {
    Bytes nonce = crypto::RandomBytes(32);
    HostToEnclave call;
    call.mutable_get_evidence()->set_nonce(ToString(nonce));
    EnclaveToHost reply = enclave_.Handle(call);
    attest::v1::ChallengeResponse challenge;
    if (reply.status().code() != 0 ||
        !challenge.ParseFromString(reply.get_evidence().challenge_response())) {
      error_ = "no evidence";
      return;
    }
    auto verdict = attest::VerifyChallenge(challenge, nonce, policy, absl::Now());
    if (!verdict.ok() || !verdict->pass) {
      error_ = "attestation failed";
      return;
    }
    error_ = OpenSession(*verdict);
  }

  const std::string& error() const { return error_; }
  std::string Handle(const std::string& name) const {
    return crypto::ModelHandle(identity_.public_key, name);
  }

  ForwardedRequest Seal(crypto::MessageKind kind, const std::string& handle,
                  const google::protobuf::Message& body) {
    return SealBytes(kind, handle, AsBytes(body.SerializeAsString()));
  }
  // Seals `plaintext` as it is, a message or not.
  ForwardedRequest SealBytes(crypto::MessageKind kind, const std::string& handle,
                             ByteSpan plaintext) {
    std::string request_id = HexEncode(crypto::RandomBytes(8));
    auto sealed = sender_->Seal({kind, request_id, handle}, plaintext);
    ForwardedRequest item;
    item.set_session_id(ToString(session_id_));
    item.set_request_id(request_id);
    item.set_model_handle(handle);
    item.set_sequence(sealed->first);
    item.set_ciphertext(ToString(sealed->second));
    return item;
  }

  // The status inside the enclave's sealed reply to `request` (or its host-visible one).
  absl::Status ReplyStatus(crypto::MessageKind kind, const ForwardedRequest& request,
                           const boundary::v1::EnclaveReply& reply) {
    if (reply.status().code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(reply.status().code()),
                          reply.status().message());
    }
    auto plaintext =
        receiver_->Open(reply.sequence(), {kind, request.request_id(), request.model_handle()},
                        AsBytes(reply.ciphertext()));
    if (!plaintext.ok()) return plaintext.status();
    api::v1::ReplyEnvelope envelope;
    if (!envelope.ParseFromArray(plaintext->data(), static_cast<int>(plaintext->size()))) {
      return absl::DataLossError("reply envelope does not parse");
    }
    return absl::Status(static_cast<absl::StatusCode>(envelope.code()), envelope.message());
  }

  // A load call for `model` that declares `declared_size` plaintext bytes.
  HostToEnclave LoadCall(const std::string& name, const std::string& model,
                         uint64_t declared_size) {
    const std::string handle = Handle(name);
    SecretBytes key = crypto::RandomSecret(32);
    auto ciphertext =
        crypto::ChunkedEncrypt(key.span(), crypto::ModelEncryptionContext(handle), AsBytes(model));
    api::v1::LoadModelRequest request;
    request.set_name(name);
    request.set_model_key(ToString(key.span()));
    request.set_plaintext_sha256(ToString(crypto::Sha256(AsBytes(model))));
    request.set_plaintext_size(declared_size);
    HostToEnclave call;
    call.mutable_load_model()->set_tenant_id(kTenant);
    *call.mutable_load_model()->mutable_request() =
        Seal(crypto::MessageKind::kLoadModel, handle, request);
    call.mutable_load_model()->set_model_ciphertext(ciphertext.ok() ? ToString(*ciphertext) : "");
    return call;
  }

  static constexpr char kTenant[] = "mallory";

 private:
  // "" on success.
  std::string OpenSession(const attest::Verdict& verdict) {
    auto setup = crypto::HpkeSetupSender(crypto::kSessionSuite, verdict.enclave_hpke_public_key,
                                         crypto::SessionHpkeInfo(verdict.evidence_digest));
    if (!setup.ok()) return setup.status().ToString();
    Bytes client_nonce = crypto::RandomBytes(32);
    Bytes transcript =
        crypto::SessionTranscript(verdict.evidence_digest, verdict.enclave_hpke_public_key,
                                  verdict.enclave_signing_public_key, identity_.public_key,
                                  setup->enc, client_nonce, kTenant);
    api::v1::SessionHello hello;
    hello.set_tenant_id(kTenant);
    hello.set_identity_public_key(ToString(identity_.public_key));
    hello.set_client_nonce(ToString(client_nonce));
    hello.set_transcript_signature(
        ToString(*crypto::Ed25519Sign(identity_.seed.span(), transcript)));
    auto sealed_hello = setup->context->Seal(AsBytes(kTenant), AsBytes(hello.SerializeAsString()));
    if (!sealed_hello.ok()) return sealed_hello.status().ToString();
    HostToEnclave call;
    call.mutable_open_session()->set_tenant_id(kTenant);
    call.mutable_open_session()->set_hpke_enc(ToString(setup->enc));
    call.mutable_open_session()->set_sealed_hello(ToString(*sealed_hello));
    call.mutable_open_session()->set_evidence_digest(ToString(verdict.evidence_digest));
    EnclaveToHost reply = enclave_.Handle(call);
    if (reply.status().code() != 0) return reply.status().message();
    auto keys = crypto::DeriveChannelKeys(*setup->context);
    if (!keys.ok()) return keys.status().ToString();
    session_id_ = keys->session_id;
    sender_ = std::make_unique<crypto::ChannelSender>(
        session_id_, crypto::Direction::kClientToEnclave, keys->client_to_enclave_key.span(),
        keys->client_to_enclave_nonce.span());
    receiver_ = std::make_unique<crypto::ChannelReceiver>(
        session_id_, crypto::Direction::kEnclaveToClient, keys->enclave_to_client_key.span(),
        keys->enclave_to_client_nonce.span());
    auto welcome =
        receiver_->Open(reply.open_session().sequence(), {crypto::MessageKind::kWelcome, "", ""},
                        AsBytes(reply.open_session().sealed_welcome()));
    return welcome.ok() ? "" : welcome.status().ToString();
  }

  enclave::Enclave& enclave_;
  crypto::Ed25519KeyPair identity_;
  std::string error_;
  Bytes session_id_;
  std::unique_ptr<crypto::ChannelSender> sender_;
  std::unique_ptr<crypto::ChannelReceiver> receiver_;
};

class EnclaveLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("cloister-enclave-limits");
    enclave::EnclaveOptions options;
    options.sim_dir = dir_ + "/sim";
    options.dev_policy_out = dir_ + "/dev-policy.yaml";
    options.measurement = crypto::Sha384(AsBytes("enclave limits test"));
    auto enclave = enclave::Enclave::Create(std::move(options));
    ASSERT_TRUE(enclave.ok()) << enclave.status();
    enclave_ = *std::move(enclave);
    auto policy = attest::LoadPolicyFile(dir_ + "/dev-policy.yaml");
    ASSERT_TRUE(policy.ok()) << policy.status();
    tenant_ = std::make_unique<HostileTenant>(*enclave_, *policy);
    ASSERT_EQ(tenant_->error(), "");
    auto model = ReadFile(kClsModel);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  static ProcessMemory Memory() {
    auto memory = ReadProcessMemory(::getpid());
    EXPECT_TRUE(memory.ok()) << memory.status();
    return memory.ok() ? *memory : ProcessMemory();
  }

  std::string dir_;
  std::unique_ptr<enclave::Enclave> enclave_;
  std::unique_ptr<HostileTenant> tenant_;
  std::string model_;
};

// Each refusal comes from the shape alone: VmHWM (the most this process was ever resident)
// does not move. (Measured: +0.0 MiB. Bound 16 MiB; the first shape allocated would be 2^40
// floats, the third's 110592 bytes are too few to see, so its check is the message.)
TEST_F(EnclaveLimitsTest, TensorsDeclaringHugeShapesAreRefusedBeforeAllocation) {
  HostToEnclave load = tenant_->LoadCall("cls", model_, model_.size());
  EnclaveToHost loaded = enclave_->Handle(load);
  ASSERT_EQ(loaded.status().code(), 0) << loaded.status().message();
  ASSERT_TRUE(tenant_
                  ->ReplyStatus(crypto::MessageKind::kLoadModel, load.load_model().request(),
                                loaded.load_model().reply())
                  .ok());
  auto input = ReadTensorProtoFile(kClsInput);
  ASSERT_TRUE(input.ok()) << input.status();

  struct Case {
    std::vector<int64_t> shape;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{int64_t{1} << 40, 3, 48, 192}, "input 'x': shape too large"},
      {{int64_t{1} << 62, int64_t{1} << 62}, "input 'x': shape too large"},
      {{1, 3, 48, 192}, "input 'x': shape needs 110592 bytes but 4 were sent"},
  };
  const ProcessMemory before = Memory();
  for (int round = 0; round < 5; ++round) {
    for (const Case& c : cases) {
      api::v1::InferRequestPayload payload;
      api::v1::Tensor* tensor = payload.add_inputs();
      tensor->set_name("x");
      tensor->set_datatype(input->datatype);
      for (int64_t dimension : c.shape) tensor->add_shape(dimension);
      tensor->set_raw(std::string(4, '\0'));
      ForwardedRequest item = tenant_->Seal(crypto::MessageKind::kInfer, tenant_->Handle("cls"), payload);
      HostToEnclave call;
      call.mutable_infer_batch()->set_tenant_id(HostileTenant::kTenant);
      call.mutable_infer_batch()->set_model_handle(tenant_->Handle("cls"));
      *call.mutable_infer_batch()->add_items() = item;
      EnclaveToHost reply = enclave_->Handle(call);
      ASSERT_EQ(reply.status().code(), 0) << reply.status().message();
      ASSERT_EQ(reply.infer_batch().replies_size(), 1);
      absl::Status status =
          tenant_->ReplyStatus(crypto::MessageKind::kInfer, item, reply.infer_batch().replies(0));
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_EQ(status.message(), c.message);
    }
  }
  const ProcessMemory after = Memory();
  std::cout << "[memory] enclave (this process) VmRSS " << Mebibytes(before.rss_size) << " -> "
            << Mebibytes(after.rss_size) << ", VmHWM " << Mebibytes(before.peak_rss_size) << " -> "
            << Mebibytes(after.peak_rss_size) << "\n";
  EXPECT_LT(after.peak_rss_size, before.peak_rss_size + GrowthBound(16));
}

// Sealed requests whose plaintext is not an InferRequestPayload (a length past the end, a
// tensor cut short, a name that is not UTF-8) are refused with one sealed line, and a valid
// request beside them in the same batch still runs.
TEST_F(EnclaveLimitsTest, MalformedInferenceRequestsAreRefusedAndTheirNeighboursRun) {
  HostToEnclave load = tenant_->LoadCall("cls", model_, model_.size());
  EnclaveToHost loaded = enclave_->Handle(load);
  ASSERT_EQ(loaded.status().code(), 0) << loaded.status().message();
  ASSERT_TRUE(tenant_
                  ->ReplyStatus(crypto::MessageKind::kLoadModel, load.load_model().request(),
                                loaded.load_model().reply())
                  .ok());
  auto input = ReadTensorProtoFile(kClsInput);
  ASSERT_TRUE(input.ok()) << input.status();
  api::v1::InferRequestPayload valid;
  api::v1::Tensor* tensor = valid.add_inputs();
  tensor->set_name("x");
  tensor->set_datatype(input->datatype);
  for (int64_t dimension : input->shape) tensor->add_shape(dimension);
  tensor->set_raw(std::string(input->data.begin(), input->data.end()));
  const std::string whole = valid.SerializeAsString();
  const std::vector<std::string> malformed = {
      std::string("\x0a\x7f", 2) + "x",          // inputs: a length past the end
      whole.substr(0, whole.size() / 2),          // the tensor cut short
      std::string("\x0a\x04\x0a\x02\xff\xfe", 6),  // a name that is not UTF-8
  };
  HostToEnclave call;
  call.mutable_infer_batch()->set_tenant_id(HostileTenant::kTenant);
  call.mutable_infer_batch()->set_model_handle(tenant_->Handle("cls"));
  std::vector<ForwardedRequest> items;
  for (const std::string& bytes : malformed) {
    items.push_back(
        tenant_->SealBytes(crypto::MessageKind::kInfer, tenant_->Handle("cls"), AsBytes(bytes)));
  }
  items.push_back(tenant_->Seal(crypto::MessageKind::kInfer, tenant_->Handle("cls"), valid));
  for (const ForwardedRequest& item : items) *call.mutable_infer_batch()->add_items() = item;
  EnclaveToHost reply = enclave_->Handle(call);
  ASSERT_EQ(reply.status().code(), 0) << reply.status().message();
  ASSERT_EQ(reply.infer_batch().replies_size(), static_cast<int>(items.size()));
  for (size_t i = 0; i < malformed.size(); ++i) {
    absl::Status status =
        tenant_->ReplyStatus(crypto::MessageKind::kInfer, items[i], reply.infer_batch().replies(i));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << i << ": " << status;
    EXPECT_EQ(status.message(), "malformed inference request") << i;
  }
  absl::Status ran = tenant_->ReplyStatus(crypto::MessageKind::kInfer, items.back(),
                                          reply.infer_batch().replies(malformed.size()));
  EXPECT_TRUE(ran.ok()) << ran;
}

// A sealed load request declaring a 1 TiB model, and one declaring 256 MiB for a 0.5 MiB
// upload, are refused before the plaintext buffer (of the declared size) is allocated, and the
// enclave hands back no wrapped key. (Measured: VmHWM +0.0 MiB. Bound 64 MiB; allocating the
// second declaration alone would pass it: SecretBytes locks and touches its pages.)
TEST_F(EnclaveLimitsTest, LoadRequestDeclaringAHugeModelIsRefusedBeforeAllocation) {
  const ProcessMemory before = Memory();
  struct Case {
    uint64_t declared_size;
    std::string message_part;
  };
  const std::vector<Case> cases = {
      {uint64_t{1} << 40, "model of 1099511627776 bytes exceeds the limit of "},
      {uint64_t{256} << 20, "bytes but a model of 268435456 bytes encrypts to"},
  };
  for (const Case& c : cases) {
    HostToEnclave load = tenant_->LoadCall("big", model_, c.declared_size);
    EnclaveToHost reply = enclave_->Handle(load);
    ASSERT_EQ(reply.status().code(), 0) << reply.status().message();
    EXPECT_TRUE(reply.load_model().wrapped_model_key().empty());
    absl::Status status = tenant_->ReplyStatus(
        crypto::MessageKind::kLoadModel, load.load_model().request(), reply.load_model().reply());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), c.message_part)) << status;
  }
  const ProcessMemory after = Memory();
  std::cout << "[memory] enclave (this process) VmHWM " << Mebibytes(before.peak_rss_size) << " -> "
            << Mebibytes(after.peak_rss_size) << "\n";
  EXPECT_LT(after.peak_rss_size, before.peak_rss_size + GrowthBound(64));
}

}  // namespace
}  // namespace cloister::testing

// Tamper tests of the network between the SDK and cloisterd (tamper_fixture.h): calls, replies,
// evidence, hellos, welcomes and upload streams altered by GrpcTamperProxy.
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tamper/grpc_tamper_proxy.h"
#include "tests/tamper/tamper_fixture.h"

namespace cloister::tamper_test {
namespace {

using testing::GrpcMutation;
using Network = TamperTest;

// ---------------------------------------------------------------------------------------------
// The network between the SDK and cloisterd.

TEST_F(Network, FlippedInferCall) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kFlipCall);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, TruncatedInferCall) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kTruncateCall);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, FlippedInferReply) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kFlipReply);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, TruncatedInferReply) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kTruncateReply);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// Two concurrent calls of one session get each other's replies: neither opens.
TEST_F(Network, SwappedRepliesOfConcurrentCalls) {
  ExpectBothClean(*acme_, *acme_);
  proxy_->SetPlan(GrpcMutation::kSwapReplies);
  auto [a, b] = InferTwoAtOnce(*acme_, *acme_);
  ASSERT_TRUE(proxy_->applied());
  ExpectRefused(a, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  ExpectRefused(b, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectBothClean(*acme_, *acme_);
}

// Harmless by design: two independent calls delivered out of order (the later sequence number
// first) are both inside the replay window, so each runs and gets its own correct answer.
TEST_F(Network, ReorderedCallsEachGetTheirOwnAnswer) {
  ExpectBothClean(*acme_, *acme_);
  proxy_->SetPlan(GrpcMutation::kReorderCalls);
  ExpectBothClean(*acme_, *acme_);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// Harmless by design (with a cost): the call ran, but the network answers UNAVAILABLE instead
// of the sealed reply. A client with retries attests again, opens a new session and sends the
// call again, so it runs twice (Infer is idempotent) and the client gets the correct answer;
// a client without retries gets UNAVAILABLE.
TEST_F(Network, ForgedUnavailableAfterTheCallRan) {
  auto retrying = Connect("acme", kAcmeToken, *acme_identity_, /*max_attempts=*/3);
  ASSERT_TRUE(retrying.ok()) << retrying.status();
  ExpectCleanInfer(**retrying);
  proxy_->SetPlan(GrpcMutation::kForgeUnavailable);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kUnavailable,
                "reply withheld");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kForgeUnavailable);
  const Bytes session_before = (*retrying)->session_id();
  ExpectCleanInfer(**retrying);
  EXPECT_TRUE(proxy_->applied());
  EXPECT_NE((*retrying)->session_id(), session_before);
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// An earlier call sent again in place of a new one: the enclave refuses the replay (and the
// new call never reaches it).
TEST_F(Network, ReplayedCall) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kReplayCall);
  ExpectCleanInfer(*acme_);  // remembered
  ExpectRefused(acme_->Infer(kModel, {*input_b_}), absl::StatusCode::kPermissionDenied, kReplayed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_, /*input_a=*/false);
}

// An earlier reply returned for a new call: the SDK refuses it (other request id, and its
// sequence number was already received).
TEST_F(Network, ReplayedReply) {
  ExpectCleanInfer(*acme_);
  proxy_->SetPlan(GrpcMutation::kReplayReply);
  ExpectCleanInfer(*acme_);  // remembered
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme_);
}

// A call of acme2's session moved under acme's session (same tenant): it reaches the enclave,
// which cannot authenticate it under that session's key.
TEST_F(Network, CallSplicedIntoAnotherSessionOfTheSameTenant) {
  ExpectCleanInfer(*acme2_);
  proxy_->SetPlan(GrpcMutation::kSpliceSession);
  ExpectCleanInfer(*acme_);  // its session is remembered
  ExpectRefused(acme2_->Infer(kModel, {*input_b_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*acme2_);
  ExpectCleanInfer(*acme_);
}

// globex's call moved under acme's session (with globex's own credentials): refused as an
// unknown session, exactly like a session that does not exist.
TEST_F(Network, CallSplicedIntoAnotherTenantsSession) {
  ExpectCleanInfer(*globex_);
  proxy_->SetPlan(GrpcMutation::kSpliceSession);
  ExpectCleanInfer(*acme_);  // its session is remembered
  ExpectRefused(globex_->Infer(kModel, {*input_a_}), absl::StatusCode::kNotFound,
                "unknown session");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(*globex_);
  ExpectCleanInfer(*acme_);
}

// An Infer call withheld, then delivered as a ListModels call: the message kind is in the
// associated data, so it does not open as another kind of call.
TEST_F(Network, InferCallDeliveredAsListModels) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  proxy_->SetPlan(GrpcMutation::kCrossRpc);
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kAborted, "withheld");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_TRUE(Lists(*acme_, kModel));
  ExpectCleanInfer(*acme_);
}

TEST_F(Network, FlippedListAndDeleteCalls) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  proxy_->SetPlan(GrpcMutation::kFlipCall, "ListModels");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kFlipReply, "ListModels");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kFlipCall, "DeleteModel");
  ExpectRefused(acme_->DeleteModel(kModel), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_TRUE(Lists(*acme_, kModel));  // the tampered delete deleted nothing
  ExpectCleanInfer(*acme_);
}

// Connecting through a tampered exchange fails; a clean connection right after works.
struct ConnectCase {
  GrpcMutation mutation;
  absl::StatusCode code;
  const char* message;
};
class NetworkConnect : public TamperTest, public ::testing::WithParamInterface<ConnectCase> {};

TEST_P(NetworkConnect, Refused) {
  auto control = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(control.ok()) << control.status();
  proxy_->SetPlan(GetParam().mutation);
  if (GetParam().mutation == GrpcMutation::kReplayEvidence) {
    // The first evidence is remembered; the next connection gets it again.
    ASSERT_TRUE(Connect("acme", kAcmeToken, *acme_identity_).ok());
  }
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(), GetParam().code,
                GetParam().message);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
  ExpectCleanInfer(**control);
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, NetworkConnect,
    ::testing::Values(
        ConnectCase{GrpcMutation::kFlipEvidence, absl::StatusCode::kFailedPrecondition,
                    "attestation failed"},
        // Old evidence is signed over another nonce.
        ConnectCase{GrpcMutation::kReplayEvidence, absl::StatusCode::kFailedPrecondition,
                    "attestation failed: challenge.signature: the signature over the client's "
                    "nonce does not verify"},
        ConnectCase{GrpcMutation::kFlipEvidenceDigest, absl::StatusCode::kFailedPrecondition,
                    "evidence digest is not this enclave's current evidence"},
        ConnectCase{GrpcMutation::kChangeSessionId, absl::StatusCode::kDataLoss,
                    "names a session id other than the one derived from our keys"}));

TEST_F(Network, FlippedHello) {
  proxy_->SetPlan(GrpcMutation::kFlipHello);
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kPermissionDenied, "sealed hello does not authenticate");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

TEST_F(Network, FlippedWelcome) {
  proxy_->SetPlan(GrpcMutation::kFlipWelcome);
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kDataLoss, "cannot open the enclave's welcome");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

// A recorded OpenSession sent again (same tenant): the enclave will not open the same session
// twice.
TEST_F(Network, ReplayedOpenSession) {
  proxy_->SetPlan(GrpcMutation::kReplayOpenSession);
  auto first = Connect("acme", kAcmeToken, *acme_identity_);  // remembered
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kAlreadyExists, "session already open");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  ExpectCleanInfer(**first);
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

// acme's recorded OpenSession presented with globex's credentials: the hello is sealed to
// acme's tenant id, so it does not authenticate for globex.
TEST_F(Network, OpenSessionSplicedIntoAnotherTenant) {
  proxy_->SetPlan(GrpcMutation::kReplayOpenSession);
  auto first = Connect("acme", kAcmeToken, *acme_identity_);  // remembered
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectRefused(Connect("globex", kGlobexToken, *globex_identity_).status(),
                absl::StatusCode::kPermissionDenied, "sealed hello does not authenticate");
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  auto fresh = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

// Upload tampering: the model is refused and nothing is stored; a clean upload right after
// works and the model it stores gives the reference result.
class NetworkUpload : public TamperTest, public ::testing::WithParamInterface<GrpcMutation> {};

TEST_P(NetworkUpload, RefusedAndNothingStored) {
  const std::string name = "uploaded";
  ASSERT_TRUE(acme_->UploadModel(kClsModel, name).ok());  // control
  ASSERT_TRUE(acme_->DeleteModel(name).ok());
  proxy_->SetPlan(GetParam());
  if (GetParam() == GrpcMutation::kReplayUploadFinish) {
    ASSERT_TRUE(acme_->UploadModel(kClsModel, "first").ok());  // remembered
    ASSERT_TRUE(acme_->DeleteModel("first").ok());
  }
  absl::Status status = acme_->UploadModel(kClsModel, name).status();
  EXPECT_TRUE(proxy_->applied());
  switch (GetParam()) {
    case GrpcMutation::kFlipUploadData:
    case GrpcMutation::kReorderUploadData:
      ExpectRefused(status, absl::StatusCode::kDataLoss, kModelDoesNotDecrypt);
      break;
    case GrpcMutation::kTruncateUploadData:
      ExpectRefused(status, absl::StatusCode::kInvalidArgument, "of the declared");
      break;
    case GrpcMutation::kTruncateUploadAtChunk:
      // The sealed load request carries the plaintext size, which the shortened ciphertext
      // no longer matches.
      ExpectRefused(status, absl::StatusCode::kInvalidArgument, "truncated or padded upload");
      break;
    case GrpcMutation::kFlipUploadFinish:
      ExpectRefused(status, absl::StatusCode::kDataLoss, kAuthFailed);
      break;
    case GrpcMutation::kReplayUploadFinish:
      ExpectRefused(status, absl::StatusCode::kPermissionDenied, kReplayed);
      break;
    default:
      FAIL() << "not an upload mutation";
  }
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_FALSE(Lists(*acme_, name));
  EXPECT_FALSE(Lists(*acme_, "first"));
  ASSERT_TRUE(acme_->UploadModel(kClsModel, name).ok());
  auto result = acme_->Infer(name, {*input_a_});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(SameOutputs(*result, *reference_a_));
  EXPECT_TRUE(acme_->DeleteModel(name).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, NetworkUpload,
    ::testing::Values(GrpcMutation::kFlipUploadData, GrpcMutation::kTruncateUploadData,
                      GrpcMutation::kTruncateUploadAtChunk, GrpcMutation::kReorderUploadData,
                      GrpcMutation::kFlipUploadFinish, GrpcMutation::kReplayUploadFinish));

// The load reply tampered on its way back: the client cannot tell whether the model loaded,
// so it gets DataLoss; the model did load (the request was authentic), which ListModels shows.
TEST_F(Network, FlippedUploadReply) {
  proxy_->SetPlan(GrpcMutation::kFlipUploadReply);
  ExpectRefused(acme_->UploadModel(kClsModel, "loaded").status(), absl::StatusCode::kDataLoss,
                kReplyDoesNotOpen);
  EXPECT_TRUE(proxy_->applied());
  proxy_->SetPlan(GrpcMutation::kOff);
  EXPECT_TRUE(Lists(*acme_, "loaded"));
  auto result = acme_->Infer("loaded", {*input_a_});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(SameOutputs(*result, *reference_a_));
  EXPECT_TRUE(acme_->DeleteModel("loaded").ok());
}

// ---------------------------------------------------------------------------------------------
// Generate streams: every chunk dropped, reordered, replayed, cut off, flipped, marked final
// early, spliced from another stream or sent after the final one is caught by the SDK, with
// DATA_LOSS and never as a shorter or other answer; a clean stream right after gives the
// reference ids again.

const std::string kTinyLlama = kModels + "/llm/tiny-llama";

class NetworkStream : public TamperTest, public ::testing::WithParamInterface<GrpcMutation> {
 protected:
  // The model stays with acme's identity for the rest of the suite: uploaded once.
  void SetUp() override {
    TamperTest::SetUp();
    static bool uploaded = false;
    if (uploaded) return;
    auto loaded = acme_->UploadModel(kTinyLlama, "tiny");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    uploaded = true;
  }
  static api::v1::GenerateRequest Request() {
    api::v1::GenerateRequest request;
    request.set_text("The meaning of life");
    request.mutable_sampling()->set_temperature(0);
    request.set_max_tokens(12);
    request.set_ignore_eos(true);
    return request;
  }
};

TEST_P(NetworkStream, IsDetected) {
  const GrpcMutation mutation = GetParam();
  auto clean = acme_->Generate("tiny", Request());
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_EQ(clean->ids.size(), 12u);
  proxy_->SetPlan(mutation);
  if (mutation == GrpcMutation::kSpliceChunk) {
    // The first stream is the one whose chunk is kept; it passes unchanged.
    auto first = acme_->Generate("tiny", Request());
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_FALSE(proxy_->applied());
  }
  auto tampered = acme_->Generate("tiny", Request());
  EXPECT_TRUE(proxy_->applied());
  ASSERT_FALSE(tampered.ok()) << "a tampered stream gave " << tampered->ids.size() << " ids";
  EXPECT_EQ(tampered.status().code(), absl::StatusCode::kDataLoss) << tampered.status();
  EXPECT_THAT(std::string(tampered.status().message()), HasSubstr("generation stream"));
  proxy_->SetPlan(GrpcMutation::kOff);
  auto after = acme_->Generate("tiny", Request());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->ids, clean->ids);
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, NetworkStream,
    ::testing::Values(GrpcMutation::kDropChunk, GrpcMutation::kReorderChunks,
                      GrpcMutation::kReplayChunk, GrpcMutation::kTruncateStream,
                      GrpcMutation::kFlipChunk, GrpcMutation::kMarkFinal,
                      GrpcMutation::kSpliceChunk, GrpcMutation::kAfterFinal));

}  // namespace
}  // namespace cloister::tamper_test

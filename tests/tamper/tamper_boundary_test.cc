// Tamper tests of the boundary between cloisterd and the enclave (tamper_fixture.h): requests,
// replies, batches, sessions, tenants and stored models altered by cloister-tamper-enclave.
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tamper/tamper_fixture.h"

namespace cloister::tamper_test {
namespace {

using Boundary = TamperTest;

// ---------------------------------------------------------------------------------------------
// The boundary between cloisterd and the enclave.

// A sealed request that does not authenticate is refused by the enclave, unsealed (there is no
// key it could answer under), and cloisterd relays that status.
TEST_F(Boundary, FlippedInferRequest) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("flip-request", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

TEST_F(Boundary, TruncatedInferRequest) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("truncate-request", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

TEST_F(Boundary, FlippedInferReply) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("flip-reply", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

TEST_F(Boundary, TruncatedInferReply) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("truncate-reply", "infer");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

// Two requests of one session in one batch; the host swaps the rows' sealed replies (keeping
// the request ids it checks). Each reply is bound to its request id, so neither opens.
TEST_F(Boundary, SwappedReplyRowsInOneBatch) {
  ExpectBothClean(*acme_, *acme_);
  SetBoundaryPlan("swap-reply-rows");
  TamperOneSharedBatch(absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *acme_);
}

// The sealed replies of two tenants' requests (two batches) trade places.
TEST_F(Boundary, SwappedRepliesBetweenTenants) {
  ExpectBothClean(*acme_, *globex_);
  SetBoundaryPlan("swap-replies");
  auto [a, b] = InferTwoAtOnce(*acme_, *globex_);
  ASSERT_TRUE(BoundaryApplied());
  ExpectRefused(a, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  ExpectRefused(b, absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *globex_);
}

// An earlier sealed request resent in a later batch (in place of that batch's request): the
// enclave's replay window refuses it, and the displaced request is not run either.
TEST_F(Boundary, ReplayedRequestInALaterBatch) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("replay-request");
  ExpectCleanInfer(*acme_);  // remembered by the proxy, passes untouched
  ExpectRefused(acme_->Infer(kModel, {*input_b_}), absl::StatusCode::kPermissionDenied, kReplayed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_, /*input_a=*/false);
}

// A request of one session relabelled as another session's (same tenant): it does not
// authenticate under that session's key.
TEST_F(Boundary, RequestSplicedIntoAnotherSession) {
  ExpectCleanInfer(*acme2_);
  SetBoundaryPlan("splice-session");
  ExpectCleanInfer(*acme_);  // its session is remembered
  ExpectRefused(acme2_->Infer(kModel, {*input_b_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme2_);
  ExpectCleanInfer(*acme_);
}

// A batch of globex's relabelled as acme's: the enclave checks the sessions' tenants.
TEST_F(Boundary, BatchSplicedIntoAnotherTenant) {
  ExpectCleanInfer(*globex_);
  SetBoundaryPlan("splice-tenant");
  ExpectCleanInfer(*acme_);  // its tenant is remembered
  ExpectRefused(globex_->Infer(kModel, {*input_a_}), absl::StatusCode::kPermissionDenied,
                kMixedTenants);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*globex_);
  ExpectCleanInfer(*acme_);
}

// One row each of acme's and globex's batches trade places: both batches are refused whole.
TEST_F(Boundary, RowSwappedBetweenTenantsBatches) {
  ExpectBothClean(*acme_, *globex_);
  SetBoundaryPlan("swap-tenant-rows");
  auto [a, b] = InferTwoAtOnce(*acme_, *globex_);
  ASSERT_TRUE(BoundaryApplied());
  ExpectRefused(a, absl::StatusCode::kPermissionDenied, kMixedTenants);
  ExpectRefused(b, absl::StatusCode::kPermissionDenied, kMixedTenants);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *globex_);
}

// A row whose sealed request was emptied on the way in.
TEST_F(Boundary, EmptiedInferRequest) {
  ExpectCleanInfer(*acme_);
  SetBoundaryPlan("empty-request");
  ExpectRefused(acme_->Infer(kModel, {*input_a_}), absl::StatusCode::kInvalidArgument,
                "shorter than the 16-byte tag");
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

// Harmless by design: two rows of one batch reordered on the way in, and their replies put
// back in the original order on the way out. Each row is sealed and answered on its own, so
// each request gets its own correct answer.
TEST_F(Boundary, ReorderedRowsInOneBatchEachGetTheirOwnAnswer) {
  ExpectBothClean(*acme_, *acme_);
  SetBoundaryPlan("reorder-rows");
  TamperOneSharedBatch(absl::StatusCode::kOk);
  SetBoundaryPlan("off");
  ExpectCleanInfer(*acme_);
}

// The same reordering left in place: cloisterd notices that the replies do not follow its
// batch's order and fails both requests rather than hand either the other's reply.
TEST_F(Boundary, ReorderedRowsNotRestoredFailBoth) {
  ExpectBothClean(*acme_, *acme_);
  SetBoundaryPlan("reorder-rows-unrestored");
  TamperOneSharedBatch(absl::StatusCode::kInternal, kReplyOrder);
  SetBoundaryPlan("off");
  ExpectBothClean(*acme_, *acme_);
}

// globex's request pointed at acme's model (batch and row model handles rewritten): the model
// handle is in the associated data, so the request does not open.
TEST_F(Boundary, RequestPointedAtAnotherTenantsModel) {
  ExpectCleanInfer(*globex_);
  SetBoundaryPlan("swap-model");
  ExpectCleanInfer(*acme_);  // its model handle is remembered
  ExpectRefused(globex_->Infer(kModel, {*input_a_}), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  ExpectCleanInfer(*globex_);
  ExpectCleanInfer(*acme_);
}

// cloisterd hands a restarted worker another model's wrapped key and ciphertext under
// globex's (or acme's) model handle. The wrapped key is bound to its handle, so that model is
// not loaded at all (its owner gets NotFound), never loaded as the other tenant's model.
TEST_F(Boundary, StoredModelsSwappedOnReload) {
  // Control: a clean restart brings both models back.
  RestartWorker();
  auto acme = Connect("acme", kAcmeToken, *acme_identity_);
  auto globex = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(acme.ok() && globex.ok());
  ExpectCleanInfer(**acme);
  ExpectCleanInfer(**globex);

  SetBoundaryPlan("swap-reload");
  RestartWorker();
  ASSERT_TRUE(BoundaryApplied());
  acme = Connect("acme", kAcmeToken, *acme_identity_);
  globex = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(acme.ok() && globex.ok());
  auto acme_result = (*acme)->Infer(kModel, {*input_a_});
  auto globex_result = (*globex)->Infer(kModel, {*input_a_});
  // Exactly one of the two models was swapped (the second one reloaded).
  ASSERT_NE(acme_result.ok(), globex_result.ok())
      << acme_result.status() << " / " << globex_result.status();
  const auto& refused = acme_result.ok() ? globex_result : acme_result;
  const auto& served = acme_result.ok() ? acme_result : globex_result;
  ExpectRefused(refused, absl::StatusCode::kNotFound, "model not found");
  EXPECT_TRUE(SameOutputs(*served, *reference_a_));
  // cloisterd logged why the enclave refused the swapped model.
  EXPECT_THAT(appliance_->Logs(), HasSubstr("wrapped model key does not open"));

  // Another clean restart: the stored models were left alone, so both come back.
  SetBoundaryPlan("off");
  RestartWorker();
  acme = Connect("acme", kAcmeToken, *acme_identity_);
  globex = Connect("globex", kGlobexToken, *globex_identity_);
  ASSERT_TRUE(acme.ok() && globex.ok());
  ExpectCleanInfer(**acme);
  ExpectCleanInfer(**globex);
}

TEST_F(Boundary, FlippedListModelsRequestAndReply) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  SetBoundaryPlan("flip-request", "list");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("flip-reply", "list");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_TRUE(Lists(*acme_, kModel));
}

// A tampered delete request deletes nothing.
TEST_F(Boundary, FlippedDeleteRequestDeletesNothing) {
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "doomed").ok());
  SetBoundaryPlan("flip-request", "delete");
  ExpectRefused(acme_->DeleteModel("doomed"), absl::StatusCode::kDataLoss, kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_TRUE(Lists(*acme_, "doomed"));
  EXPECT_TRUE(acme_->DeleteModel("doomed").ok());
  EXPECT_FALSE(Lists(*acme_, "doomed"));
}

// acme's list, delete and load calls presented as globex's: the enclave checks who owns the
// session and refuses exactly as for a session that does not exist; nothing is deleted or
// stored.
TEST_F(Boundary, CallsRelabelledAsAnotherTenant) {
  ASSERT_TRUE(Lists(*acme_, kModel));
  SetBoundaryPlan("relabel-tenant", "list", "globex");
  ExpectRefused(acme_->ListModels().status(), absl::StatusCode::kNotFound, kUnknownSession);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("relabel-tenant", "delete", "globex");
  ExpectRefused(acme_->DeleteModel(kModel), absl::StatusCode::kNotFound, kUnknownSession);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("relabel-tenant", "load", "globex");
  ExpectRefused(acme_->UploadModel(kClsModel, "relabelled").status(), absl::StatusCode::kNotFound,
                kUnknownSession);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_TRUE(Lists(*acme_, kModel));
  EXPECT_FALSE(Lists(*acme_, "relabelled"));
  EXPECT_FALSE(Lists(*globex_, "relabelled"));
  ExpectCleanInfer(*acme_);
}

// The delete reply tampered on its way back: the request was authentic, so the model is gone,
// and the client, which cannot open the reply, gets DataLoss (not a false "deleted" or "not
// deleted"); ListModels tells it the truth.
TEST_F(Boundary, FlippedDeleteReply) {
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "doomed").ok());
  SetBoundaryPlan("flip-reply", "delete");
  ExpectRefused(acme_->DeleteModel("doomed"), absl::StatusCode::kDataLoss, kReplyDoesNotOpen);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_FALSE(Lists(*acme_, "doomed"));
  ExpectCleanInfer(*acme_);
}

// A tampered sealed load request (the upload's finish) stores and loads nothing.
TEST_F(Boundary, FlippedLoadRequestLoadsNothing) {
  SetBoundaryPlan("flip-request", "load");
  ExpectRefused(acme_->UploadModel(kClsModel, "tampered").status(), absl::StatusCode::kDataLoss,
                kAuthFailed);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_FALSE(Lists(*acme_, "tampered"));
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "tampered").ok());
  EXPECT_TRUE(acme_->DeleteModel("tampered").ok());
}

// Model ciphertext changed on its way into the enclave: the enclave refuses the model (in its
// sealed reply) and the host stores nothing.
TEST_F(Boundary, FlippedModelCiphertextLoadsNothing) {
  SetBoundaryPlan("flip-model", "load");
  ExpectRefused(acme_->UploadModel(kClsModel, "tampered").status(),
                absl::StatusCode::kDataLoss, kModelDoesNotDecrypt);
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  EXPECT_FALSE(Lists(*acme_, "tampered"));
  ASSERT_TRUE(acme_->UploadModel(kClsModel, "tampered").ok());
  EXPECT_TRUE(acme_->DeleteModel("tampered").ok());
}

TEST_F(Boundary, FlippedHelloAndWelcome) {
  SetBoundaryPlan("flip-request", "open");
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kPermissionDenied, "sealed hello does not authenticate");
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("flip-reply", "open");
  ExpectRefused(Connect("acme", kAcmeToken, *acme_identity_).status(),
                absl::StatusCode::kDataLoss, "cannot open the enclave's welcome");
  EXPECT_TRUE(BoundaryApplied());
  SetBoundaryPlan("off");
  auto fresh = Connect("acme", kAcmeToken, *acme_identity_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ExpectCleanInfer(**fresh);
}

}  // namespace
}  // namespace cloister::tamper_test

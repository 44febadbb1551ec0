// Operator-published models through the in-process enclave, as cloisterd relays them: the
// operator's PublishModelCall (the plaintext and the digest its config expects) is checked by
// the enclave, which then lists the model to every tenant, signs it into its evidence answer
// (the verifier's published.* checks and a policy's pins), serves one generator to several
// tenants at once (each gets its reference ids), and refuses: another digest, bytes that are
// no model, a tenant upload under the published name, a tenant's delete of it. A tampered
// list of published models fails attestation.
#include <string>
#include <vector>

#include "attest/binding.h"
#include "attest/policy.h"
#include "attest/verifier.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/model_handle.h"
#include "crypto/random.h"
#include "enclave/enclave.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sdk/model_dir.h"
#include "tests/support/enclave_tenant.h"
#include "tests/support/temp_dir.h"

namespace cloister::testing {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using ::testing::HasSubstr;

const std::string kTinyLlama = std::string(CLOISTER_SHARED_DIR) + "/models/llm/tiny-llama";

class PublishedModelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("cloister-published-models-test");
    enclave::EnclaveOptions options;
    options.sim_dir = dir_ + "/sim";
    options.dev_policy_out = dir_ + "/dev-policy.yaml";
    options.measurement = crypto::Sha384(AsBytes("published models test"));
    options.generation.threads = 2;
    auto made = enclave::Enclave::Create(std::move(options));
    ASSERT_TRUE(made.ok()) << made.status();
    enclave_ = *std::move(made);
    auto policy = attest::LoadPolicyFile(dir_ + "/dev-policy.yaml");
    ASSERT_TRUE(policy.ok()) << policy.status();
    policy_ = *policy;
    auto package = sdk::PackModelDir(kTinyLlama, uint64_t{256} << 20);
    ASSERT_TRUE(package.ok()) << package.status();
    package_ = ToString(*package);
    digest_ = HexEncode(crypto::Sha256(*package));
    auto text = ReadFile(kTinyLlama + "/reference.json", 16 << 20);
    ASSERT_TRUE(text.ok());
    references_ = nlohmann::json::parse(*text);
  }

  EnclaveToHost Publish(const std::string& name, const std::string& bytes,
                        const std::string& digest) {
    HostToEnclave call;
    call.set_call_id(next_call_id_++);
    call.mutable_publish_model()->set_name(name);
    call.mutable_publish_model()->set_model(bytes);
    call.mutable_publish_model()->set_digest(digest);
    return enclave_->Handle(call);
  }

  std::unique_ptr<EnclaveTenant> Tenant(const std::string& id,
                                        const attest::v1::Policy* policy = nullptr) {
    auto tenant = std::make_unique<EnclaveTenant>(enclave_.get(), id, policy ? *policy : policy_);
    EXPECT_TRUE(tenant->attestation().ok()) << tenant->attestation();
    EXPECT_TRUE(tenant->Open().ok());
    return tenant;
  }

  std::vector<api::v1::ModelInfo> List(EnclaveTenant& tenant) {
    HostToEnclave call;
    call.mutable_list_models()->set_tenant_id(tenant.tenant());
    *call.mutable_list_models()->mutable_request() =
        tenant.Seal(crypto::MessageKind::kListModels, "", api::v1::ListModelsRequest());
    EnclaveToHost reply = enclave_->Handle(call);
    std::string body;
    EXPECT_TRUE(tenant
                    .OpenReply(crypto::MessageKind::kListModels, call.list_models().request(),
                               reply.list_models().reply(), &body)
                    .ok());
    api::v1::ListModelsReply models;
    EXPECT_TRUE(models.ParseFromString(body));
    return {models.models().begin(), models.models().end()};
  }

  api::v1::GenerateRequest Greedy(const nlohmann::json& prompt) {
    api::v1::GenerateRequest request;
    if (prompt["kind"] == "chat") {
      for (const auto& m : prompt["messages"]) {
        api::v1::ChatMessage* message = request.mutable_chat()->add_messages();
        message->set_role(m["role"].get<std::string>());
        message->set_content(m["content"].get<std::string>());
      }
    } else {
      request.set_text(prompt["text"].get<std::string>());
    }
    request.mutable_sampling()->set_temperature(0);
    request.set_max_tokens(references_["generation"]["max_new_tokens"].get<uint64_t>());
    return request;
  }

  // Sends a generation for `handle`; its call id and sealed item.
  std::pair<uint64_t, boundary::v1::ForwardedRequest> Send(
      EnclaveTenant& tenant, const std::string& handle, const api::v1::GenerateRequest& request) {
    HostToEnclave call;
    const uint64_t call_id = next_call_id_++;
    call.set_call_id(call_id);
    call.mutable_generate()->set_tenant_id(tenant.tenant());
    *call.mutable_generate()->mutable_request() =
        tenant.Seal(crypto::MessageKind::kGenerate, handle, request);
    boundary::v1::ForwardedRequest item = call.generate().request();
    std::optional<EnclaveToHost> reply = enclave_->Handle(call, frames_);
    if (reply) frames_->Write(*reply);
    return {call_id, item};
  }

  // The ids of a stream, or its error (sealed or not).
  absl::StatusOr<std::vector<int32_t>> Read(EnclaveTenant& tenant, uint64_t call_id,
                                            const boundary::v1::ForwardedRequest& item) {
    std::vector<int32_t> ids;
    ASSIGN_OR_RETURN(std::vector<EnclaveToHost> frames, frames_->WaitForEnd(call_id));
    for (const EnclaveToHost& frame : frames) {
      if (frame.status().code() != 0) {
        return absl::Status(static_cast<absl::StatusCode>(frame.status().code()),
                            frame.status().message());
      }
      absl::StatusOr<api::v1::GenerateChunk> chunk = tenant.OpenChunk(item, frame.generate());
      if (!chunk.ok()) return chunk.status();
      if (chunk->code() != 0) {
        return absl::Status(static_cast<absl::StatusCode>(chunk->code()), chunk->message());
      }
      for (const auto& token : chunk->tokens()) ids.push_back(token.id());
    }
    return ids;
  }

  std::string dir_;
  std::unique_ptr<enclave::Enclave> enclave_;
  attest::v1::Policy policy_;
  std::string package_;
  std::string digest_;
  nlohmann::json references_;
  std::shared_ptr<CapturedFrames> frames_ = std::make_shared<CapturedFrames>();
  uint64_t next_call_id_ = 1;
};

TEST_F(PublishedModelsTest, EveryTenantListsItAndSeesItsDigestInTheVerifiedClaims) {
  EnclaveToHost published = Publish("tiny-llama", package_, digest_);
  ASSERT_EQ(published.status().code(), 0) << published.status().message();
  EXPECT_EQ(published.publish_model().model_handle(), crypto::PublishedModelHandle("tiny-llama"));
  EXPECT_EQ(published.publish_model().kind(), "llm");
  EXPECT_EQ(published.publish_model().size(), package_.size());

  for (const std::string id : {"alpha", "beta"}) {
    SCOPED_TRACE(id);
    auto tenant = Tenant(id);
    const attest::Verdict& verdict = tenant->verdict();
    ASSERT_TRUE(verdict.pass) << verdict.FailedSummary();
    ASSERT_NE(verdict.Find("published.models"), nullptr);
    EXPECT_EQ(verdict.Find("published.models")->result, attest::Check::kPass);
    EXPECT_EQ(verdict.published_models.at("tiny-llama"), digest_);
    EXPECT_EQ(verdict.claims.at("published.tiny-llama.digest"), digest_);
    EXPECT_EQ(verdict.claims.at("published.tiny-llama.kind"), "llm");
    std::vector<api::v1::ModelInfo> models = List(*tenant);
    ASSERT_EQ(models.size(), 1u);
    EXPECT_EQ(models[0].name(), "tiny-llama");
    EXPECT_TRUE(models[0].published());
    EXPECT_EQ(models[0].digest(), digest_);
    EXPECT_EQ(models[0].kind(), api::v1::MODEL_KIND_LLM);
  }
}

TEST_F(PublishedModelsTest, TenantsShareOneGeneratorAndEachGetsItsReferenceIds) {
  ASSERT_EQ(Publish("tiny-llama", package_, digest_).status().code(), 0);
  auto alpha = Tenant("alpha");
  auto beta = Tenant("beta");
  const std::string handle = crypto::PublishedModelHandle("tiny-llama");
  const auto& prompts = references_["prompts"];
  struct Sent {
    EnclaveTenant* tenant;
    uint64_t call_id;
    boundary::v1::ForwardedRequest item;
    std::vector<int32_t> expected;
  };
  std::vector<Sent> sent;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (EnclaveTenant* tenant : {alpha.get(), beta.get()}) {
      auto [call_id, item] = Send(*tenant, handle, Greedy(prompts[i]));
      sent.push_back(
          {tenant, call_id, item, prompts[i]["generated_ids"].get<std::vector<int32_t>>()});
    }
  }
  for (const Sent& s : sent) {
    absl::StatusOr<std::vector<int32_t>> ids = Read(*s.tenant, s.call_id, s.item);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, s.expected) << s.tenant->tenant() << " call " << s.call_id;
  }
}

TEST_F(PublishedModelsTest, RefusesAnotherDigestAndBytesThatAreNoModel) {
  std::string wrong(64, 'a');
  EnclaveToHost refused = Publish("tiny-llama", package_, wrong);
  EXPECT_EQ(refused.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("the bytes have digest ", digest_, ", not the expected ")));
  EXPECT_THAT(Publish("tiny-llama", package_, "xyz").status().message(),
              HasSubstr("digest must be 64 hex digits"));
  EXPECT_THAT(Publish("bad/name", package_, digest_).status().message(),
              HasSubstr("must be 1 to 128 characters"));
  const std::string junk = "not a model at all";
  EnclaveToHost junk_reply = Publish("junk", junk, HexEncode(crypto::Sha256(AsBytes(junk))));
  EXPECT_EQ(junk_reply.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(junk_reply.status().message(), HasSubstr("published model junk: model refused"));
  // Nothing was published: tenants see no models and an empty signed list.
  auto alpha = Tenant("alpha");
  EXPECT_TRUE(List(*alpha).empty());
  EXPECT_TRUE(alpha->verdict().published_models.empty());
  EXPECT_EQ(alpha->verdict().Find("published.models")->result, attest::Check::kPass);
}

TEST_F(PublishedModelsTest, TenantsCannotTakeItsNameNorDeleteIt) {
  ASSERT_EQ(Publish("tiny-llama", package_, digest_).status().code(), 0);
  auto alpha = Tenant("alpha");
  HostToEnclave load = alpha->LoadCall("tiny-llama", package_);
  EnclaveToHost loaded = enclave_->Handle(load);
  ASSERT_EQ(loaded.status().code(), 0);
  absl::Status upload = alpha->OpenReply(crypto::MessageKind::kLoadModel,
                                         load.load_model().request(), loaded.load_model().reply());
  EXPECT_EQ(upload.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(upload.message(), HasSubstr("taken by an operator-published model"));
  EXPECT_TRUE(loaded.load_model().wrapped_model_key().empty());  // the host stores nothing

  HostToEnclave del;
  del.mutable_delete_model()->set_tenant_id("alpha");
  api::v1::DeleteModelRequest request;
  request.set_name("tiny-llama");
  *del.mutable_delete_model()->mutable_request() =
      alpha->Seal(crypto::MessageKind::kDeleteModel, alpha->Handle("tiny-llama"), request);
  EnclaveToHost deleted = enclave_->Handle(del);
  EXPECT_EQ(alpha
                ->OpenReply(crypto::MessageKind::kDeleteModel, del.delete_model().request(),
                            deleted.delete_model().reply())
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(deleted.delete_model().model_deleted());
  ASSERT_EQ(List(*alpha).size(), 1u);

  // A tenant model named like a model published later blocks that publication.
  HostToEnclave other = alpha->LoadCall("mine", package_);
  ASSERT_EQ(enclave_->Handle(other).status().code(), 0);
  EXPECT_THAT(Publish("mine", package_, digest_).status().message(),
              HasSubstr("a tenant's model already has this name"));
}

TEST_F(PublishedModelsTest, PolicyPinsPassOnTheDigestAndFailOtherwise) {
  ASSERT_EQ(Publish("tiny-llama", package_, digest_).status().code(), 0);
  attest::v1::Policy pinned = policy_;
  auto* pin = pinned.add_published_models();
  pin->set_name("tiny-llama");
  pin->set_digest(digest_);
  EnclaveTenant good(enclave_.get(), "alpha", pinned);
  ASSERT_TRUE(good.attestation().ok()) << good.attestation();
  EXPECT_EQ(good.verdict().Find("published.tiny-llama")->result, attest::Check::kPass);

  attest::v1::Policy wrong = policy_;
  pin = wrong.add_published_models();
  pin->set_name("tiny-llama");
  pin->set_digest(std::string(64, '0'));
  EnclaveTenant bad(enclave_.get(), "alpha", wrong);
  EXPECT_FALSE(bad.attestation().ok());
  EXPECT_THAT(
      std::string(bad.attestation().message()),
      HasSubstr(absl::StrCat("published.tiny-llama: published model 'tiny-llama' has digest ",
                             digest_, ", the policy pins 0000")));

  attest::v1::Policy missing = policy_;
  pin = missing.add_published_models();
  pin->set_name("llama-3-8b");
  pin->set_digest(digest_);
  EnclaveTenant absent(enclave_.get(), "alpha", missing);
  EXPECT_FALSE(absent.attestation().ok());
  EXPECT_THAT(std::string(absent.attestation().message()),
              HasSubstr("the enclave does not publish it"));
}

// The host relays the enclave's answer: a list it alters, or one it strips, is caught.
TEST_F(PublishedModelsTest, AHostThatAltersTheListFailsAttestation) {
  ASSERT_EQ(Publish("tiny-llama", package_, digest_).status().code(), 0);
  Bytes nonce = crypto::RandomBytes(attest::kNonceSize);
  HostToEnclave call;
  call.mutable_get_evidence()->set_nonce(ToString(nonce));
  EnclaveToHost reply = enclave_->Handle(call);
  ASSERT_EQ(reply.status().code(), 0);
  attest::ChallengeResponse response;
  ASSERT_TRUE(response.ParseFromString(reply.get_evidence().challenge_response()));

  // As sent: passes.
  auto verdict = attest::VerifyChallenge(response, nonce, policy_, absl::Now());
  ASSERT_TRUE(verdict.ok());
  EXPECT_TRUE(verdict->pass) << verdict->FailedSummary();

  // Another digest in the list.
  attest::v1::PublishedModels list;
  ASSERT_TRUE(list.ParseFromString(response.published_models()));
  list.mutable_models(0)->set_digest(std::string(64, 'b'));
  attest::ChallengeResponse altered = response;
  altered.set_published_models(list.SerializeAsString());
  verdict = attest::VerifyChallenge(altered, nonce, policy_, absl::Now());
  ASSERT_TRUE(verdict.ok());
  EXPECT_FALSE(verdict->pass);
  EXPECT_THAT(verdict->FailedSummary(), HasSubstr("published.models: the signature over the "
                                                  "published models does not verify"));
  EXPECT_TRUE(verdict->published_models.empty());

  // Replayed for another nonce.
  Bytes other_nonce = crypto::RandomBytes(attest::kNonceSize);
  HostToEnclave again;
  again.mutable_get_evidence()->set_nonce(ToString(other_nonce));
  attest::ChallengeResponse second;
  ASSERT_TRUE(second.ParseFromString(enclave_->Handle(again).get_evidence().challenge_response()));
  attest::ChallengeResponse spliced = second;
  spliced.set_published_models_signature(response.published_models_signature());
  verdict = attest::VerifyChallenge(spliced, other_nonce, policy_, absl::Now());
  ASSERT_TRUE(verdict.ok());
  EXPECT_FALSE(verdict->pass);

  // Stripped: no published models (the tenant cannot address one), and a policy pin fails.
  attest::ChallengeResponse stripped = response;
  stripped.clear_published_models();
  stripped.clear_published_models_signature();
  verdict = attest::VerifyChallenge(stripped, nonce, policy_, absl::Now());
  ASSERT_TRUE(verdict.ok());
  EXPECT_TRUE(verdict->pass);
  EXPECT_TRUE(verdict->published_models.empty());
  EXPECT_EQ(verdict->Find("published.models")->result, attest::Check::kSkipped);
  attest::v1::Policy pinned = policy_;
  pinned.add_published_models()->set_name("tiny-llama");
  pinned.mutable_published_models(0)->set_digest(digest_);
  verdict = attest::VerifyChallenge(stripped, nonce, pinned, absl::Now());
  ASSERT_TRUE(verdict.ok());
  EXPECT_FALSE(verdict->pass);
}

}  // namespace
}  // namespace cloister::testing

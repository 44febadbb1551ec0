// Generate through the in-process enclave, as cloisterd relays it (docs/PROTOCOL.md,
// "Generation streams"): the shared tiny model uploaded as a package, each reference prompt
// (chat prompts as messages rendered by the model's template in the enclave, plain prompts as
// text) generated greedily gives exactly its reference ids, in chunks numbered from 0 with one
// final chunk that carries usage and a receipt the enclave's key verifies; chunks are padded to
// their bucket; several streams at once each give their own ids; cancel stops a stream;
// errors decided after opening come sealed; a request that does not open is refused unsealed.
#include <atomic>
#include <string>
#include <vector>

#include "attest/policy.h"
#include "base/clock.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/receipt.h"
#include "enclave/enclave.h"
#include "enclave/llm/engine.h"
#include "proto/model_package.h"
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

struct Stream {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<api::v1::GenerateChunk> chunks;
  absl::Status unsealed;  // a frame with a boundary status
};

class LlmGenerateTest : public ::testing::Test {
 protected:
  virtual void Configure(enclave::EnclaveOptions&) {}

  void SetUp() override {
    dir_ = MakeTempDir("cloister-llm-generate-test");
    enclave::EnclaveOptions options;
    options.sim_dir = dir_ + "/sim";
    options.dev_policy_out = dir_ + "/dev-policy.yaml";
    options.measurement = crypto::Sha384(AsBytes("llm generate test"));
    options.generation.threads = 2;
    Configure(options);
    auto made = enclave::Enclave::Create(std::move(options));
    ASSERT_TRUE(made.ok()) << made.status();
    enclave_ = *std::move(made);
    auto policy = attest::LoadPolicyFile(dir_ + "/dev-policy.yaml");
    ASSERT_TRUE(policy.ok()) << policy.status();
    tenant_ = std::make_unique<EnclaveTenant>(enclave_.get(), "alpha", *policy);
    ASSERT_TRUE(tenant_->attestation().ok()) << tenant_->attestation();
    ASSERT_TRUE(tenant_->Open().ok());
    auto package = sdk::PackModelDir(kTinyLlama, uint64_t{256} << 20);
    ASSERT_TRUE(package.ok()) << package.status();
    digest_ = HexEncode(crypto::Sha256(*package));
    HostToEnclave load = tenant_->LoadCall("tiny", ToString(*package));
    EnclaveToHost loaded = enclave_->Handle(load);
    ASSERT_EQ(loaded.status().code(), 0) << loaded.status().message();
    ASSERT_TRUE(tenant_
                    ->OpenReply(crypto::MessageKind::kLoadModel, load.load_model().request(),
                                loaded.load_model().reply())
                    .ok());
    auto text = ReadFile(kTinyLlama + "/reference.json", 16 << 20);
    ASSERT_TRUE(text.ok());
    references_ = nlohmann::json::parse(*text);
  }

  // Sends one GenerateCall (call id `call_id`) for model `name`; its sealed item.
  boundary::v1::ForwardedRequest Send(uint64_t call_id, const api::v1::GenerateRequest& request,
                                      const std::string& name = "tiny", uint64_t limit = 0,
                                      std::optional<absl::Duration> time_left = std::nullopt,
                                      boundary::v1::GenerateLimits limits = {}) {
    HostToEnclave call;
    *call.mutable_generate()->mutable_limits() = limits;
    call.set_call_id(call_id);
    call.mutable_generate()->set_tenant_id("alpha");
    *call.mutable_generate()->mutable_request() =
        tenant_->Seal(crypto::MessageKind::kGenerate, tenant_->Handle(name), request);
    if (time_left) {
      call.mutable_generate()->mutable_request()->mutable_time_left()->set_nanos(
          static_cast<int32_t>(absl::ToInt64Nanoseconds(*time_left)));
    }
    call.mutable_generate()->mutable_limits()->set_max_tokens(limit);
    boundary::v1::ForwardedRequest item = call.generate().request();
    std::optional<EnclaveToHost> reply = enclave_->Handle(call, sink_);
    if (reply) sink_->Write(*reply);  // as the boundary server does
    return item;
  }

  // Reads call `call_id`'s stream, checking its shape as the SDK does: numbered from 0, one
  // final chunk at the end, every chunk opening and padded to `pad_to`.
  Stream Read(uint64_t call_id, const boundary::v1::ForwardedRequest& item, uint32_t pad_to = 256) {
    Stream out;
    absl::StatusOr<std::vector<EnclaveToHost>> ended = sink_->WaitForEnd(call_id);
    if (!ended.ok()) {
      ADD_FAILURE() << ended.status();
      return out;
    }
    const std::vector<EnclaveToHost>& frames = *ended;
    for (size_t i = 0; i < frames.size(); ++i) {
      const EnclaveToHost& frame = frames[i];
      if (frame.status().code() != 0) {
        EXPECT_EQ(i + 1, frames.size());
        out.unsealed = absl::Status(static_cast<absl::StatusCode>(frame.status().code()),
                                    frame.status().message());
        break;
      }
      const boundary::v1::GenerateResult& result = frame.generate();
      EXPECT_EQ(result.chunk(), i);
      EXPECT_EQ(result.final(), i + 1 == frames.size());
      EXPECT_EQ(result.request_id(), item.request_id());
      if (pad_to > 1) {
        EXPECT_EQ((result.ciphertext().size() - 16) % pad_to, 0u);
      }
      absl::StatusOr<api::v1::GenerateChunk> chunk = tenant_->OpenChunk(item, result);
      EXPECT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk.ok()) break;
      for (const auto& token : chunk->tokens()) out.ids.push_back(token.id());
      out.text += chunk->text();
      out.chunks.push_back(*chunk);
      if (result.final() && chunk->code() == 0) {
        EXPECT_TRUE(result.has_receipt());
        EXPECT_EQ(result.receipt().receipt(), chunk->receipt());
      }
    }
    return out;
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

  std::string dir_;
  std::unique_ptr<enclave::Enclave> enclave_;
  std::unique_ptr<EnclaveTenant> tenant_;
  std::shared_ptr<CapturedFrames> sink_ = std::make_shared<CapturedFrames>();
  std::string digest_;
  nlohmann::json references_;
};

TEST_F(LlmGenerateTest, EveryReferencePromptGivesItsIdsWithUsageAndAVerifiedReceipt) {
  uint64_t call_id = 100;
  for (const auto& prompt : references_["prompts"]) {
    SCOPED_TRACE(prompt["name"].get<std::string>());
    ++call_id;
    boundary::v1::ForwardedRequest item = Send(call_id, Greedy(prompt));
    Stream stream = Read(call_id, item);
    ASSERT_TRUE(stream.unsealed.ok()) << stream.unsealed;
    ASSERT_FALSE(stream.chunks.empty());
    const api::v1::GenerateChunk& last = stream.chunks.back();
    ASSERT_EQ(last.code(), 0) << last.message();
    EXPECT_EQ(stream.ids, prompt["generated_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(last.usage().prompt_tokens(), prompt["prompt_ids"].size());
    EXPECT_EQ(last.usage().completion_tokens(), stream.ids.size());
    EXPECT_THAT(last.finish_reason(), ::testing::AnyOf("stop", "length"));
    // One chunk per token (the default shape), the last token with the finish.
    EXPECT_EQ(stream.chunks.size(), stream.ids.size());

    ASSERT_TRUE(crypto::VerifyUsageReceipt(enclave_->signing_public_key(),
                                           AsBytes(last.receipt()),
                                           AsBytes(last.receipt_signature()))
                    .ok());
    boundary::v1::UsageReceipt receipt;
    ASSERT_TRUE(receipt.ParseFromString(last.receipt()));
    EXPECT_EQ(receipt.tenant_id(), "alpha");
    EXPECT_EQ(receipt.model_digest(), digest_);
    EXPECT_EQ(receipt.batch().sequences(), 1u);
    EXPECT_EQ(receipt.batch().requests(), 1u);
    EXPECT_EQ(receipt.batch().prompt_tokens(), prompt["prompt_ids"].size());
    EXPECT_EQ(receipt.batch().completion_tokens(), stream.ids.size());
    EXPECT_GT(receipt.batch().execution_ns(), 0u);
  }
}

TEST_F(LlmGenerateTest, StreamsAtOnceEachGiveTheirOwnIds) {
  const auto& prompts = references_["prompts"];
  std::vector<boundary::v1::ForwardedRequest> items;
  for (size_t i = 0; i < prompts.size(); ++i) items.push_back(Send(200 + i, Greedy(prompts[i])));
  for (size_t i = 0; i < prompts.size(); ++i) {
    Stream stream = Read(200 + i, items[i]);
    EXPECT_EQ(stream.ids, prompts[i]["generated_ids"].get<std::vector<int32_t>>()) << i;
  }
}

// Two tenants, each with their own copy of the model, both backlogged, with weights 1 and 3
// from the host's limits: the one stepping thread serves them 3:1 in tokens while both wait.
TEST_F(LlmGenerateTest, TenantsOnDifferentModelsShareTheStepsByWeight) {
  auto policy = attest::LoadPolicyFile(dir_ + "/dev-policy.yaml");
  ASSERT_TRUE(policy.ok());
  EnclaveTenant beta(enclave_.get(), "beta", *policy);
  ASSERT_TRUE(beta.Open().ok());
  auto package = sdk::PackModelDir(kTinyLlama, uint64_t{256} << 20);
  ASSERT_TRUE(package.ok());
  HostToEnclave load = beta.LoadCall("tiny", ToString(*package));
  ASSERT_EQ(enclave_->Handle(load).status().code(), 0);

  api::v1::GenerateRequest request;
  request.set_text("The meaning of life");
  request.set_max_tokens(24);
  request.set_ignore_eos(true);
  auto send = [&](EnclaveTenant& tenant, uint64_t call_id, uint32_t weight) {
    HostToEnclave call;
    call.set_call_id(call_id);
    call.mutable_generate()->set_tenant_id(tenant.tenant());
    *call.mutable_generate()->mutable_request() =
        tenant.Seal(crypto::MessageKind::kGenerate, tenant.Handle("tiny"), request);
    call.mutable_generate()->mutable_limits()->set_weight(weight);
    EXPECT_FALSE(enclave_->Handle(call, sink_).has_value());
  };
  // 48 sequences each: three rounds of the 16 a generator runs at once.
  for (uint64_t i = 0; i < 48; ++i) send(*tenant_, 1000 + i, 1);
  for (uint64_t i = 0; i < 48; ++i) send(beta, 2000 + i, 3);
  for (uint64_t i = 0; i < 48; ++i) ASSERT_TRUE(sink_->WaitForEnd(2000 + i).ok());
  // Tokens (one per chunk) each tenant got before the heavier one's last stream ended.
  int alpha_tokens = 0, beta_tokens = 0;
  for (const EnclaveToHost& frame : sink_->Frames()) {
    (frame.call_id() >= 2000 ? beta_tokens : alpha_tokens) += 1;
  }
  ASSERT_EQ(beta_tokens, 48 * 24);
  EXPECT_NEAR(static_cast<double>(beta_tokens) / alpha_tokens, 3.0, 0.45)
      << beta_tokens << " / " << alpha_tokens;
  for (uint64_t i = 0; i < 48; ++i) ASSERT_TRUE(sink_->WaitForEnd(1000 + i).ok());
}

TEST_F(LlmGenerateTest, ShapesGroupTokensAndPadToTheirBucket) {
  api::v1::GenerateRequest request = Greedy(references_["prompts"][4]);
  request.mutable_shape()->set_tokens_per_chunk(5);
  request.mutable_shape()->set_pad_to(64);
  Stream stream = Read(300, Send(300, request), 64);
  EXPECT_EQ(stream.ids, references_["prompts"][4]["generated_ids"].get<std::vector<int32_t>>());
  ASSERT_EQ(stream.chunks.size(), (stream.ids.size() + 4) / 5);
  for (size_t i = 0; i + 1 < stream.chunks.size(); ++i) EXPECT_EQ(stream.chunks[i].tokens_size(), 5);
  EXPECT_EQ(stream.text, references_["prompts"][4]["generated_text"].get<std::string>());
}

// A fixed cadence: one chunk per interval whatever the tokens do, the final one at a tick too;
// the tokens are all there, in order. (Only the lower bound of the gaps is checked: a slow
// machine may stretch them, never shorten them.)
TEST_F(LlmGenerateTest, AFixedCadenceSendsOneChunkPerInterval) {
  api::v1::GenerateRequest request = Greedy(references_["prompts"][4]);
  request.mutable_shape()->set_interval_ms(40);
  request.mutable_shape()->set_tokens_per_chunk(3);  // not used with a cadence
  const absl::Time sent = absl::Now();
  Stream stream = Read(350, Send(350, request));
  ASSERT_TRUE(stream.unsealed.ok()) << stream.unsealed;
  ASSERT_FALSE(stream.chunks.empty());
  EXPECT_EQ(stream.chunks.back().code(), 0) << stream.chunks.back().message();
  EXPECT_EQ(stream.ids, references_["prompts"][4]["generated_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(stream.text, references_["prompts"][4]["generated_text"].get<std::string>());
  std::vector<absl::Time> times = sink_->Times(350);
  ASSERT_EQ(times.size(), stream.chunks.size());
  // Chunk i leaves at tick i + 1 of the cadence, never before it. (Not the gaps between
  // chunks: a tick delayed by a loaded machine is followed by one on schedule, closer to it.)
  for (size_t i = 0; i < times.size(); ++i) {
    EXPECT_GE(times[i] - sent, absl::Milliseconds(40) * static_cast<int64_t>(i + 1) -
                                   absl::Milliseconds(1))
        << "chunk " << i << " came before its tick";
  }

  // Out of range: a sealed InvalidArgument that names the field.
  request.mutable_shape()->set_interval_ms(5);
  Stream refused = Read(351, Send(351, request));
  ASSERT_EQ(refused.chunks.size(), 1u);
  EXPECT_EQ(refused.chunks[0].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(refused.chunks[0].message(), HasSubstr("shape.interval_ms 5 is out of range"));
}

// The receipt charges the KV memory a stream held over time (block-milliseconds): a long stream
// holds blocks for many steps.
TEST_F(LlmGenerateTest, TheReceiptCountsKvBlockTime) {
  api::v1::GenerateRequest request;
  request.set_text("The meaning of life");
  request.set_max_tokens(300);
  request.set_ignore_eos(true);
  request.mutable_sampling()->set_temperature(0);
  Stream stream = Read(360, Send(360, request));
  ASSERT_FALSE(stream.chunks.empty());
  const api::v1::GenerateChunk& last = stream.chunks.back();
  ASSERT_EQ(last.code(), 0) << last.message();
  boundary::v1::UsageReceipt receipt;
  ASSERT_TRUE(receipt.ParseFromString(last.receipt()));
  EXPECT_EQ(receipt.batch().completion_tokens(), 300u);
  EXPECT_GT(receipt.batch().kv_block_ms(), 0u);
}

TEST_F(LlmGenerateTest, CancelEndsTheStreamAsCancelled) {
  api::v1::GenerateRequest request;
  request.set_text("The meaning of life");
  request.set_max_tokens(500);
  request.set_ignore_eos(true);
  boundary::v1::ForwardedRequest item = Send(400, request);
  ASSERT_TRUE(sink_->WaitForAny(400).ok());
  HostToEnclave cancel;
  cancel.set_call_id(401);
  cancel.mutable_cancel()->set_target_call_id(400);
  std::optional<EnclaveToHost> answer = enclave_->Handle(cancel, sink_);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), 0);
  EXPECT_TRUE(answer->cancel().found());
  Stream stream = Read(400, item);
  ASSERT_FALSE(stream.chunks.empty());
  EXPECT_EQ(stream.chunks.back().finish_reason(), "cancelled");
  EXPECT_LT(stream.ids.size(), 500u);
  // Cancelling again finds nothing.
  cancel.set_call_id(402);
  EXPECT_FALSE(enclave_->Handle(cancel, sink_)->cancel().found());
}

TEST_F(LlmGenerateTest, ADeadlineCutsTheStreamShortWithASealedError) {
  api::v1::GenerateRequest request;
  request.set_text("The meaning of life");
  request.set_max_tokens(500);
  request.set_ignore_eos(true);
  Stream stream = Read(450, Send(450, request, "tiny", 0, absl::Milliseconds(20)));
  ASSERT_FALSE(stream.chunks.empty());
  const api::v1::GenerateChunk& last = stream.chunks.back();
  EXPECT_EQ(last.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded)) << last.message();
  EXPECT_THAT(last.message(), HasSubstr("generation passed its deadline after"));
  EXPECT_LT(stream.ids.size(), 500u);
  // Its receipt counts it as failed, with the tokens it used.
  boundary::v1::UsageReceipt receipt;
  ASSERT_TRUE(receipt.ParseFromString(last.receipt()));
  EXPECT_EQ(receipt.batch().failed_requests(), 1u);
  EXPECT_EQ(receipt.batch().completion_tokens(), stream.ids.size());
}

TEST_F(LlmGenerateTest, ErrorsAfterOpeningComeSealedInTheFinalChunk) {
  struct Case {
    std::string what;
    api::v1::GenerateRequest request;
    std::string model = "tiny";
    uint64_t limit = 0;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  {
    Case c{"no prompt", {}, "tiny", 0, absl::StatusCode::kInvalidArgument, "has no prompt"};
    cases.push_back(c);
  }
  {
    Case c{"past the context", {}, "tiny", 0, absl::StatusCode::kInvalidArgument,
           "runs past the model's context"};
    c.request.set_text("hello");
    c.request.set_max_tokens(100000);
    cases.push_back(c);
  }
  {
    Case c{"over the tenant's cap", {}, "tiny", 8, absl::StatusCode::kResourceExhausted,
           "max_tokens 9 is over the tenant's limit of 8"};
    c.request.set_text("hello");
    c.request.set_max_tokens(9);
    cases.push_back(c);
  }
  {
    Case c{"bad temperature", {}, "tiny", 0, absl::StatusCode::kInvalidArgument, "temperature"};
    c.request.set_text("hello");
    c.request.mutable_sampling()->set_temperature(3);
    cases.push_back(c);
  }
  {
    Case c{"unknown model", {}, "nope", 0, absl::StatusCode::kNotFound, "model not found"};
    c.request.set_text("hello");
    cases.push_back(c);
  }
  uint64_t call_id = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ++call_id;
    Stream stream = Read(call_id, Send(call_id, c.request, c.model, c.limit));
    ASSERT_TRUE(stream.unsealed.ok()) << stream.unsealed;
    ASSERT_EQ(stream.chunks.size(), 1u);
    EXPECT_EQ(stream.chunks[0].code(), static_cast<int>(c.code)) << stream.chunks[0].message();
    EXPECT_THAT(stream.chunks[0].message(), HasSubstr(c.message));
    EXPECT_TRUE(stream.ids.empty());
  }
  // The engine still serves after all that.
  Stream fine = Read(600, Send(600, Greedy(references_["prompts"][3])));
  EXPECT_EQ(fine.ids, references_["prompts"][3]["generated_ids"].get<std::vector<int32_t>>());
}

// The host's per-tenant limits that only the enclave can enforce (it alone sees tokens): the
// KV cache quota and the token-rate bucket, each refused in a sealed chunk naming the limit.
TEST_F(LlmGenerateTest, TheTenantsKvQuotaAndTokenRateAreEnforcedInTheEnclave) {
  const auto& prompt = references_["prompts"][3];  // 7 tokens
  api::v1::GenerateRequest request = Greedy(prompt);  // max_tokens 48
  auto refused = [&](uint64_t call_id, const boundary::v1::GenerateLimits& limits,
                     const api::v1::GenerateRequest& r) {
    Stream stream = Read(call_id, Send(call_id, r, "tiny", 0, std::nullopt, limits));
    EXPECT_EQ(stream.chunks.size(), 1u);
    return stream.chunks.empty() ? api::v1::GenerateChunk() : stream.chunks[0];
  };
  boundary::v1::GenerateLimits kv;
  kv.set_kv_cache_tokens(32);
  api::v1::GenerateChunk chunk = refused(900, kv, request);
  EXPECT_EQ(chunk.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(chunk.reason(), api::v1::QUOTA_EXCEEDED);
  EXPECT_THAT(chunk.message(), HasSubstr("the tenant's KV quota is 32 tokens"));
  // Within the quota it runs.
  kv.set_kv_cache_tokens(64);
  Stream fits = Read(901, Send(901, request, "tiny", 0, std::nullopt, kv));
  EXPECT_EQ(fits.ids, prompt["generated_ids"].get<std::vector<int32_t>>());

  // A bucket of 100 tokens refilled at 1 a second: a request takes its prompt and max_tokens
  // (7 + 48) and gets back what it did not generate.
  boundary::v1::GenerateLimits rate;
  rate.set_tokens_per_second(1);
  rate.set_token_burst(100);
  Stream first = Read(902, Send(902, request, "tiny", 0, std::nullopt, rate));  // 7 + 17 used
  EXPECT_EQ(first.ids, prompt["generated_ids"].get<std::vector<int32_t>>());
  request.set_ignore_eos(true);
  Stream second = Read(905, Send(905, request, "tiny", 0, std::nullopt, rate));  // 7 + 48 used
  EXPECT_EQ(second.ids.size(), 48u);
  chunk = refused(903, rate, request);  // about 100 - 24 - 55 = 21 left
  EXPECT_EQ(chunk.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(chunk.reason(), api::v1::OVERLOADED);
  EXPECT_THAT(chunk.message(), HasSubstr("token rate limit of 1 tokens/s"));
  api::v1::GenerateRequest huge = request;
  huge.set_max_tokens(200);
  chunk = refused(904, rate, huge);
  EXPECT_EQ(chunk.reason(), api::v1::TOO_LARGE);
  EXPECT_THAT(chunk.message(), HasSubstr("exceed the tenant's token burst of 100"));
}

TEST_F(LlmGenerateTest, ARequestThatDoesNotOpenIsRefusedUnsealed) {
  HostToEnclave call;
  call.set_call_id(700);
  call.mutable_generate()->set_tenant_id("alpha");
  api::v1::GenerateRequest request;
  request.set_text("hello");
  *call.mutable_generate()->mutable_request() =
      tenant_->Seal(crypto::MessageKind::kGenerate, tenant_->Handle("tiny"), request);
  (*call.mutable_generate()->mutable_request()->mutable_ciphertext())[0] ^= 1;
  std::optional<EnclaveToHost> reply = enclave_->Handle(call, sink_);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->status().code(), static_cast<int>(absl::StatusCode::kDataLoss));
  // Sealed as another kind (an Infer request replayed as a generation): refused too.
  HostToEnclave other = call;
  other.set_call_id(701);
  *other.mutable_generate()->mutable_request() =
      tenant_->Seal(crypto::MessageKind::kInfer, tenant_->Handle("tiny"), request);
  reply = enclave_->Handle(other, sink_);
  ASSERT_TRUE(reply.has_value());
  EXPECT_NE(reply->status().code(), 0);
  // Without a streaming boundary a generation is refused in its one reply.
  HostToEnclave plain = call;
  plain.set_call_id(702);
  EXPECT_EQ(enclave_->Handle(plain).status().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
}

// The steps' token ids and results cross the emulated CPU-GPU path (AES-256-GCM both ways):
// the same ids come out, and a byte the host flips in the bounce buffer ends the stream with a
// sealed error, never with a wrong token.
class LlmGenerateEmulatedPcieTest : public LlmGenerateTest {
 protected:
  void Configure(enclave::EnclaveOptions& options) override {
    options.pcie_mode = enclave::pcie::PcieMode::kEmulated;
    options.pcie_options.in_flight_hook_for_test = [this](std::span<uint8_t> bounce) {
      if (flip_.load() && !bounce.empty()) bounce[0] ^= 1;
    };
  }
  std::atomic<bool> flip_{false};
};

TEST_F(LlmGenerateEmulatedPcieTest, StepsCrossThePathAndATamperedStepEndsTheStream) {
  const auto& prompt = references_["prompts"][0];
  Stream clean = Read(800, Send(800, Greedy(prompt)));
  EXPECT_EQ(clean.ids, prompt["generated_ids"].get<std::vector<int32_t>>());
  auto path = enclave_->transfer_path();
  ASSERT_TRUE(path.ok());
  EXPECT_GE((*path)->stats().to_device_transfers, clean.ids.size());
  EXPECT_GT((*path)->stats().chunks_sealed, 0u);

  flip_ = true;
  Stream tampered = Read(801, Send(801, Greedy(prompt)));
  ASSERT_EQ(tampered.chunks.size(), 1u);
  EXPECT_EQ(tampered.chunks[0].code(), static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_THAT(tampered.chunks[0].message(), HasSubstr("the engine failed"));
  EXPECT_TRUE(tampered.ids.empty());
  EXPECT_GT((*path)->stats().authentication_failures, 0u);
}

// A device engine's side of the contract, run on the CPU: the backend gets the model without
// weights and the checkpoint's files, and loads the weights from those files itself. Registered
// under a name of its own, so the enclave's choice of backend is what is tested.
constexpr char kFilesBackend[] = "cpu-from-files-for-test";
std::atomic<int> files_engines_made{0};

// The weights, read from the files; a base of FilesCpuEngine before the engine, so that they
// are made before it and outlive it.
struct HeldWeights {
  std::unique_ptr<llm::Model> model;
};

class FilesCpuEngine : private HeldWeights, public llm::ForwardingEngine {
 public:
  FilesCpuEngine(std::unique_ptr<llm::Model> model, std::unique_ptr<llm::StepEngine> inner)
      : HeldWeights{std::move(model)}, ForwardingEngine(std::move(inner)) {}
  std::string_view name() const override { return kFilesBackend; }
};

[[maybe_unused]] const bool files_backend_registered = [] {
  llm::RegisterEngineBackend(
      kFilesBackend,
      {[] { return absl::OkStatus(); },
       [](const llm::Model& model, const llm::CheckpointFiles& files,
          const llm::EngineOptions& options) -> absl::StatusOr<std::unique_ptr<llm::StepEngine>> {
         if (model.weight_bytes() != 0) {
           return absl::FailedPreconditionError("the model came with host weights");
         }
         ASSIGN_OR_RETURN(std::unique_ptr<llm::Model> weights,
                          llm::Model::Load(files, llm::LoadOptions{}));
         ASSIGN_OR_RETURN(std::unique_ptr<llm::StepEngine> inner,
                          llm::MakeCpuEngine(*weights, options));
         ++files_engines_made;
         return std::unique_ptr<llm::StepEngine>(
             std::make_unique<FilesCpuEngine>(std::move(weights), std::move(inner)));
       },
       nullptr});
  return true;
}();

// LLMs on an engine backend other than the CPU's (as the CUDA LLM engine beside the CUDA
// executor): the store keeps the package for it, counts the package as the model's memory, and
// the generator's engine is made by that backend from the kept files, so the reference ids come
// out of weights the engine read itself.
class LlmGenerateDeviceEngineTest : public LlmGenerateTest {
 protected:
  void Configure(enclave::EnclaveOptions& options) override {
    options.llm_executor = kFilesBackend;
  }
};

TEST_F(LlmGenerateDeviceEngineTest, TheBackendReadsTheWeightsFromTheKeptPackage) {
  const int made_before = files_engines_made.load();
  const auto& prompts = references_["prompts"];
  std::vector<boundary::v1::ForwardedRequest> items;
  for (size_t i = 0; i < prompts.size(); ++i) items.push_back(Send(900 + i, Greedy(prompts[i])));
  for (size_t i = 0; i < prompts.size(); ++i) {
    Stream stream = Read(900 + i, items[i]);
    EXPECT_EQ(stream.ids, prompts[i]["generated_ids"].get<std::vector<int32_t>>()) << i;
  }
  EXPECT_EQ(files_engines_made.load(), made_before + 1);  // one generator for the model
}

TEST_F(LlmGenerateDeviceEngineTest, TheKeptPackageCountsAsModelMemoryAndMustFitTheBudget) {
  auto package = sdk::PackModelDir(kTinyLlama, uint64_t{256} << 20);
  ASSERT_TRUE(package.ok()) << package.status();
  auto upload = [&](const std::string& name, uint64_t budget, EnclaveToHost& reply) {
    HostToEnclave call = tenant_->LoadCall(name, ToString(*package));
    call.mutable_load_model()->set_model_memory_budget(budget);
    reply = enclave_->Handle(call);
    EXPECT_EQ(reply.status().code(), 0) << reply.status().message();
    return tenant_->OpenReply(crypto::MessageKind::kLoadModel, call.load_model().request(),
                              reply.load_model().reply());
  };
  EnclaveToHost reply;
  absl::Status refused = upload("tiny-small-budget", package->size() - 1, reply);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("kept for the"));
  EXPECT_TRUE(reply.load_model().wrapped_model_key().empty());
  absl::Status loaded = upload("tiny-exact-budget", package->size(), reply);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(reply.load_model().model_memory_size(), package->size());
}

TEST(LlmEngineChoiceTest, AnLlmEngineThatIsNotThereStopsTheEnclaveWithOneLine) {
  const std::string dir = MakeTempDir("cloister-llm-engine-choice-test");
  enclave::EnclaveOptions options;
  options.sim_dir = dir + "/sim";
  options.measurement = crypto::Sha384(AsBytes("llm engine choice test"));
  options.llm_executor = "tpu";
  auto made = enclave::Enclave::Create(std::move(options));
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(made.status().message()), HasSubstr("LLM engine \"tpu\""));
  EXPECT_EQ(std::string(made.status().message()).find('\n'), std::string::npos);
}

}  // namespace
}  // namespace cloister::testing

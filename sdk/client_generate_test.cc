// Tests of Client::Generate against the in-process peer (client_test_harness.h): a stream is
// handed over chunk by chunk and put together, the enclave's errors keep their code, what a
// host might do to a stream is refused, and only a seeded generation is ever retried.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/client.h"
#include "sdk/client_test_harness.h"

namespace cloister::sdk::client_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using StreamFault = EnclavePeer::StreamFault;

class GenerateTest : public ClientTest {
 protected:
  std::unique_ptr<Client> ConnectWithModel(ClientOptions options) {
    std::unique_ptr<Client> client = MustConnect(options);
    if (client == nullptr) return nullptr;
    auto model = client->UploadModel(WriteModel("llm.bin", Bytes(100, 7)), "llm");
    EXPECT_TRUE(model.ok()) << model.status();
    return client;
  }
  std::unique_ptr<Client> ConnectWithModel() {
    ClientOptions options = Options();
    options.retry_backoff = absl::Milliseconds(1);
    return ConnectWithModel(options);
  }
  static api::GenerateRequest Prompt(const std::string& text) {
    api::GenerateRequest request;
    request.set_text(text);
    return request;
  }
};

TEST_F(GenerateTest, HandsOverEachChunkAndReturnsTheWhole) {
  std::unique_ptr<Client> client = ConnectWithModel();
  ASSERT_NE(client, nullptr);
  std::vector<std::string> texts;
  auto result = client->Generate("llm", Prompt("hello"), [&](const api::GenerateChunk& chunk) {
    texts.push_back(chunk.text());
    EXPECT_TRUE(chunk.padding().empty());
  });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(texts, ElementsAre("h", "e", "l", "l", "o", ""));
  EXPECT_EQ(result->text, "hello");
  EXPECT_THAT(result->ids, ElementsAre('h', 'e', 'l', 'l', 'o'));
  EXPECT_EQ(result->finish_reason, "stop");
  EXPECT_EQ(result->usage.prompt_tokens(), 5u);
  EXPECT_EQ(result->usage.completion_tokens(), 5u);
  EXPECT_EQ(result->receipt, "peer receipt");
  EXPECT_EQ(result->receipt_signature, "peer signature");
  EXPECT_EQ(result->chunk_count, 6u);
  // Without a callback too, and the session serves other calls in between.
  EXPECT_TRUE(client->ListModels().ok());
  auto again = client->Generate("llm", Prompt("ab"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->text, "ab");
}

// A caller that stops after two chunks gets CANCELLED at once, and the session serves on.
TEST_F(GenerateTest, ACallerCanStopTheGeneration) {
  std::unique_ptr<Client> client = ConnectWithModel();
  ASSERT_NE(client, nullptr);
  int seen = 0;
  auto result = client->Generate(
      "llm", Prompt("hello"), [&](const api::GenerateChunk&) { ++seen; }, absl::ZeroDuration(),
      [&] { return seen >= 2; });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_EQ(seen, 2);
  auto before = client->Generate("llm", Prompt("hi"), {}, absl::ZeroDuration(), [] { return true; });
  EXPECT_EQ(before.status().code(), absl::StatusCode::kCancelled);
  auto again = client->Generate("llm", Prompt("ab"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->text, "ab");
}

TEST_F(GenerateTest, SendsTheRequestAsGiven) {
  std::unique_ptr<Client> client = ConnectWithModel();
  ASSERT_NE(client, nullptr);
  api::GenerateRequest request = Prompt("hello world");
  request.set_max_tokens(3);
  request.add_stop("zz");
  request.mutable_sampling()->set_temperature(0.5f);
  request.mutable_sampling()->set_seed(42);
  auto result = client->Generate("llm", request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->text, "hel");
  EXPECT_EQ(result->finish_reason, "length");
  EXPECT_EQ(peer_->last_generate_request().SerializeAsString(), request.SerializeAsString());

  api::GenerateRequest ids;
  ids.mutable_ids()->add_ids(5);
  ids.mutable_ids()->add_ids(9);
  auto echoed = client->Generate("llm", ids);
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_THAT(echoed->ids, ElementsAre(5, 9));
  EXPECT_EQ(echoed->text, "[5][9]");
}

TEST_F(GenerateTest, LocalAndEnclaveErrors) {
  std::unique_ptr<Client> client = ConnectWithModel();
  ASSERT_NE(client, nullptr);
  peer_->sealed_calls = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(client->Generate("", Prompt("x")).status()));
  auto no_prompt = client->Generate("llm", api::GenerateRequest());
  EXPECT_TRUE(absl::IsInvalidArgument(no_prompt.status()));
  EXPECT_THAT(no_prompt.status().message(), HasSubstr("no prompt"));
  EXPECT_EQ(peer_->sealed_calls.load(), 0);

  auto unknown = client->Generate("nope", Prompt("x"));
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  EXPECT_EQ(unknown.status().message(), "model not found");
}

TEST_F(GenerateTest, WhatAHostDoesToAStreamIsRefused) {
  std::unique_ptr<Client> client = ConnectWithModel();
  ASSERT_NE(client, nullptr);
  const struct {
    StreamFault fault;
    const char* error;
  } cases[] = {
      {StreamFault::kDropChunk1, "chunk 2 arrived where chunk 1 was due: chunk 1 is missing"},
      {StreamFault::kSwapChunks1And2, "chunk 2 arrived where chunk 1 was due"},
      {StreamFault::kReplayChunk0, "chunk 0 was already received: a replayed chunk"},
      {StreamFault::kTamperChunk1, "chunk 1 does not open"},
      {StreamFault::kNoFinal, "generation stream ended without its final chunk"},
      {StreamFault::kChunkAfterFinal, "chunk 6 arrived after the final chunk (5)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.error);
    peer_->SetStreamFault(c.fault);
    std::string seen;
    auto result = client->Generate("llm", Prompt("hello"),
                                   [&](const api::GenerateChunk& chunk) { seen += chunk.text(); });
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr(c.error));
    // Nothing past the first bad chunk was handed over.
    if (c.fault == StreamFault::kDropChunk1 || c.fault == StreamFault::kSwapChunks1And2 ||
        c.fault == StreamFault::kReplayChunk0 || c.fault == StreamFault::kTamperChunk1) {
      EXPECT_EQ(seen, "h");
    }
  }
  // The session is still good for the next, untouched stream.
  peer_->SetStreamFault(StreamFault::kNone);
  auto result = client->Generate("llm", Prompt("ok"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->text, "ok");
}

TEST_F(GenerateTest, OnlyASeededGenerationIsRetriedAndOnlyBeforeItsFirstChunk) {
  std::unique_ptr<Client> client = ConnectWithModel();
  ASSERT_NE(client, nullptr);
  // Unseeded: a worker restart before the stream started is returned, not retried.
  peer_->sealed_calls = 0;
  peer_->RefuseNextSealedCalls(1, grpc::StatusCode::UNAVAILABLE, "enclave worker 0 is restarting");
  auto unseeded = client->Generate("llm", Prompt("hi"));
  EXPECT_TRUE(absl::IsUnavailable(unseeded.status())) << unseeded.status();
  EXPECT_EQ(peer_->sealed_calls.load(), 1);
  // It left its session behind, as any call that found the worker gone: the next call opens a
  // new one.
  const int sessions = peer_->open_sessions.load();
  ASSERT_TRUE(client->ListModels().ok());
  EXPECT_EQ(peer_->open_sessions.load(), sessions + 1);

  // Seeded: tried again through a new session.
  api::GenerateRequest seeded = Prompt("hi");
  seeded.mutable_sampling()->set_seed(7);
  peer_->sealed_calls = 0;
  peer_->RefuseNextSealedCalls(1, grpc::StatusCode::FAILED_PRECONDITION,
                               "the enclave worker holding this session restarted",
                               api::SESSION_LOST);
  auto retried = client->Generate("llm", seeded);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->text, "hi");
  EXPECT_EQ(peer_->sealed_calls.load(), 2);
  EXPECT_EQ(peer_->open_sessions.load(), sessions + 2);

  // Seeded, but the stream broke after a chunk was handed over: not sent again.
  peer_->SetStreamFault(StreamFault::kFailAfterChunk0);
  peer_->sealed_calls = 0;
  std::string seen;
  auto broken = client->Generate("llm", seeded,
                                 [&](const api::GenerateChunk& chunk) { seen += chunk.text(); });
  EXPECT_TRUE(absl::IsUnavailable(broken.status())) << broken.status();
  EXPECT_THAT(broken.status().message(), HasSubstr("enclave worker 0 exited"));
  EXPECT_EQ(peer_->sealed_calls.load(), 1);
  EXPECT_EQ(seen, "h");
}

}  // namespace
}  // namespace cloister::sdk::client_test

// Tests of the Client with several endpoints, against in-process peers (client_test_harness.h):
// the server list, connecting past endpoints that are down or fail attestation, sessions that
// stay on their node, and failover.
#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/client.h"
#include "sdk/client_test_harness.h"

namespace cloister::sdk::client_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---- Several endpoints. ----

TEST(ServerListTest, ParsesCommaSeparatedEndpoints) {
  auto one = ParseServerList("127.0.0.1:7700");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, std::vector<std::string>{"127.0.0.1:7700"});
  auto several = ParseServerList("a.example:7700,[::1]:7701,unix:/run/cloister.sock");
  ASSERT_TRUE(several.ok()) << several.status();
  EXPECT_EQ(*several,
            (std::vector<std::string>{"a.example:7700", "[::1]:7701", "unix:/run/cloister.sock"}));
}

TEST(ServerListTest, BadListsAreInvalidArguments) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "no server address given"},
      {"a:1,,b:2", "has an empty entry"},
      {"a:1,", "has an empty entry"},
      {",a:1", "has an empty entry"},
      {"a:1, b:2", "contains whitespace"},
      {"a.example", "is not HOST:PORT"},
      {"a:0", "is not HOST:PORT"},
      {"a:65536", "is not HOST:PORT"},
      {"a:7x", "is not HOST:PORT"},
      {"a:+7", "is not HOST:PORT"},
      {":7700", "is not HOST:PORT"},
      {"::1:7700", "IPv6 address in brackets"},
      {"a:1,b:2,a:1", "\"a:1\" is listed twice"},
  };
  for (const auto& [list, reason] : cases) {
    auto parsed = ParseServerList(list);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(reason)) << list;
  }
}

TEST_F(ClientTest, BadServerListIsInvalidArgument) {
  ClientOptions options = Options();
  options.server = absl::StrCat(server_address_, ",,", server_address_);
  absl::Status connect = Client::Connect(options).status();
  EXPECT_EQ(connect.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(connect.message()), HasSubstr("empty entry"));
  EXPECT_EQ(Attest(options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(peer_->open_sessions.load(), 0);
}

TEST_F(ClientTest, ConnectsToTheSecondEndpointWhenTheFirstIsDown) {
  ClientOptions options = Options();
  std::string closed = ClosedAddress();
  options.server = absl::StrCat(closed, ",", server_address_);
  attest::Verdict verdict;
  auto client = Client::Connect(options, &verdict);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(verdict.pass);
  EXPECT_EQ((*client)->current_server(), server_address_);
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  EXPECT_TRUE((*client)->ListModels().ok());
  auto attested = Attest(options);
  ASSERT_TRUE(attested.ok()) << attested.status();
  EXPECT_TRUE(attested->pass);
}

TEST_F(ClientTest, SkipsAnEndpointThatFailsAttestation) {
  Node impostor = StartNode(Bytes(48, 0x11));  // not the measurement the policy expects
  ClientOptions options = Options();
  options.server = absl::StrCat(impostor.address, ",", server_address_);
  attest::Verdict verdict;
  auto client = Client::Connect(options, &verdict);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(verdict.pass);
  EXPECT_EQ((*client)->current_server(), server_address_);
  EXPECT_EQ(impostor.peer->open_sessions.load(), 0);
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  impostor.server->Shutdown();
}

TEST_F(ClientTest, NoUsableEndpointNamesEachFailure) {
  Node impostor = StartNode(Bytes(48, 0x11));
  std::string closed = ClosedAddress();
  ClientOptions options = Options();
  options.server = absl::StrCat(closed, ",", impostor.address);
  absl::Status status = Client::Connect(options).status();
  // The code of the endpoint that answered; the message names both.
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), StartsWith("no endpoint could be used: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot reach cloisterd at " + closed));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(impostor.address + ": attestation failed: "));
  options.server = absl::StrCat(closed, ",", ClosedAddress());
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kUnavailable);
  impostor.server->Shutdown();
}

TEST(SpreadStartTest, KeysPickEveryStartAndAlwaysTheSameOne) {
  EXPECT_EQ(SpreadStart(Bytes(32, 7), 0), 0u);
  EXPECT_EQ(SpreadStart(Bytes(32, 7), 1), 0u);
  std::set<size_t> starts;
  for (int i = 0; i < 64; ++i) {
    TenantIdentity identity = TenantIdentity::Generate();
    const size_t start = SpreadStart(identity.public_key(), 3);
    ASSERT_LT(start, 3u);
    EXPECT_EQ(SpreadStart(identity.public_key(), 3), start);  // the same key, the same node
    starts.insert(start);
  }
  EXPECT_EQ(starts.size(), 3u) << "64 keys should reach each of 3 nodes";
}

// spread_endpoints: one list, two tenants' keys, one node each; without it, both on the first.
TEST_F(ClientTest, SpreadEndpointsPutsTenantsOnTheNodeTheirKeyPicks) {
  Node second = StartNode(measurement_);
  const std::vector<std::string> nodes = {server_address_, second.address};
  std::map<size_t, std::string> key_for_start;  // 0 and 1 -> a key file that picks it
  for (int i = 0; key_for_start.size() < 2 && i < 200; ++i) {
    TenantIdentity identity = TenantIdentity::Generate();
    const size_t start = SpreadStart(identity.public_key(), nodes.size());
    if (key_for_start.count(start) != 0) continue;
    const std::string path = absl::StrCat(dir_, "/spread-", start, ".key");
    ASSERT_TRUE(identity.Save(path).ok());
    key_for_start[start] = path;
  }
  ASSERT_EQ(key_for_start.size(), 2u);
  for (const auto& [start, key] : key_for_start) {
    ClientOptions options = Options();
    options.server = absl::StrCat(nodes[0], ",", nodes[1]);
    options.identity_key_path = key;
    options.spread_endpoints = true;
    std::unique_ptr<Client> client = MustConnect(options);
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->current_server(), nodes[start]) << "key " << key;
    ASSERT_TRUE(client->ListModels().ok());
    options.spread_endpoints = false;
    std::unique_ptr<Client> plain = MustConnect(options);
    ASSERT_NE(plain, nullptr);
    EXPECT_EQ(plain->current_server(), nodes[0]);
  }
  // The node a key picks being down, it moves on to the next in the list.
  const std::string closed = ClosedAddress();
  ClientOptions options = Options();
  options.server = absl::StrCat(closed, ",", nodes[1]);
  options.identity_key_path = key_for_start[0];
  options.spread_endpoints = true;
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->current_server(), nodes[1]);
  second.server->Shutdown();
}

TEST_F(ClientTest, ASessionStaysOnItsNode) {
  Node second = StartNode(measurement_);
  FakeClock clock(absl::Now());
  ClientOptions options = Options();
  options.clock = &clock;
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->current_server(), server_address_);
  ASSERT_TRUE(client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client->Infer("echo", {Fp32Tensor("x", {1, 2})}).ok());
  }
  ASSERT_TRUE(client->ListModels().ok());
  // A session replaced because it expires is replaced on the same node.
  clock.Advance(absl::Minutes(59) + absl::Seconds(30));
  ASSERT_TRUE(client->Infer("echo", {Fp32Tensor("x", {1, 2})}).ok());
  EXPECT_EQ(client->current_server(), server_address_);
  EXPECT_EQ(peer_->open_sessions.load(), 2);
  EXPECT_EQ(peer_->sealed_calls.load(), 8);  // the upload's load, 6 infers, 1 list
  EXPECT_EQ(second.peer->open_sessions.load(), 0);
  EXPECT_EQ(second.peer->sealed_calls.load(), 0);
  second.server->Shutdown();
}

TEST_F(ClientTest, FailsOverWhenItsNodeStopsMidRun) {
  Node second = StartNode(measurement_);
  ClientOptions options = Options();
  options.retry_backoff = absl::Milliseconds(1);
  // Models are per node: the tenant uploads to each node (same identity key, same model).
  {
    ClientOptions only_second = options;
    only_second.server = second.address;
    std::unique_ptr<Client> uploader = MustConnect(only_second);
    ASSERT_NE(uploader, nullptr);
    ASSERT_TRUE(uploader->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  }
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo").ok());
  ASSERT_TRUE(client->UploadModel(WriteModel("n.onnx", Bytes(10, 2)), "only-first").ok());
  Bytes first_session = client->session_id();

  std::atomic<int> done{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        float value = static_cast<float>(t * 100 + i);
        auto outputs = client->Infer("echo", {Fp32Tensor("x", {value, value, value})});
        if (!outputs.ok() || outputs->size() != 1 ||
            (*outputs)[0].raw() != Fp32Tensor("x", {value, value, value}).raw()) {
          ADD_FAILURE() << (outputs.ok() ? "wrong output" : outputs.status().ToString());
          ++failures;
        }
        ++done;
      }
    });
  }
  while (done.load() < 20) absl::SleepFor(absl::Milliseconds(1));
  server_->Shutdown();  // the first node goes away while calls are running
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(client->current_server(), second.address);
  EXPECT_NE(client->session_id(), first_session);
  EXPECT_TRUE(client->verdict().pass);
  EXPECT_EQ(second.peer->open_sessions.load(), 2);  // the uploader's, then the failover's
  EXPECT_GT(second.peer->sealed_calls.load(), 0);

  // A model uploaded only to the first node is not on the second, and the error says so.
  auto missing = client->Infer("only-first", {Fp32Tensor("x", {1, 2})});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("(on " + second.address + "; each node keeps its own models"));
  second.server->Shutdown();
}

TEST_F(ClientTest, FailsOverWhenTheRetryBudgetOnItsNodeIsSpent) {
  Node second = StartNode(measurement_);
  ClientOptions options = Options();
  options.retry_backoff = absl::Milliseconds(1);
  options.max_attempts = 2;
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  // The first node answers, but its worker keeps failing.
  peer_->sealed_calls = 0;
  peer_->RefuseNextSealedCalls(10, grpc::StatusCode::UNAVAILABLE, "enclave worker 0 is restarting");
  auto listed = client->ListModels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(peer_->sealed_calls.load(), 2);  // the budget on the first node
  EXPECT_EQ(second.peer->open_sessions.load(), 1);
  EXPECT_EQ(second.peer->sealed_calls.load(), 1);
  EXPECT_EQ(client->current_server(), second.address);
  // It stays on the second node from now on.
  EXPECT_TRUE(client->ListModels().ok());
  EXPECT_EQ(peer_->sealed_calls.load(), 2);
  // When every node is down, the call fails with UNAVAILABLE.
  second.server->Shutdown();
  server_->Shutdown();
  server_.reset();
  EXPECT_EQ(client->ListModels().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ClientTest, CallsThatAreNotRetriedLeaveADownNodeForTheNextCall) {
  Node second = StartNode(measurement_);
  ClientOptions options = Options();
  options.server = absl::StrCat(server_address_, ",", second.address);
  std::unique_ptr<Client> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  server_->Shutdown();
  server_.reset();
  // A delete is not retried, so it fails with the node; the upload after it moves on.
  absl::Status deleted = client->DeleteModel("echo");
  EXPECT_EQ(deleted.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(deleted.message()), HasSubstr(server_address_));
  auto uploaded = client->UploadModel(WriteModel("m.onnx", Bytes(10, 1)), "echo");
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(client->current_server(), second.address);
  EXPECT_EQ(second.peer->open_sessions.load(), 1);
  EXPECT_TRUE(client->Infer("echo", {Fp32Tensor("x", {1, 2})}).ok());
  second.server->Shutdown();
}

}  // namespace
}  // namespace cloister::sdk::client_test

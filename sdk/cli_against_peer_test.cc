// Tests of the `cloister` commands that talk to a server, against the in-process peer
// (client_test_harness.h).
#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attest/policy.h"
#include "base/file.h"
#include "crypto/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/cli.h"
#include "sdk/client_test_harness.h"
#include "sdk/model_dir.h"
#include "sdk/npy.h"

namespace cloister::sdk::client_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---- The CLI against the peer. ----

struct CliRun {
  int exit_code;
  std::string out;
  std::string err;
};

class CliAgainstPeerTest : public ClientTest {
 protected:
  CliRun Run(std::vector<std::string> args) {
    std::ostringstream out, err;
    CliIo io{out, err, env_, false};
    int code = RunCli(args, io);
    return {code, out.str(), err.str()};
  }
  void SetUp() override {
    ClientTest::SetUp();
    env_ = {{"CLOISTER_SERVER", server_address_},
            {"CLOISTER_TENANT", kTenant},
            {"CLOISTER_TOKEN_FILE", token_path_},
            {"CLOISTER_POLICY", policy_path_},
            {"CLOISTER_KEY", key_path_}};
  }
  std::map<std::string, std::string> env_;
};

TEST_F(CliAgainstPeerTest, Attest) {
  CliRun json = Run({"attest", "--json"});
  ASSERT_EQ(json.exit_code, kExitOk) << json.err;
  EXPECT_THAT(json.out, StartsWith("{\"verdict\":\"pass\",\"checks\":[{\"name\":"));
  EXPECT_EQ(std::count(json.out.begin(), json.out.end(), '\n'), 1);

  CliRun human = Run({"attest", "--fresh"});
  ASSERT_EQ(human.exit_code, kExitOk) << human.err;
  EXPECT_THAT(human.out, StartsWith("attestation: PASS\n  [pass] "));

  ASSERT_TRUE(attest::WriteDevPolicy(policy_path_, sim_dir(), Bytes(48, 0x11)).ok());
  CliRun failed = Run({"attest", "--json"});
  EXPECT_EQ(failed.exit_code, kExitRefused);
  EXPECT_THAT(failed.out, StartsWith("{\"verdict\":\"fail\""));
  EXPECT_THAT(failed.out, HasSubstr("\"result\":\"fail\""));
  EXPECT_THAT(failed.err, StartsWith("cloister: attestation failed: "));

  CliRun upload = Run({"upload", "--model", token_path_, "--name", "m"});
  EXPECT_EQ(upload.exit_code, kExitRefused);
  EXPECT_THAT(upload.err, StartsWith("cloister: attestation failed: "));
}

TEST_F(CliAgainstPeerTest, UploadModelsInferDelete) {
  std::string model = WriteModel("model.onnx", Bytes(5000, 1));
  CliRun upload = Run({"upload", "--model", model, "--name", "echo", "--json"});
  ASSERT_EQ(upload.exit_code, kExitOk) << upload.err;
  EXPECT_THAT(upload.out, StartsWith("{\"name\":\"echo\",\"handle\":\""));
  EXPECT_THAT(upload.out,
              HasSubstr(absl::StrCat("\"size\":5000,\"kind\":\"onnx\",\"digest\":\"",
                                     HexEncode(crypto::Sha256(Bytes(5000, 1))),
                                     "\",\"published\":false,\"inputs\":[{\"name\":\"x\",\"datatype\":"
                                     "\"FP32\",\"shape\":[-1,3]}]")));

  CliRun models = Run({"models"});
  ASSERT_EQ(models.exit_code, kExitOk) << models.err;
  EXPECT_THAT(models.out, StartsWith("echo  (onnx, handle "));
  EXPECT_THAT(models.out,
              HasSubstr("\n  digest  sha256:" + HexEncode(crypto::Sha256(Bytes(5000, 1))) + "\n"));
  EXPECT_THAT(models.out, HasSubstr("  input   x  FP32 [?, 3]\n"));
  CliRun models_json = Run({"models", "--json"});
  EXPECT_THAT(models_json.out, StartsWith("{\"models\":[{\"name\":\"echo\""));

  std::string input = dir_ + "/x.npy";
  ASSERT_TRUE(WriteNpyFile(input, NpyArray{"INT32", {1, 2}, Bytes{1, 0, 0, 0, 2, 0, 0, 0}}).ok());
  std::string out_dir = dir_ + "/out";
  CliRun infer =
      Run({"infer", "--model", "echo", "--input", "x=" + input, "--output-dir", out_dir});
  ASSERT_EQ(infer.exit_code, kExitOk) << infer.err;
  auto written = ReadNpyFile(out_dir + "/x_out.npy");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->datatype, "INT32");
  EXPECT_EQ(written->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(written->data, (Bytes{1, 0, 0, 0, 2, 0, 0, 0}));

  CliRun infer_json = Run({"infer", "--model", "echo", "--input", "x=" + input, "--json"});
  ASSERT_EQ(infer_json.exit_code, kExitOk) << infer_json.err;
  EXPECT_EQ(infer_json.out,
            "{\"outputs\":[{\"name\":\"x_out\",\"datatype\":\"INT32\",\"shape\":[1,2],"
            "\"data\":[1,2]}]}\n");

  CliRun deleted = Run({"delete", "--model", "echo", "--json"});
  ASSERT_EQ(deleted.exit_code, kExitOk) << deleted.err;
  EXPECT_EQ(deleted.out, "{\"deleted\":\"echo\"}\n");
  CliRun missing = Run({"infer", "--model", "echo", "--input", "x=" + input, "--json"});
  EXPECT_EQ(missing.exit_code, kExitRefused);
  EXPECT_EQ(missing.err, "cloister: no such model for this identity\n");
  EXPECT_EQ(missing.out, "");
  CliRun none = Run({"models"});
  EXPECT_EQ(none.out, "no models\n");
}

TEST_F(CliAgainstPeerTest, UploadsACheckpointFolder) {
  std::string folder = dir_ + "/tiny";
  ASSERT_TRUE(MakeDirs(folder).ok());
  WriteModel("tiny/config.json", ToBytes("{}"));
  WriteModel("tiny/tokenizer.json", ToBytes("{}"));
  WriteModel("tiny/model.safetensors", Bytes(100, 7));
  auto package = PackModelDir(folder, uint64_t{1} << 20);
  ASSERT_TRUE(package.ok()) << package.status();
  std::string digest = HexEncode(crypto::Sha256(*package));
  CliRun upload = Run({"upload", "--model", folder, "--name", "tiny"});
  ASSERT_EQ(upload.exit_code, kExitOk) << upload.err;
  EXPECT_THAT(upload.out, StartsWith("uploaded tiny  (llm, handle "));
  EXPECT_THAT(upload.out, HasSubstr("\n  digest  sha256:" + digest + "\n"));
  EXPECT_THAT(upload.out, HasSubstr("generative model"));
  CliRun models = Run({"models", "--json"});
  ASSERT_EQ(models.exit_code, kExitOk) << models.err;
  EXPECT_THAT(models.out, HasSubstr("\"kind\":\"llm\",\"digest\":\"" + digest + "\""));
}

TEST_F(CliAgainstPeerTest, SeveralServers) {
  std::string closed = ClosedAddress();
  CliRun flag = Run({"attest", "--json", "--server", closed + "," + server_address_});
  ASSERT_EQ(flag.exit_code, kExitOk) << flag.err;
  EXPECT_THAT(flag.out, StartsWith("{\"verdict\":\"pass\""));
  env_["CLOISTER_SERVER"] = closed + "," + server_address_;
  CliRun models = Run({"models"});
  ASSERT_EQ(models.exit_code, kExitOk) << models.err;
  EXPECT_EQ(models.out, "no models\n");
  EXPECT_EQ(peer_->open_sessions.load(), 1);
  env_["CLOISTER_SERVER"] = server_address_ + ",";
  CliRun bad = Run({"models"});
  EXPECT_EQ(bad.exit_code, kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr("has an empty entry"));
}

TEST_F(CliAgainstPeerTest, WrongTokenIsARefusal) {
  env_["CLOISTER_TOKEN_FILE"] = dir_ + "/bad-token";
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/bad-token", "nope\n").ok());
  CliRun run = Run({"models"});
  EXPECT_EQ(run.exit_code, kExitRefused);
  EXPECT_EQ(run.err, "cloister: GetEvidence: unknown tenant or wrong API token\n");
}

TEST_F(CliAgainstPeerTest, GenerateStreamsTheTextOrPrintsOneDocument) {
  std::string model = WriteModel("llm.bin", Bytes(100, 7));
  ASSERT_EQ(Run({"upload", "--model", model, "--name", "llm"}).exit_code, kExitOk);

  CliRun text = Run({"generate", "--model", "llm", "--prompt", "hello"});
  ASSERT_EQ(text.exit_code, kExitOk) << text.err;
  EXPECT_EQ(text.out, "hello\n");
  EXPECT_EQ(text.err, "");

  CliRun json = Run({"generate", "--model", "llm", "--prompt", "hi", "--json"});
  ASSERT_EQ(json.exit_code, kExitOk) << json.err;
  EXPECT_EQ(json.out,
            "{\"ids\":[104,105],\"text\":\"hi\",\"finish_reason\":\"stop\",\"usage\":{"
            "\"prompt_tokens\":2,\"cached_tokens\":0,\"completion_tokens\":2},"
            "\"receipt\":\"cGVlciByZWNlaXB0\",\"receipt_signature\":\"cGVlciBzaWduYXR1cmU=\"}\n");

  // The flags reach the enclave as a GenerateRequest.
  std::string chat = dir_ + "/chat.json";
  ASSERT_TRUE(WriteFileAtomic(chat, R"([{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "why?"}])")
                  .ok());
  CliRun chatted = Run({"generate", "--model", "llm", "--chat", chat, "--max-tokens", "3",
                        "--temperature", "0.5", "--top-p", "0.9", "--top-k", "40", "--seed",
                        "18446744073709551615", "--stop", "x", "--stop", "y z"});
  ASSERT_EQ(chatted.exit_code, kExitOk) << chatted.err;
  EXPECT_EQ(chatted.out, "why\n");
  api::GenerateRequest sent = peer_->last_generate_request();
  ASSERT_EQ(sent.chat().messages_size(), 2);
  EXPECT_EQ(sent.chat().messages(0).role(), "system");
  EXPECT_EQ(sent.chat().messages(1).content(), "why?");
  EXPECT_EQ(sent.max_tokens(), 3u);
  EXPECT_FLOAT_EQ(sent.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(sent.sampling().top_p(), 0.9f);
  EXPECT_EQ(sent.sampling().top_k(), 40);
  EXPECT_EQ(sent.sampling().seed(), 18446744073709551615u);
  EXPECT_THAT(sent.stop(), ::testing::ElementsAre("x", "y z"));

  CliRun ids = Run({"generate", "--model", "llm", "--prompt-ids", "1, 2,3"});
  ASSERT_EQ(ids.exit_code, kExitOk) << ids.err;
  EXPECT_EQ(ids.out, "[1][2][3]\n");
  EXPECT_FALSE(peer_->last_generate_request().sampling().has_seed());
}

TEST_F(CliAgainstPeerTest, GenerateRefusals) {
  CliRun unknown = Run({"generate", "--model", "nope", "--prompt", "x"});
  EXPECT_EQ(unknown.exit_code, kExitRefused);
  EXPECT_THAT(unknown.err, StartsWith("cloister: model not found: no model 'nope' uploaded"));
  EXPECT_EQ(unknown.out, "");

  std::string model = WriteModel("llm.bin", Bytes(100, 7));
  ASSERT_EQ(Run({"upload", "--model", model, "--name", "llm"}).exit_code, kExitOk);
  // The text that passed its checks is printed, its line ended, and the error reported.
  peer_->SetStreamFault(EnclavePeer::StreamFault::kDropChunk1);
  CliRun dropped = Run({"generate", "--model", "llm", "--prompt", "hello"});
  EXPECT_EQ(dropped.exit_code, kExitRefused);
  EXPECT_EQ(dropped.out, "h\n");
  EXPECT_THAT(dropped.err, StartsWith("cloister: generation stream of request "));
  EXPECT_THAT(dropped.err, HasSubstr("chunk 1 is missing"));
  EXPECT_EQ(std::count(dropped.err.begin(), dropped.err.end(), '\n'), 1);
  peer_->SetStreamFault(EnclavePeer::StreamFault::kNoFinal);
  CliRun cut = Run({"generate", "--model", "llm", "--prompt", "hello", "--json"});
  EXPECT_EQ(cut.exit_code, kExitRefused);
  EXPECT_EQ(cut.out, "");
  EXPECT_THAT(cut.err, HasSubstr("generation stream ended without its final chunk"));
}

}  // namespace
}  // namespace cloister::sdk::client_test

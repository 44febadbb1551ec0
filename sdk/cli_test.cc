// Tests of the `cloister` command line that need no server: usage, flags, environment
// fallbacks, keygen, the checks on local input that run before any connection, output
// formatting, and the exit status when the server cannot be reached. The commands that talk
// to an enclave are covered by client_test.cc (in-process peer) and the lead's end-to-end tests.
#include "sdk/cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "attest/policy.h"
#include "attest/sim/sim_tee.h"
#include "base/file.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/cli_internal.h"
#include "sdk/identity.h"
#include "sdk/npy.h"
#include "tests/support/temp_dir.h"

namespace cloister::sdk {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct CliRun {
  int exit_code;
  std::string out;
  std::string err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cloister::testing::MakeTempDir("cli-test");
    ASSERT_FALSE(dir_.empty());
  }

  CliRun Run(std::vector<std::string> args) {
    std::ostringstream out, err;
    CliIo io{out, err, env_, false};
    int code = RunCli(args, io);
    CliRun run{code, out.str(), err.str()};
    // Every failure is exactly one line on stderr starting "cloister: ".
    if (code != kExitOk && !run.err.empty() && args.size() > 0) {
      EXPECT_THAT(run.err, StartsWith("cloister: "));
      EXPECT_EQ(run.err.find('\n'), run.err.size() - 1) << run.err;
    }
    return run;
  }

  std::string WriteText(const std::string& name, const std::string& text, int mode = 0600) {
    std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(path, text, mode).ok());
    return path;
  }

  std::string WriteNpy(const std::string& name, const NpyArray& array) {
    std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteNpyFile(path, array).ok());
    return path;
  }

  // A token file, an identity key and a development policy that loads, so that a command
  // gets as far as connecting.
  void WriteConnectionFiles() {
    token_ = WriteText("token", "s3cret-token\n");
    key_ = dir_ + "/tenant.key";
    ASSERT_TRUE(TenantIdentity::Generate().Save(key_).ok());
    std::string sim_dir = dir_ + "/sim";
    ASSERT_TRUE(attest::EnsureSimRoots(sim_dir).ok());
    policy_ = dir_ + "/policy.yaml";
    ASSERT_TRUE(attest::WriteDevPolicy(policy_, sim_dir, Bytes(48, 0xab)).ok());
  }

  std::vector<std::string> Connection(const std::string& server = "127.0.0.1:1") {
    return {"--server", server,  "--tenant", "demo", "--token-file", token_,
            "--policy", policy_, "--key",    key_,   "--timeout",    "5"};
  }

  std::string dir_;
  std::map<std::string, std::string> env_;
  std::string token_, key_, policy_;
};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(CliTest, HelpAndUsage) {
  CliRun help = Run({"--help"});
  EXPECT_EQ(help.exit_code, kExitOk);
  EXPECT_THAT(help.out, HasSubstr("subcommands:"));
  EXPECT_THAT(help.out, HasSubstr("CLOISTER_TOKEN_FILE"));
  EXPECT_EQ(Run({"-h"}).exit_code, kExitOk);

  CliRun none = Run({});
  EXPECT_EQ(none.exit_code, kExitUsage);
  EXPECT_THAT(none.err, HasSubstr("usage: cloister"));

  for (const char* sub : {"keygen", "attest", "upload", "models", "infer", "generate", "delete"}) {
    SCOPED_TRACE(sub);
    CliRun run = Run({sub, "--help"});
    EXPECT_EQ(run.exit_code, kExitOk);
    EXPECT_THAT(run.out, StartsWith(absl::StrCat("usage: cloister ", sub)));
    CliRun via_help = Run({"help", sub});
    EXPECT_EQ(via_help.exit_code, kExitOk);
    EXPECT_EQ(via_help.out, run.out);
  }
}

TEST_F(CliTest, BadUsageExitsWithTwo) {
  CliRun unknown = Run({"frobnicate"});
  EXPECT_EQ(unknown.exit_code, kExitUsage);
  EXPECT_THAT(unknown.err, HasSubstr("unknown subcommand 'frobnicate'"));

  CliRun bad_flag = Run({"models", "--colour"});
  EXPECT_EQ(bad_flag.exit_code, kExitUsage);
  EXPECT_THAT(bad_flag.err, HasSubstr("unknown flag --colour for `cloister models`"));

  // A flag of another subcommand is not accepted.
  EXPECT_EQ(Run({"models", "--input", "x=y.npy"}).exit_code, kExitUsage);
  CliRun no_value = Run({"upload", "--model"});
  EXPECT_EQ(no_value.exit_code, kExitUsage);
  EXPECT_THAT(no_value.err, HasSubstr("flag --model needs a value"));
  CliRun twice = Run({"upload", "--name", "a", "--name=b"});
  EXPECT_EQ(twice.exit_code, kExitUsage);
  EXPECT_THAT(twice.err, HasSubstr("given more than once"));
  CliRun bool_value = Run({"attest", "--json=yes"});
  EXPECT_EQ(bool_value.exit_code, kExitUsage);
  EXPECT_THAT(bool_value.err, HasSubstr("takes no value"));
  CliRun positional = Run({"models", "extra"});
  EXPECT_EQ(positional.exit_code, kExitUsage);
  EXPECT_THAT(positional.err, HasSubstr("unexpected argument 'extra'"));
}

TEST_F(CliTest, KeygenWritesKeyAndRefusesOverwrite) {
  std::string path = dir_ + "/tenant.key";
  CliRun run = Run({"keygen", "--key", path});
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  auto identity = TenantIdentity::Load(path);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_THAT(run.out, HasSubstr("public key: " + identity->public_key_hex()));
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  CliRun again = Run({"keygen", "--key", path, "--json"});
  EXPECT_EQ(again.exit_code, kExitRefused);
  EXPECT_THAT(again.err, HasSubstr("refusing to overwrite"));
  EXPECT_EQ(again.out, "");
  // The first key is untouched.
  EXPECT_EQ(TenantIdentity::Load(path)->public_key(), identity->public_key());
}

TEST_F(CliTest, KeygenJsonAndEnvironmentFallback) {
  std::string path = dir_ + "/env.key";
  env_["CLOISTER_KEY"] = path;
  CliRun run = Run({"keygen", "--json"});
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  auto identity = TenantIdentity::Load(path);
  ASSERT_TRUE(identity.ok());
  EXPECT_EQ(run.out, absl::StrCat("{\"key\":\"", path, "\",\"public_key\":\"",
                                  identity->public_key_hex(), "\"}\n"));
  // The flag wins over the environment.
  std::string other = dir_ + "/flag.key";
  EXPECT_EQ(Run({"keygen", "--key", other}).exit_code, kExitOk);
  EXPECT_TRUE(FileExists(other));

  env_.clear();
  CliRun missing = Run({"keygen"});
  EXPECT_EQ(missing.exit_code, kExitUsage);
  EXPECT_THAT(missing.err, HasSubstr("pass --key or set CLOISTER_KEY"));
}

TEST_F(CliTest, InferChecksInputsBeforeConnecting) {
  CliRun no_model = Run({"infer", "--input", "x=a.npy"});
  EXPECT_EQ(no_model.exit_code, kExitUsage);
  EXPECT_THAT(no_model.err, HasSubstr("needs --model"));

  CliRun no_input = Run({"infer", "--model", "m"});
  EXPECT_EQ(no_input.exit_code, kExitUsage);
  EXPECT_THAT(no_input.err, HasSubstr("at least one --input"));

  for (const char* spec : {"x", "=a.npy", "x="}) {
    CliRun bad_spec = Run({"infer", "--model", "m", "--input", spec});
    EXPECT_EQ(bad_spec.exit_code, kExitUsage) << spec;
    EXPECT_THAT(bad_spec.err, HasSubstr("NAME=FILE.npy"));
  }

  std::string missing = dir_ + "/missing.npy";
  CliRun missing_file = Run({"infer", "--model", "m", "--input", "x=" + missing});
  EXPECT_EQ(missing_file.exit_code, kExitUsage);
  EXPECT_THAT(missing_file.err, HasSubstr(missing));

  // A version 1.0 header that announces 16 bytes but holds fewer.
  std::string malformed =
      WriteText("bad.npy", std::string("\x93NUMPY\x01\x00\x10\x00{'descr'", 18), 0644);
  CliRun malformed_run = Run({"infer", "--model", "m", "--input", "x=" + malformed});
  EXPECT_EQ(malformed_run.exit_code, kExitUsage);
  EXPECT_THAT(malformed_run.err, HasSubstr(malformed + ": "));

  std::string good = WriteNpy("good.npy", NpyArray{"FP32", {2}, Bytes(8, 0)});
  CliRun duplicate = Run({"infer", "--model", "m", "--input", "x=" + good, "--input", "x=" + good});
  EXPECT_EQ(duplicate.exit_code, kExitUsage);
  EXPECT_THAT(duplicate.err, HasSubstr("input 'x' given more than once"));

  CliRun both =
      Run({"infer", "--model", "m", "--input", "x=" + good, "--json", "--output-dir", dir_});
  EXPECT_EQ(both.exit_code, kExitUsage);
  EXPECT_THAT(both.err, HasSubstr("exclude each other"));
}

TEST_F(CliTest, MissingConnectionSettingsAreUsageErrors) {
  std::string good = WriteNpy("good.npy", NpyArray{"INT64", {1}, Bytes(8, 0)});
  std::vector<std::string> infer = {"infer", "--model", "m", "--input", "x=" + good, "--json"};
  CliRun no_tenant = Run(infer);
  EXPECT_EQ(no_tenant.exit_code, kExitUsage);
  EXPECT_THAT(no_tenant.err, HasSubstr("no tenant id given: pass --tenant or set CLOISTER_TENANT"));

  env_["CLOISTER_TENANT"] = "demo";
  CliRun no_token = Run(infer);
  EXPECT_EQ(no_token.exit_code, kExitUsage);
  EXPECT_THAT(no_token.err, HasSubstr("no token file given"));

  env_["CLOISTER_TOKEN_FILE"] = dir_ + "/no-token";
  CliRun no_policy = Run(infer);
  EXPECT_EQ(no_policy.exit_code, kExitUsage);
  EXPECT_THAT(no_policy.err, HasSubstr("no attestation policy given"));

  env_["CLOISTER_POLICY"] = dir_ + "/no-policy.yaml";
  CliRun unreadable_token = Run(infer);
  EXPECT_EQ(unreadable_token.exit_code, kExitUsage);
  EXPECT_THAT(unreadable_token.err, HasSubstr("cannot read token file"));

  env_["CLOISTER_TOKEN_FILE"] = WriteText("empty-token", "  \n");
  CliRun empty_token = Run(infer);
  EXPECT_EQ(empty_token.exit_code, kExitUsage);
  EXPECT_THAT(empty_token.err, HasSubstr("is empty"));

  env_["CLOISTER_TOKEN_FILE"] = WriteText("token", "abc\n");
  CliRun no_policy_file = Run(infer);
  EXPECT_EQ(no_policy_file.exit_code, kExitUsage);
  EXPECT_THAT(no_policy_file.err, HasSubstr("no-policy.yaml"));

  env_["CLOISTER_POLICY"] = WriteText("policy.yaml", "name: [unclosed\n", 0644);
  CliRun bad_policy = Run(infer);
  EXPECT_EQ(bad_policy.exit_code, kExitUsage);
  EXPECT_THAT(bad_policy.err, HasSubstr("policy.yaml"));

  CliRun bad_timeout = Run({"models", "--timeout", "soon"});
  EXPECT_EQ(bad_timeout.exit_code, kExitUsage);

  // CLOISTER_SPREAD takes 1/true/0/false; anything else is a one-line usage error.
  env_["CLOISTER_SPREAD"] = "sometimes";
  CliRun bad_spread = Run({"models"});
  EXPECT_EQ(bad_spread.exit_code, kExitUsage);
  EXPECT_THAT(bad_spread.err,
              HasSubstr("CLOISTER_SPREAD must be 1, true, 0 or false, not 'sometimes'"));
  EXPECT_EQ(std::count(bad_spread.err.begin(), bad_spread.err.end(), '\n'), 1) << bad_spread.err;
  env_.erase("CLOISTER_SPREAD");
}

TEST_F(CliTest, KeyProblemsAreUsageErrors) {
  WriteConnectionFiles();
  std::vector<std::string> args = Concat({"models"}, Connection());
  ASSERT_EQ(::chmod(key_.c_str(), 0644), 0);
  CliRun open_key = Run(args);
  EXPECT_EQ(open_key.exit_code, kExitUsage);
  EXPECT_THAT(open_key.err, HasSubstr("chmod 600"));

  std::string garbage = WriteText("garbage.key", "not a key\n");
  std::vector<std::string> with_garbage = {"models", "--server",     "127.0.0.1:1", "--tenant",
                                           "demo",   "--token-file", token_,        "--policy",
                                           policy_,  "--key",        garbage};
  CliRun bad_key = Run(with_garbage);
  EXPECT_EQ(bad_key.exit_code, kExitUsage);
  EXPECT_THAT(bad_key.err, HasSubstr("not a cloister identity key"));
}

TEST_F(CliTest, UploadChecksModelFileBeforeConnecting) {
  WriteConnectionFiles();
  CliRun missing =
      Run(Concat({"upload", "--model", dir_ + "/none.onnx", "--name", "m"}, Connection()));
  EXPECT_EQ(missing.exit_code, kExitUsage);
  EXPECT_THAT(missing.err, HasSubstr("none.onnx"));
  // A folder is a checkpoint to pack: this one (connection files only) is not one.
  CliRun directory = Run(Concat({"upload", "--model", dir_, "--name", "m"}, Connection()));
  EXPECT_EQ(directory.exit_code, kExitUsage);
  EXPECT_EQ(directory.err,
            "cloister: model folder " + dir_ +
                " has no config.json (a checkpoint folder holds config.json, tokenizer.json and "
                "model.safetensors (or its shards with model.safetensors.index.json))\n");
  CliRun no_name = Run(Concat({"upload", "--model", token_}, Connection()));
  EXPECT_EQ(no_name.exit_code, kExitUsage);
}

TEST_F(CliTest, UploadChecksTheCheckpointFolderBeforeConnecting) {
  WriteConnectionFiles();
  std::string folder = dir_ + "/checkpoint";
  ASSERT_EQ(::mkdir(folder.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomic(folder + "/config.json", "{}").ok());
  ASSERT_TRUE(WriteFileAtomic(folder + "/model.safetensors", "w").ok());
  CliRun no_tokenizer = Run(Concat({"upload", "--model", folder, "--name", "m"}, Connection()));
  EXPECT_EQ(no_tokenizer.exit_code, kExitUsage);
  EXPECT_THAT(no_tokenizer.err, HasSubstr("has no tokenizer.json"));
  ASSERT_EQ(::symlink((folder + "/config.json").c_str(), (folder + "/tokenizer.json").c_str()), 0);
  CliRun linked = Run(Concat({"upload", "--model", folder, "--name", "m"}, Connection()));
  EXPECT_EQ(linked.exit_code, kExitUsage);
  EXPECT_EQ(linked.err, "cloister: " + folder +
                            "/tokenizer.json is a symbolic link: copy the file itself into the "
                            "folder (links are not followed)\n");
  // A checkpoint: the folder passes, and the failure is the unreachable server's.
  ASSERT_EQ(::unlink((folder + "/tokenizer.json").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(folder + "/tokenizer.json", "{}").ok());
  CliRun unreachable = Run(Concat({"upload", "--model", folder, "--name", "m"}, Connection()));
  EXPECT_EQ(unreachable.exit_code, kExitRefused);
  EXPECT_THAT(unreachable.err, HasSubstr("cannot reach cloisterd"));
}

TEST_F(CliTest, UnreachableServerIsARefusal) {
  WriteConnectionFiles();
  CliRun attest = Run(Concat({"attest", "--json"}, Connection()));
  EXPECT_EQ(attest.exit_code, kExitRefused);
  EXPECT_THAT(attest.err, HasSubstr("cannot reach cloisterd at 127.0.0.1:1"));
  EXPECT_EQ(attest.out, "");

  std::string input = WriteNpy("in.npy", NpyArray{"UINT8", {3}, Bytes{1, 2, 3}});
  CliRun infer = Run(Concat({"infer", "--model", "m", "--input", "x=" + input}, Connection()));
  EXPECT_EQ(infer.exit_code, kExitRefused);
  EXPECT_THAT(infer.err, HasSubstr("cannot reach cloisterd"));
}

TEST_F(CliTest, GenerateChecksItsFlagsBeforeConnecting) {
  CliRun no_model = Run({"generate", "--prompt", "hi"});
  EXPECT_EQ(no_model.exit_code, kExitUsage);
  EXPECT_EQ(no_model.err, "cloister: `cloister generate` needs --model\n");

  CliRun no_prompt = Run({"generate", "--model", "m"});
  EXPECT_EQ(no_prompt.exit_code, kExitUsage);
  EXPECT_THAT(no_prompt.err, HasSubstr("needs a prompt: --prompt TEXT, --chat FILE.json or"));

  std::string chat = WriteText("chat.json", R"([{"role": "user", "content": "hi"}])");
  for (const std::vector<std::string>& two :
       {std::vector<std::string>{"--prompt", "a", "--chat", chat},
        std::vector<std::string>{"--prompt", "a", "--prompt-ids", "1"},
        std::vector<std::string>{"--chat", chat, "--prompt-ids", "1"}}) {
    CliRun both = Run(Concat({"generate", "--model", "m"}, two));
    EXPECT_EQ(both.exit_code, kExitUsage);
    EXPECT_THAT(both.err, HasSubstr("exclude each other: give one prompt"));
  }
  CliRun twice = Run({"generate", "--model", "m", "--prompt", "a", "--prompt", "b"});
  EXPECT_EQ(twice.exit_code, kExitUsage);
  EXPECT_THAT(twice.err, HasSubstr("flag --prompt given more than once"));

  const struct {
    std::vector<std::string> flags;
    const char* error;
  } bad[] = {
      {{"--max-tokens", "0"}, "--max-tokens must be a whole number of tokens from 1, not '0'"},
      {{"--max-tokens", "-3"}, "--max-tokens must be a whole number"},
      {{"--max-tokens", "+3"}, "--max-tokens must be a whole number"},
      {{"--max-tokens", "ten"}, "--max-tokens must be a whole number"},
      {{"--temperature", "2.5"}, "--temperature must be a number in [0, 2], not '2.5'"},
      {{"--temperature", "-0.1"}, "--temperature must be a number in [0, 2]"},
      {{"--temperature", "nan"}, "--temperature must be a number in [0, 2]"},
      {{"--temperature", "warm"}, "--temperature must be a number in [0, 2]"},
      {{"--top-p", "0"}, "--top-p must be a number in (0, 1], not '0'"},
      {{"--top-p", "1.01"}, "--top-p must be a number in (0, 1]"},
      {{"--top-k", "-1"}, "--top-k must be a whole number from 0 (0: off), not '-1'"},
      {{"--top-k", "4.5"}, "--top-k must be a whole number from 0"},
      {{"--seed", "-1"}, "--seed must be a whole number from 0 to 18446744073709551615"},
      {{"--seed", "18446744073709551616"}, "--seed must be a whole number"},
      {{"--stop", "x", "--stop", ""}, "--stop wants a non-empty string"},
      {{"--max-tokens"}, "flag --max-tokens needs a value"},
      {{"--temp", "1"}, "unknown flag --temp for `cloister generate`"},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.error);
    CliRun run = Run(Concat({"generate", "--model", "m", "--prompt", "hi"}, c.flags));
    EXPECT_EQ(run.exit_code, kExitUsage);
    EXPECT_THAT(run.err, HasSubstr(c.error));
  }
  for (const char* ids : {"", "1,,2", "1,a", "-1", "1,2,", "99999999999"}) {
    SCOPED_TRACE(ids);
    CliRun run = Run({"generate", "--model", "m", "--prompt-ids", ids});
    EXPECT_EQ(run.exit_code, kExitUsage);
    EXPECT_THAT(run.err, HasSubstr("--prompt-ids wants token ids from 0, comma-separated"));
  }
}

TEST_F(CliTest, GenerateChecksTheChatFile) {
  const struct {
    const char* contents;
    const char* error;
  } bad[] = {
      {"[{\"role\": \"user\", \"content\": \"hi\"}", "is not valid JSON"},
      {"{\"role\": \"user\", \"content\": \"hi\"}", "must hold a JSON list of"},
      {"[]", "(it is an empty list)"},
      {"[\"hi\"]", "message 1 is not an object"},
      {"[{\"role\": \"user\", \"content\": \"a\"}, {\"content\": \"b\"}]", "message 2 has no role"},
      {"[{\"role\": \"\", \"content\": \"b\"}]", "message 1 has no role"},
      {"[{\"role\": \"user\"}]", "message 1 has no content"},
      {"[{\"role\": \"user\", \"content\": 3}]", "message 1: content is not a string"},
      {"[{\"role\": \"user\", \"content\": \"a\", \"name\": \"b\"}]",
       "message 1 has an unknown key \"name\" (a message has role and content)"},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.contents);
    std::string path = WriteText("chat.json", c.contents);
    CliRun run = Run({"generate", "--model", "m", "--chat", path});
    EXPECT_EQ(run.exit_code, kExitUsage);
    EXPECT_THAT(run.err, HasSubstr("--chat file " + path));
    EXPECT_THAT(run.err, HasSubstr(c.error));
  }
  CliRun missing = Run({"generate", "--model", "m", "--chat", dir_ + "/none.json"});
  EXPECT_EQ(missing.exit_code, kExitUsage);
  EXPECT_THAT(missing.err, HasSubstr("cannot read --chat file"));
  EXPECT_THAT(missing.err, HasSubstr("none.json"));
}

TEST_F(CliTest, GenerateWithGoodFlagsGetsAsFarAsConnecting) {
  WriteConnectionFiles();
  std::string chat = WriteText("chat.json", R"([{"role": "user", "content": "hi"}])");
  CliRun run = Run(Concat(
      {"generate", "--model", "m", "--chat", chat, "--temperature", "0", "--top-p", "1", "--json"},
      Connection()));
  EXPECT_EQ(run.exit_code, kExitRefused);
  EXPECT_THAT(run.err, HasSubstr("cannot reach cloisterd"));
  EXPECT_EQ(run.out, "");
}

// Parses generate's flags as RunCli does.
absl::StatusOr<cloister::api::v1::GenerateRequest> GenerateRequestOf(
    const std::vector<std::string>& args) {
  const cli_internal::Subcommand* sub = cli_internal::FindSubcommand("generate");
  CLOISTER_CHECK(sub != nullptr);
  absl::StatusOr<cli_internal::Flags> flags = cli_internal::ParseFlags(*sub, args);
  if (!flags.ok()) return flags.status();
  return cli_internal::GenerateRequestFromFlags(*flags);
}

TEST(CliGenerateTest, FlagsMakeTheRequest) {
  auto plain = GenerateRequestOf({"--model", "m", "--prompt", ""});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->has_text());  // an empty prompt is a prompt
  EXPECT_EQ(plain->max_tokens(), 0u);
  EXPECT_FALSE(plain->sampling().has_temperature());
  EXPECT_FALSE(plain->sampling().has_top_p());
  EXPECT_FALSE(plain->sampling().has_seed());
  EXPECT_EQ(plain->stop_size(), 0);

  auto full = GenerateRequestOf({"--model", "m", "--prompt-ids", " 7,0 ,2147483647",
                                 "--max-tokens=12", "--temperature", "0", "--top-p", "0.25",
                                 "--top-k", "5", "--seed", "0", "--stop", "\n\n", "--stop", "."});
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_THAT(full->ids().ids(), ::testing::ElementsAre(7, 0, 2147483647));
  EXPECT_EQ(full->max_tokens(), 12u);
  EXPECT_TRUE(full->sampling().has_temperature());
  EXPECT_EQ(full->sampling().temperature(), 0.0f);
  EXPECT_FLOAT_EQ(full->sampling().top_p(), 0.25f);
  EXPECT_EQ(full->sampling().top_k(), 5);
  EXPECT_TRUE(full->sampling().has_seed());
  EXPECT_EQ(full->sampling().seed(), 0u);
  EXPECT_THAT(full->stop(), ::testing::ElementsAre("\n\n", "."));
}

TEST(CliGenerateTest, ResultAsJson) {
  GenerateResult result;
  result.ids = {1, 22, 333};
  result.text = "say \"hi\"\n";
  result.finish_reason = "length";
  result.usage.set_prompt_tokens(4);
  result.usage.set_cached_tokens(2);
  result.usage.set_completion_tokens(3);
  result.receipt = std::string("\x00\xff", 2);
  result.receipt_signature = "sig";
  EXPECT_EQ(cli_internal::GenerateResultJson(result),
            "{\"ids\":[1,22,333],\"text\":\"say \\\"hi\\\"\\n\",\"finish_reason\":\"length\","
            "\"usage\":{\"prompt_tokens\":4,\"cached_tokens\":2,\"completion_tokens\":3},"
            "\"receipt\":\"AP8=\",\"receipt_signature\":\"c2ln\"}");
  EXPECT_EQ(cli_internal::GenerateResultJson(GenerateResult()),
            "{\"ids\":[],\"text\":\"\",\"finish_reason\":\"\",\"usage\":{\"prompt_tokens\":0,"
            "\"cached_tokens\":0,\"completion_tokens\":0},\"receipt\":\"\","
            "\"receipt_signature\":\"\"}");
}

TEST(CliFormatTest, SanitizesOutputNames) {
  EXPECT_EQ(SanitizeOutputName("logits"), "logits");
  EXPECT_EQ(SanitizeOutputName("Plus214_Output_0"), "Plus214_Output_0");
  EXPECT_EQ(SanitizeOutputName("a/b"), "a_b");
  EXPECT_EQ(SanitizeOutputName("../../etc/passwd"), "___.._etc_passwd");
  EXPECT_EQ(SanitizeOutputName(".hidden"), "_hidden");
  EXPECT_EQ(SanitizeOutputName(".."), "__");
  EXPECT_EQ(SanitizeOutputName("out:0 x"), "out_0_x");
  EXPECT_EQ(SanitizeOutputName(""), "output");
  EXPECT_EQ(SanitizeOutputName("v1.2-final"), "v1.2-final");
}

cloister::api::v1::Tensor MakeTensor(const std::string& datatype, std::vector<int64_t> shape,
                                     Bytes raw) {
  return ToTensor("t", NpyArray{datatype, std::move(shape), std::move(raw)});
}

template <typename T>
Bytes RawOf(std::initializer_list<T> values) {
  Bytes raw;
  for (T value : values) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    raw.insert(raw.end(), bytes, bytes + sizeof(T));
  }
  return raw;
}

TEST(CliFormatTest, TensorsToJson) {
  auto fp32 = TensorToJson(MakeTensor("FP32", {2, 2}, RawOf<float>({1.5f, -2.f, 0.1f, 1e30f})));
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(*fp32,
            "{\"name\":\"t\",\"datatype\":\"FP32\",\"shape\":[2,2],"
            "\"data\":[1.5,-2,0.100000001,1.00000002e+30]}");

  auto fp64 = TensorToJson(MakeTensor("FP64", {2}, RawOf<double>({0.1, -0.0})));
  ASSERT_TRUE(fp64.ok());
  EXPECT_THAT(*fp64, HasSubstr("\"data\":[0.10000000000000001,-0]"));

  // FP16: 1.0, -2.0, the smallest subnormal, +infinity, NaN.
  auto fp16 = TensorToJson(
      MakeTensor("FP16", {5}, RawOf<uint16_t>({0x3c00, 0xc000, 0x0001, 0x7c00, 0x7e00})));
  ASSERT_TRUE(fp16.ok());
  EXPECT_THAT(*fp16, HasSubstr("\"data\":[1,-2,5.9605e-08,null,null]"));

  auto int64 = TensorToJson(
      MakeTensor("INT64", {2}, RawOf<int64_t>({std::numeric_limits<int64_t>::min(), 42})));
  ASSERT_TRUE(int64.ok());
  EXPECT_THAT(*int64, HasSubstr("\"data\":[-9223372036854775808,42]"));

  auto uint64 = TensorToJson(
      MakeTensor("UINT64", {1}, RawOf<uint64_t>({std::numeric_limits<uint64_t>::max()})));
  ASSERT_TRUE(uint64.ok());
  EXPECT_THAT(*uint64, HasSubstr("\"data\":[18446744073709551615]"));

  auto small = TensorToJson(MakeTensor("INT8", {3}, Bytes{0xff, 0x7f, 0x80}));
  ASSERT_TRUE(small.ok());
  EXPECT_THAT(*small, HasSubstr("\"data\":[-1,127,-128]"));

  auto boolean = TensorToJson(MakeTensor("BOOL", {1, 2}, Bytes{1, 0}));
  ASSERT_TRUE(boolean.ok());
  EXPECT_THAT(*boolean, HasSubstr("\"shape\":[1,2],\"data\":[true,false]"));

  auto scalar = TensorToJson(MakeTensor("UINT16", {}, RawOf<uint16_t>({65535})));
  ASSERT_TRUE(scalar.ok());
  EXPECT_THAT(*scalar, HasSubstr("\"shape\":[],\"data\":[65535]"));

  cloister::api::v1::Tensor named = MakeTensor("INT32", {0}, {});
  named.set_name("we\"ird\n");
  auto escaped = TensorToJson(named);
  ASSERT_TRUE(escaped.ok());
  EXPECT_EQ(*escaped,
            "{\"name\":\"we\\\"ird\\n\",\"datatype\":\"INT32\",\"shape\":[0],\"data\":[]}");

  EXPECT_FALSE(TensorToJson(MakeTensor("FP32", {2}, Bytes(7))).ok());
}

}  // namespace
}  // namespace cloister::sdk

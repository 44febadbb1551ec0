// `cloister chat` through the whole appliance (real cloisterd, real cloister-enclave, the shared
// tiny model uploaded from its folder), as a person uses it: in a tmux pane (a real terminal),
// a first turn whose greedy reply must be the reference's for that chat prompt, a second turn
// whose reply must be what `cloister generate --chat` gives for the three messages, /reset (the
// first message then gets its first reply again), /exit with status 0, and Ctrl-C at the prompt
// with status 130. From a pipe, only the replies are printed, and a message that takes the
// conversation past the model's context is refused by the enclave, reported in one line that
// suggests /reset, and leaves the conversation going. Skipped when tmux is not installed.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "host/tenants/tenant_registry.h"
#include "nlohmann/json.hpp"
#include "tests/support/appliance.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace cloister::testing {
namespace {

const std::string kTinyLlama = std::string(CLOISTER_SHARED_DIR) + "/models/llm/tiny-llama";
constexpr char kTenant[] = "acme";
constexpr char kToken[] = "token-of-acme";
constexpr char kSecondMessage[] = "Tell me a fortune about science.";

// The executable `name` on PATH, or "" when there is none.
std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// `text` as a terminal shows it: tabs to the next multiple of 8 columns, and no trailing blanks
// on a line (capture-pane leaves them out).
std::string AsOnScreen(const std::string& text) {
  std::string screen;
  size_t column = 0;
  for (char c : text) {
    if (c == '\t') {
      do {
        screen += ' ';
      } while (++column % 8 != 0);
    } else if (c == '\n') {
      while (!screen.empty() && screen.back() == ' ') screen.pop_back();
      screen += '\n';
      column = 0;
    } else {
      screen += c;
      ++column;
    }
  }
  while (!screen.empty() && screen.back() == ' ') screen.pop_back();
  return screen;
}

class LlmChatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("cloister-llm-chat");
    const std::string config = work_ + "/cloisterd.yaml";
    std::ofstream(config) << "operator:\n  listen: 127.0.0.1:0\ntenants:\n  - id: " << kTenant
                          << "\n    token_sha256: " << HexEncode(host::TokenHash(kToken)) << "\n";
    std::ofstream(work_ + "/token") << kToken << "\n";
    appliance_ = std::make_unique<Appliance>(CLOISTERD_BINARY, work_ + "/data",
                                             std::vector<std::string>{"--config", config});
    absl::Status started = appliance_->Start();
    ASSERT_TRUE(started.ok()) << started;
    auto text = ReadFile(kTinyLlama + "/reference.json", 16 << 20);
    ASSERT_TRUE(text.ok());
    nlohmann::json references = nlohmann::json::parse(*text);
    // The reference chat prompt of one user message.
    for (const auto& prompt : references["prompts"]) {
      if (prompt["kind"] == "chat" && prompt["messages"].size() == 1) {
        first_message_ = prompt["messages"][0]["content"].get<std::string>();
        first_reply_ = prompt["generated_text"].get<std::string>();
        first_prompt_tokens_ = prompt["prompt_ids"].size();
        break;
      }
    }
    ASSERT_FALSE(first_message_.empty()) << "reference.json has no one-message chat prompt";
    ASSERT_EQ(Cli({"keygen"}).exit_code, 0);
    RunResult uploaded = Cli({"upload", "--model", kTinyLlama, "--name", "tiny-llama"});
    ASSERT_EQ(uploaded.exit_code, 0) << uploaded.err;
  }

  std::map<std::string, std::string> Env() const {
    return {{"CLOISTER_SERVER", appliance_->address()},
            {"CLOISTER_POLICY", appliance_->data_dir() + "/dev-policy.yaml"},
            {"CLOISTER_TENANT", kTenant},
            {"CLOISTER_TOKEN_FILE", work_ + "/token"},
            {"CLOISTER_KEY", work_ + "/tenant.key"}};
  }

  RunResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), CLOISTER_CLI_BINARY);
    return testing::Run(args, Env(), absl::Seconds(60));
  }

  // A shell script that runs `cloister chat ARGS` with this tenant's settings, stderr to
  // `name`.err, then writes its exit status to `name`.status.
  std::string ChatScript(const std::string& name, const std::string& args) {
    const std::string path = work_ + "/" + name + ".sh";
    std::ofstream script(path);
    // The shell outlives a Ctrl-C meant for the chat (its children get the default action back).
    script << "trap : INT\n";
    for (const auto& [key, value] : Env()) script << "export " << key << "='" << value << "'\n";
    script << "'" << CLOISTER_CLI_BINARY << "' chat " << args << " 2>'" << work_ << "/" << name
           << ".err'\necho $? > '" << work_ << "/" << name << ".status'\n";
    return path;
  }

  std::string work_;
  std::unique_ptr<Appliance> appliance_;
  std::string first_message_, first_reply_;
  size_t first_prompt_tokens_ = 0;
};

// A tmux server of the test's own (its socket in the work dir), killed at the end.
class Tmux {
 public:
  Tmux(std::string binary, std::string socket)
      : binary_(std::move(binary)), socket_(std::move(socket)) {}
  ~Tmux() { Do({"kill-server"}); }

  RunResult Do(std::vector<std::string> args) {
    args.insert(args.begin(), {binary_, "-S", socket_});
    return Run(args, {}, absl::Seconds(20));
  }
  // The whole pane, history included, wrapped lines joined.
  std::string Capture(const std::string& session) {
    return Do({"capture-pane", "-p", "-J", "-S", "-", "-t", session}).out;
  }
  // Waits until `done` holds for the pane; the last capture either way.
  std::string WaitFor(const std::string& session,
                      const std::function<bool(const std::string&)>& done,
                      absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string pane;
    while (absl::Now() < deadline) {
      pane = Capture(session);
      if (done(pane)) return pane;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return pane;
  }
  void Type(const std::string& session, const std::string& line) {
    ASSERT_EQ(Do({"send-keys", "-t", session, "-l", line}).exit_code, 0);
    ASSERT_EQ(Do({"send-keys", "-t", session, "Enter"}).exit_code, 0);
  }

 private:
  std::string binary_, socket_;
};

size_t Count(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++count;
  }
  return count;
}

// Whether the pane shows `turns` answered turns, the last one whole: its usage line closed and
// the next prompt after it (a capture can land while the line is still being drawn).
bool TurnsDone(const std::string& pane, size_t turns) {
  if (Count(pane, "[tokens: ") != turns) return false;
  return pane.find("]\n> ", pane.rfind("[tokens: ")) != std::string::npos;
}

// Waits for `path` to hold a line and returns it ("" on timeout).
std::string WaitForFile(const std::string& path, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::string text = ReadWholeFile(path);
    if (!text.empty() && text.back() == '\n') return text.substr(0, text.size() - 1);
    absl::SleepFor(absl::Milliseconds(50));
  }
  return "";
}

TEST_F(LlmChatTest, AConversationInATmuxPane) {
  const std::string tmux_binary = FindProgram("tmux");
  if (tmux_binary.empty()) {
    GTEST_SKIP() << "tmux is not installed (scripts/install-deps.sh installs it)";
  }
  // The second turn's reference: generate of the same three messages (generate itself is
  // checked against reference.json by llm_appliance_test).
  nlohmann::json three = nlohmann::json::array({{{"role", "user"}, {"content", first_message_}},
                                                {{"role", "assistant"}, {"content", first_reply_}},
                                                {{"role", "user"}, {"content", kSecondMessage}}});
  std::ofstream(work_ + "/three.json") << three.dump();
  RunResult generated = Cli(
      {"generate", "--model", "tiny-llama", "--chat", work_ + "/three.json", "--temperature", "0"});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  ASSERT_FALSE(generated.out.empty());
  const std::string second_reply = generated.out.substr(0, generated.out.size() - 1);

  Tmux tmux(tmux_binary, work_ + "/tmux.sock");
  const std::string script = ChatScript("chat", "--model tiny-llama --temperature 0 --usage");
  ASSERT_EQ(tmux.Do({"new-session", "-d", "-x", "200", "-y", "50", "-s", "chat", "sh " + script})
                .exit_code,
            0);
  // The server stays up when the chat ends, for the next session: otherwise it exits with its
  // last session and a new-session sent as it does so fails (seen under load).
  ASSERT_EQ(tmux.Do({"set-option", "-s", "exit-empty", "off"}).exit_code, 0);
  // Attested, the model found, and asking.
  std::string pane = tmux.WaitFor("chat", [](const std::string& p) {
    return p.find("chatting with tiny-llama: /reset forgets the conversation") !=
               std::string::npos &&
           p.find("\n> ") != std::string::npos;
  });
  ASSERT_NE(pane.find("\n> "), std::string::npos) << pane << ReadWholeFile(work_ + "/chat.err");

  // Turn one: the reference reply, then its usage line.
  tmux.Type("chat", first_message_);
  pane = tmux.WaitFor("chat", [](const std::string& p) { return TurnsDone(p, 1); });
  const std::string turn_one = absl::StrCat("> ", first_message_, "\n", AsOnScreen(first_reply_),
                                            "\n[tokens: prompt ", first_prompt_tokens_);
  // Then ", completion N]", or " (N cached), ..." when the prefix cache held the start.
  ASSERT_NE(pane.find(turn_one), std::string::npos) << pane;
  ASSERT_TRUE(absl::StrContains(pane, turn_one + ",") || absl::StrContains(pane, turn_one + " ("))
      << pane;

  // Turn two: with the first turn in the conversation.
  tmux.Type("chat", kSecondMessage);
  pane = tmux.WaitFor("chat", [](const std::string& p) { return TurnsDone(p, 2); });
  const std::string turn_two =
      absl::StrCat("> ", kSecondMessage, "\n", AsOnScreen(second_reply), "\n[tokens: prompt ");
  EXPECT_NE(pane.find(turn_two), std::string::npos) << pane;

  // /reset: the first message alone again, so the first reply again.
  tmux.Type("chat", "/reset");
  pane = tmux.WaitFor("chat", [](const std::string& p) {
    return p.find("> /reset\n[conversation forgotten]\n> ") != std::string::npos;
  });
  ASSERT_NE(pane.find("[conversation forgotten]"), std::string::npos) << pane;
  tmux.Type("chat", first_message_);
  pane = tmux.WaitFor("chat", [](const std::string& p) { return TurnsDone(p, 3); });
  EXPECT_EQ(Count(pane, turn_one), 2u) << pane;
  EXPECT_EQ(ReadWholeFile(work_ + "/chat.err"), "");

  tmux.Type("chat", "/exit");
  EXPECT_EQ(WaitForFile(work_ + "/chat.status"), "0");

  // Ctrl-C at the prompt ends the chat with 130.
  const std::string interrupted = ChatScript("interrupted", "--model tiny-llama");
  ASSERT_EQ(tmux.Do({"new-session", "-d", "-x", "200", "-y", "50", "-s", "interrupted",
                     "sh " + interrupted})
                .exit_code,
            0);
  pane = tmux.WaitFor("interrupted",
                      [](const std::string& p) { return p.find("\n> ") != std::string::npos; });
  ASSERT_NE(pane.find("\n> "), std::string::npos) << pane;
  ASSERT_EQ(tmux.Do({"send-keys", "-t", "interrupted", "C-c"}).exit_code, 0);
  EXPECT_EQ(WaitForFile(work_ + "/interrupted.status"), "130");
  EXPECT_EQ(ReadWholeFile(work_ + "/interrupted.err"), "");
}

TEST_F(LlmChatTest, FromAPipeOnlyTheRepliesAndTheContextLimitSaysReset) {
  // Far more tokens than the model's context of 512.
  std::string long_message;
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&long_message, "fortune ");
  const std::string lines = work_ + "/lines.txt";
  std::ofstream(lines) << first_message_ << "\n"
                       << long_message << "\n/reset\n"
                       << first_message_ << "\n";
  RunResult run =
      testing::Run({"/bin/sh", "-c",
                    absl::StrCat("exec '", CLOISTER_CLI_BINARY,
                                 "' chat --model tiny-llama --temperature 0 < '", lines, "'")},
                   Env(), absl::Seconds(60));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, absl::StrCat(first_reply_, "\n", first_reply_, "\n"));
  EXPECT_EQ(Count(run.err, "\n"), 1u) << run.err;
  EXPECT_EQ(
      run.err.rfind("cloister chat: the conversation no longer fits the model's context (", 0), 0u)
      << run.err;
  EXPECT_NE(run.err.find("): /reset to start over\n"), std::string::npos) << run.err;
}

}  // namespace
}  // namespace cloister::testing

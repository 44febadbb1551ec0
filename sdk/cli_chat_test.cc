// Tests of `cloister chat` (cli_chat.cc): its flags through RunCli, the conversation loop against
// the in-process peer (client_test_harness.h, whose LLMs answer a chat with its last message),
// driven by a scripted input, and the real line reader over a pipe with SIGINT.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/cli.h"
#include "sdk/cli_internal.h"
#include "sdk/client_test_harness.h"

namespace cloister::sdk::client_test {
namespace {

using cli_internal::ChatInput;
using cli_internal::ChatSetup;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// What the user does, one step per ReadLine.
struct Step {
  std::string line;     // the line typed
  bool ctrl_c = false;  // Ctrl-C at the prompt instead of a line
  // Ctrl-C during this line's reply, as soon as this text has been printed after it.
  std::string ctrl_c_after;
  std::function<void()> before;  // runs before the line is handed over
};

// The user at a terminal, from a script; the end of the script is the end of input.
class ScriptedInput final : public ChatInput {
 public:
  ScriptedInput(std::vector<Step> steps, const std::ostringstream& out)
      : steps_(std::move(steps)), out_(out) {}

  Line ReadLine(std::string& line) override {
    ++reads_;
    if (next_ == steps_.size()) return Line::kEnd;
    Step& step = steps_[next_++];
    if (step.before) step.before();
    if (step.ctrl_c) return Line::kInterrupted;
    line = step.line;
    trigger_ = step.ctrl_c_after;
    trigger_from_ = out_.str().size();
    return Line::kRead;
  }
  bool Interrupted() override {
    if (!trigger_.empty() && out_.str().find(trigger_, trigger_from_) != std::string::npos) {
      fired_ = true;
    }
    return fired_;
  }
  void ClearInterrupt() override {
    if (fired_) trigger_.clear();
    fired_ = false;
  }
  size_t reads() const { return reads_; }

 private:
  std::vector<Step> steps_;
  const std::ostringstream& out_;
  size_t next_ = 0;
  size_t reads_ = 0;
  std::string trigger_;
  size_t trigger_from_ = 0;
  bool fired_ = false;
};

std::vector<Step> Lines(std::vector<std::string> lines) {
  std::vector<Step> steps;
  for (std::string& line : lines) steps.push_back({std::move(line)});
  return steps;
}

struct ChatRun {
  int exit_code;
  std::string out;
  std::string err;
  size_t reads = 0;
};

std::vector<std::pair<std::string, std::string>> MessagesOf(const api::GenerateRequest& request) {
  std::vector<std::pair<std::string, std::string>> messages;
  for (const api::ChatMessage& message : request.chat().messages()) {
    messages.emplace_back(message.role(), message.content());
  }
  return messages;
}

using Messages = std::vector<std::pair<std::string, std::string>>;

class CliChatTest : public ClientTest {
 protected:
  void SetUp() override {
    ClientTest::SetUp();
    env_ = {{"CLOISTER_SERVER", server_address_},
            {"CLOISTER_TENANT", kTenant},
            {"CLOISTER_TOKEN_FILE", token_path_},
            {"CLOISTER_POLICY", policy_path_},
            {"CLOISTER_KEY", key_path_}};
  }

  ChatRun Cli(std::vector<std::string> args) {
    std::ostringstream out, err;
    CliIo io{out, err, env_, false};
    int code = RunCli(args, io);
    return {code, out.str(), err.str()};
  }

  // An LLM checkpoint folder uploaded as `name` (the peer describes it as an LLM).
  void UploadLlm(const std::string& name) {
    const std::string folder = dir_ + "/" + name;
    ASSERT_TRUE(MakeDirs(folder).ok());
    WriteModel(name + "/config.json", ToBytes("{}"));
    WriteModel(name + "/tokenizer.json", ToBytes("{}"));
    WriteModel(name + "/model.safetensors", Bytes(64, 3));
    ChatRun upload = Cli({"upload", "--model", folder, "--name", name});
    ASSERT_EQ(upload.exit_code, kExitOk) << upload.err;
  }

  // `cloister chat` with `args` (--model llm first), its conversation read from `steps`.
  ChatRun Chat(std::vector<std::string> args, std::vector<Step> steps, bool terminal = false) {
    args.insert(args.begin(), {"--model", "llm"});
    std::ostringstream out, err;
    CliIo io{out, err, env_, false};
    auto flags = cli_internal::ParseFlags(*cli_internal::FindSubcommand("chat"), args);
    EXPECT_TRUE(flags.ok()) << flags.status();
    if (!flags.ok()) return {kExitUsage, "", ""};
    ChatSetup setup;
    if (cli_internal::Result failed = cli_internal::PrepareChat(*flags, io, setup)) {
      return {failed->exit_code, out.str(), failed->message};
    }
    setup.prompts = terminal;
    setup.dim = terminal;
    ScriptedInput input(std::move(steps), out);
    cli_internal::Result result = cli_internal::RunChatLoop(setup, input, io);
    ChatRun run{result ? result->exit_code : kExitOk, out.str(), err.str(), input.reads()};
    if (result) {
      EXPECT_EQ(result->message, "");
    }
    return run;
  }

  std::map<std::string, std::string> env_;
};

TEST_F(CliChatTest, EachTurnSendsTheWholeConversation) {
  UploadLlm("llm");
  ChatRun run = Chat({"--system", "be brief"}, Lines({"hello", "again?"}));
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  // From a pipe: the replies only, each on its line.
  EXPECT_EQ(run.out, "hello\nagain?\n");
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(
      MessagesOf(peer_->last_generate_request()),
      (Messages{
          {"system", "be brief"}, {"user", "hello"}, {"assistant", "hello"}, {"user", "again?"}}));
}

TEST_F(CliChatTest, TheSamplingFlagsReachEveryRequest) {
  UploadLlm("llm");
  ChatRun run = Chat({"--max-tokens", "3", "--temperature", "0.5", "--top-p", "0.9", "--top-k",
                      "40", "--seed", "7", "--stop", "x", "--stop", "y z", "--usage"},
                     Lines({"hello", "a line\r"}));
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  // max_tokens cuts each echo to three tokens; --usage adds the counts of the final chunk.
  EXPECT_EQ(run.out,
            "hel\n[tokens: prompt 5, completion 3]\n"
            "a l\n[tokens: prompt 6, completion 3]\n");
  const api::GenerateRequest sent = peer_->last_generate_request();
  EXPECT_EQ(sent.max_tokens(), 3u);
  EXPECT_FLOAT_EQ(sent.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(sent.sampling().top_p(), 0.9f);
  EXPECT_EQ(sent.sampling().top_k(), 40);
  EXPECT_EQ(sent.sampling().seed(), 7u);
  EXPECT_THAT(sent.stop(), ElementsAre("x", "y z"));
  // The cut reply is what joined the conversation; the line's CR is gone.
  EXPECT_EQ(MessagesOf(sent),
            (Messages{{"user", "hello"}, {"assistant", "hel"}, {"user", "a line"}}));
}

TEST_F(CliChatTest, OnATerminalItGreetsPromptsAndDimsTheUsage) {
  UploadLlm("llm");
  ChatRun run = Chat({"--usage"}, Lines({"hi"}), /*terminal=*/true);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_EQ(run.out,
            "chatting with llm: /reset forgets the conversation, /exit or Ctrl-D ends it, Ctrl-C "
            "stops a reply\n"
            "> hi\n\x1b[2m[tokens: prompt 2, completion 2]\x1b[0m\n> \n");
}

TEST_F(CliChatTest, ResetForgetsTheConversationButKeepsTheSystemMessage) {
  UploadLlm("llm");
  ChatRun run = Chat({"--system", "sys"}, Lines({"one", "/reset", "two"}), /*terminal=*/true);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("> one\n> [conversation forgotten]\n> two\n> \n"));
  EXPECT_EQ(MessagesOf(peer_->last_generate_request()),
            (Messages{{"system", "sys"}, {"user", "two"}}));
}

TEST_F(CliChatTest, ExitQuitAndCommands) {
  UploadLlm("llm");
  for (const char* end : {"/exit", "/quit", "  /exit  "}) {
    SCOPED_TRACE(end);
    ChatRun run = Chat({}, Lines({"one", end, "never sent"}));
    EXPECT_EQ(run.exit_code, kExitOk);
    EXPECT_EQ(run.out, "one\n");
    EXPECT_EQ(run.reads, 2u);  // nothing read after the command
  }
  // Unknown commands are reported and not sent; a line of several words is a message; empty
  // lines are skipped.
  ChatRun run = Chat({}, Lines({"/help", "/nope", "", "   ", "/not a command"}));
  EXPECT_EQ(run.exit_code, kExitOk);
  EXPECT_EQ(run.out,
            "commands: /reset (forget the conversation), /exit or /quit (end), /help\n"
            "/not a command\n");
  EXPECT_EQ(run.err,
            "cloister chat: unknown command /nope (commands: /reset (forget the conversation), "
            "/exit or /quit (end), /help)\n");
  EXPECT_EQ(MessagesOf(peer_->last_generate_request()), (Messages{{"user", "/not a command"}}));
}

TEST_F(CliChatTest, AFailedTurnIsOneLineAndLeavesTheConversationAsItWas) {
  UploadLlm("llm");
  std::vector<Step> steps = Lines({"one", "two", "three"});
  steps[1].before = [this] {
    peer_->RefuseNextSealedCalls(1, grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "tenant demo has too many sequences");
  };
  ChatRun run = Chat({}, steps);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_EQ(run.out, "one\nthree\n");
  EXPECT_EQ(run.err, "cloister chat: Generate: tenant demo has too many sequences\n");
  EXPECT_EQ(MessagesOf(peer_->last_generate_request()),
            (Messages{{"user", "one"}, {"assistant", "one"}, {"user", "three"}}));
}

TEST_F(CliChatTest, AStreamThatFailsMidwayIsLeftOutToo) {
  UploadLlm("llm");
  std::vector<Step> steps = Lines({"hello", "next"});
  steps[0].before = [this] { peer_->SetStreamFault(EnclavePeer::StreamFault::kDropChunk1); };
  steps[1].before = [this] { peer_->SetStreamFault(EnclavePeer::StreamFault::kNone); };
  ChatRun run = Chat({}, steps);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  // The text that passed its checks, its line ended, then the refusal on stderr.
  EXPECT_EQ(run.out, "h\nnext\n");
  EXPECT_THAT(run.err, StartsWith("cloister chat: generation stream of request "));
  EXPECT_THAT(run.err, HasSubstr("chunk 1 is missing"));
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1);
  EXPECT_EQ(MessagesOf(peer_->last_generate_request()), (Messages{{"user", "next"}}));
}

TEST_F(CliChatTest, AConversationPastTheContextSuggestsReset) {
  UploadLlm("llm");
  const std::string context =
      "the prompt has 600 tokens; the model's context holds 512 (prompt and output together)";
  std::vector<Step> steps = Lines({"first", "second", "third"});
  steps[0].before = [&] {
    peer_->RefuseNextSealedCalls(1, grpc::StatusCode::INVALID_ARGUMENT, context);
  };
  steps[2].before = [&] {
    peer_->RefuseNextSealedCalls(1, grpc::StatusCode::INVALID_ARGUMENT, context);
  };
  ChatRun run = Chat({}, steps);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_EQ(run.out, "second\n");
  EXPECT_EQ(run.err,
            absl::StrCat(
                "cloister chat: the message does not fit the model's context (Generate: ", context,
                ")\n"
                "cloister chat: the conversation no longer fits the model's context "
                "(Generate: ",
                context, "): /reset to start over\n"));
  // Refused for the KV cache: the same advice.
  std::vector<Step> kv = Lines({"a", "b"});
  kv[1].before = [&] {
    peer_->RefuseNextSealedCalls(1, grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "the sequence needs 40 KV blocks; the cache has 32");
  };
  ChatRun full = Chat({}, kv);
  EXPECT_THAT(full.err, HasSubstr("no longer fits the model's context"));
  EXPECT_THAT(full.err, HasSubstr("/reset to start over\n"));
}

TEST_F(CliChatTest, CtrlCDuringAReplyCancelsItAndKeepsItOutOfTheConversation) {
  UploadLlm("llm");
  std::vector<Step> steps = Lines({"hello world", "next"});
  steps[0].ctrl_c_after = "hel";
  ChatRun run = Chat({}, steps, /*terminal=*/true);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_THAT(run.out, HasSubstr("> hel\n[cancelled]\n> next\n> \n"));
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(MessagesOf(peer_->last_generate_request()), (Messages{{"user", "next"}}));
}

TEST_F(CliChatTest, CtrlCAtThePromptExitsWith130) {
  UploadLlm("llm");
  std::vector<Step> steps = Lines({"one"});
  steps.push_back({.ctrl_c = true});
  steps.push_back({"never sent"});
  ChatRun run = Chat({}, steps, /*terminal=*/true);
  EXPECT_EQ(run.exit_code, cli_internal::kExitInterrupted);
  EXPECT_THAT(run.out, HasSubstr("> one\n> \n"));
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(run.reads, 2u);
}

TEST_F(CliChatTest, TheModelIsCheckedOnceBeforeTheConversation) {
  ChatRun none = Cli({"chat", "--model", "nope"});
  EXPECT_EQ(none.exit_code, kExitRefused);
  EXPECT_EQ(none.err,
            "cloister: model not found: no model 'nope' uploaded with this identity key or "
            "published (`cloister models` lists them)\n");
  std::string onnx = WriteModel("model.onnx", Bytes(100, 1));
  ASSERT_EQ(Cli({"upload", "--model", onnx, "--name", "cls"}).exit_code, kExitOk);
  ChatRun not_llm = Cli({"chat", "--model", "cls"});
  EXPECT_EQ(not_llm.exit_code, kExitRefused);
  EXPECT_EQ(not_llm.err,
            "cloister: 'cls' is an ONNX model, not a language model: run it with `cloister "
            "infer`\n");
  env_["CLOISTER_SERVER"] = ClosedAddress();
  ChatRun closed = Cli({"chat", "--model", "cls", "--timeout", "5"});
  EXPECT_EQ(closed.exit_code, kExitRefused);
  EXPECT_THAT(closed.err, StartsWith("cloister: "));
  EXPECT_EQ(std::count(closed.err.begin(), closed.err.end(), '\n'), 1);
}

TEST_F(CliChatTest, BadFlagsAreOneLineUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{}, "`cloister chat` needs --model"},
      {{"--model", ""}, "`cloister chat` needs --model"},
      {{"--model", "m", "--system", ""}, "--system wants a non-empty text"},
      {{"--model", "m", "--temperature", "3"}, "--temperature must be a number in [0, 2], not '3'"},
      {{"--model", "m", "--top-p", "0"}, "--top-p must be a number in (0, 1], not '0'"},
      {{"--model", "m", "--top-k", "-1"}, "--top-k must be a whole number from 0 (0: off)"},
      {{"--model", "m", "--max-tokens", "0"}, "--max-tokens must be a whole number of tokens"},
      {{"--model", "m", "--seed", "x"}, "--seed must be a whole number"},
      {{"--model", "m", "--stop", ""}, "--stop wants a non-empty string"},
      {{"--model", "m", "--prompt", "hi"}, "unknown flag --prompt for `cloister chat`"},
      {{"--model", "m", "--chat", "c.json"}, "unknown flag --chat for `cloister chat`"},
      {{"--model", "m", "--usage=yes"}, "flag --usage takes no value"},
      {{"--model", "m", "extra"}, "unexpected argument 'extra' for `cloister chat`"},
      {{"--model", "m", "--timeout", "0"}, "--timeout must be a number of seconds above 0"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"chat"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(args.size() > 1 ? args[args.size() - 1] : "chat");
    ChatRun run = Cli(args);
    EXPECT_EQ(run.exit_code, kExitUsage);
    EXPECT_THAT(run.err, StartsWith("cloister: " + c.error));
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    EXPECT_EQ(run.out, "");
  }
  EXPECT_EQ(peer_->sealed_calls.load(), 0);
  // No connection settings at all: named before anything is read.
  env_.clear();
  ChatRun unset = Cli({"chat", "--model", "m"});
  EXPECT_EQ(unset.exit_code, kExitUsage);
  EXPECT_EQ(unset.err, "cloister: no tenant id given: pass --tenant or set CLOISTER_TENANT\n");
}

TEST_F(CliChatTest, HelpListsChat) {
  ChatRun help = Cli({"chat", "--help"});
  EXPECT_EQ(help.exit_code, kExitOk);
  EXPECT_THAT(help.out, StartsWith("usage: cloister chat --model NAME"));
  EXPECT_THAT(help.out, HasSubstr("/reset"));
  EXPECT_EQ(Cli({"help", "chat"}).out, help.out);
  EXPECT_THAT(Cli({"--help"}).out, HasSubstr("\n  chat     a conversation with an LLM"));
  EXPECT_THAT(Cli({"frobnicate"}).err, HasSubstr("generate, chat, "));
}

// ---- The line reader over a pipe, with SIGINT. ----

class ChatInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    read_fd_ = fds[0];
    write_fd_ = fds[1];
  }
  void TearDown() override {
    ::close(read_fd_);
    if (write_fd_ >= 0) ::close(write_fd_);
  }
  void Write(const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::write(write_fd_, text.data() + done, text.size() - done);
      ASSERT_GT(n, 0);
      done += static_cast<size_t>(n);
    }
  }
  void CloseWriter() {
    ::close(write_fd_);
    write_fd_ = -1;
  }
  int read_fd_ = -1, write_fd_ = -1;
};

TEST_F(ChatInputTest, LinesThenTheEnd) {
  auto input = cli_internal::OpenChatInput(read_fd_);
  ASSERT_TRUE(input.ok()) << input.status();
  Write("first\nsecond\r\n\nlast without newline");
  CloseWriter();
  std::string line;
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kRead);
  EXPECT_EQ(line, "first");
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kRead);
  EXPECT_EQ(line, "second\r");  // the loop drops the CR
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kRead);
  EXPECT_EQ(line, "");
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kRead);
  EXPECT_EQ(line, "last without newline");
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kEnd);
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kEnd);
}

TEST_F(ChatInputTest, ALineOverTheLimitIsDroppedWithoutTheNext) {
  auto input = cli_internal::OpenChatInput(read_fd_);
  ASSERT_TRUE(input.ok()) << input.status();
  std::thread writer([this] {
    Write(std::string(cli_internal::kMaxChatLineSize + 10, 'x') + "\nafter\n" +
          std::string(cli_internal::kMaxChatLineSize + 1, 'y') + "\n" +
          std::string(cli_internal::kMaxChatLineSize, 'z') + "\n");
    CloseWriter();
  });
  std::string line;
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kTooLong);
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kRead);
  EXPECT_EQ(line, "after");
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kTooLong);
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kRead);  // exactly the limit is fine
  EXPECT_EQ(line.size(), cli_internal::kMaxChatLineSize);
  EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kEnd);
  writer.join();
}

TEST_F(ChatInputTest, SigintEndsAWaitAndIsClearedWhenHandled) {
  struct sigaction before {};
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &before), 0);
  {
    auto input = cli_internal::OpenChatInput(read_fd_);
    ASSERT_TRUE(input.ok()) << input.status();
    // Only one at a time: the handler has one pipe to wake.
    auto second = cli_internal::OpenChatInput(read_fd_);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kInternal);
    EXPECT_FALSE((*input)->Interrupted());
    // Nothing to read: the wait ends when SIGINT arrives (sent from another thread, so it may
    // land on any thread of the process).
    std::thread sender([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::kill(::getpid(), SIGINT);
    });
    std::string line;
    EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kInterrupted);
    sender.join();
    EXPECT_TRUE((*input)->Interrupted());
    // Until it is cleared, the next read says so again.
    EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kInterrupted);
    (*input)->ClearInterrupt();
    EXPECT_FALSE((*input)->Interrupted());
    Write("after\n");
    EXPECT_EQ((*input)->ReadLine(line), ChatInput::Line::kRead);
    EXPECT_EQ(line, "after");
    // A SIGINT while no read waits (a reply streams) is seen by Interrupted.
    ASSERT_EQ(::kill(::getpid(), SIGINT), 0);
    for (int i = 0; i < 1000 && !(*input)->Interrupted(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // delivered to any thread
    }
    EXPECT_TRUE((*input)->Interrupted());
    (*input)->ClearInterrupt();
  }
  // The handler that was there before is back.
  struct sigaction after {};
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  // And another input may be opened now.
  EXPECT_TRUE(cli_internal::OpenChatInput(read_fd_).ok());
}

}  // namespace
}  // namespace cloister::sdk::client_test

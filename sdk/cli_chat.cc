// The `cloister` command line (cli.h): chat, a conversation with an LLM. Each line the user types
// goes to the enclave with the whole conversation so far as chat messages (the model's own chat
// template renders them inside the enclave, as for `generate --chat`); the reply is printed as it
// streams and joins the conversation. Ctrl-C reaches the loop through a SIGINT handler that only
// sets a flag and wakes the line reader through a pipe, so a reply in flight is cancelled with
// the SDK's GenerateCancelled hook and a wait for a line ends at once.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sdk/cli_internal.h"
#include "sdk/client.h"

namespace cloister::sdk::cli_internal {

namespace api = ::cloister::api::v1;

namespace {

// ---- Standard input and SIGINT. ----

static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the SIGINT handler may only touch lock-free atomics");

// Set by the handler; cleared by ClearInterrupt. The truth about Ctrl-C.
std::atomic<bool> interrupted{false};
// The write end of the wake-up pipe while a StdinChatInput lives, else -1. Only wakes poll().
std::atomic<int> wake_fd{-1};

void OnInterrupt(int) {
  const int saved_errno = errno;
  interrupted.store(true);
  const int fd = wake_fd.load();
  if (fd >= 0) {
    const char byte = 0;
    // Non-blocking: a full pipe already wakes the reader.
    [[maybe_unused]] ssize_t written = ::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

class FdChatInput final : public ChatInput {
 public:
  static absl::StatusOr<std::unique_ptr<ChatInput>> Open(int fd) {
    auto input = std::unique_ptr<FdChatInput>(new FdChatInput(fd));
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("cannot make a pipe: ", std::strerror(errno)));
    }
    input->wake_read_ = pipe_fds[0];
    input->wake_write_ = pipe_fds[1];
    int expected = -1;
    if (!wake_fd.compare_exchange_strong(expected, input->wake_write_)) {
      return absl::InternalError("another chat input is already open");
    }
    input->owns_handler_ = true;
    interrupted.store(false);
    struct sigaction action {};
    action.sa_handler = OnInterrupt;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;  // no SA_RESTART: a read in progress ends with EINTR
    if (::sigaction(SIGINT, &action, &input->previous_) != 0) {
      return absl::InternalError(absl::StrCat("cannot handle SIGINT: ", std::strerror(errno)));
    }
    input->handler_installed_ = true;
    return input;
  }

  ~FdChatInput() override {
    if (handler_installed_) ::sigaction(SIGINT, &previous_, nullptr);
    if (owns_handler_) wake_fd.store(-1);
    if (wake_read_ >= 0) ::close(wake_read_);
    if (wake_write_ >= 0) ::close(wake_write_);
  }

  Line ReadLine(std::string& line) override {
    for (;;) {
      if (interrupted.load()) return Line::kInterrupted;
      if (std::optional<Line> ready = TakeBufferedLine(line); ready.has_value()) return *ready;
      if (at_end_) {
        if (buffer_.empty() || discarding_) {
          buffer_.clear();
          discarding_ = false;
          return Line::kEnd;
        }
        line = std::move(buffer_);  // a last line without its newline
        buffer_.clear();
        return Line::kRead;
      }
      pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        at_end_ = true;  // nothing more can be read
        continue;
      }
      if (fds[1].revents != 0) DrainWakeups();
      if (fds[0].revents == 0) continue;
      char chunk[4096];
      ssize_t size = ::read(fd_, chunk, sizeof(chunk));
      if (size < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        at_end_ = true;  // EIO: the terminal went away
      } else if (size == 0) {
        at_end_ = true;
      } else {
        buffer_.append(chunk, static_cast<size_t>(size));
      }
    }
  }

  bool Interrupted() override { return interrupted.load(); }

  void ClearInterrupt() override {
    // Flag first: a SIGINT between the two leaves the flag set, which is what counts.
    interrupted.store(false);
    DrainWakeups();
  }

 private:
  explicit FdChatInput(int fd) : fd_(fd) {}

  // The next whole line of buffer_, or kTooLong once for a line over the limit (whose rest is
  // then dropped as it comes); nullopt when more input is needed.
  std::optional<Line> TakeBufferedLine(std::string& line) {
    size_t newline = buffer_.find('\n');
    if (discarding_) {
      if (newline == std::string::npos) {
        buffer_.clear();
        return std::nullopt;
      }
      buffer_.erase(0, newline + 1);
      discarding_ = false;
      newline = buffer_.find('\n');
    }
    if (newline == std::string::npos) {
      if (buffer_.size() <= kMaxChatLineSize) return std::nullopt;
      buffer_.clear();
      discarding_ = true;
      return Line::kTooLong;
    }
    if (newline > kMaxChatLineSize) {
      buffer_.erase(0, newline + 1);
      return Line::kTooLong;
    }
    line = buffer_.substr(0, newline);
    buffer_.erase(0, newline + 1);
    return Line::kRead;
  }

  void DrainWakeups() {
    char bytes[64];
    while (::read(wake_read_, bytes, sizeof(bytes)) > 0) {
    }
  }

  const int fd_;
  int wake_read_ = -1;
  int wake_write_ = -1;
  bool owns_handler_ = false;
  bool handler_installed_ = false;
  struct sigaction previous_ {};
  std::string buffer_;       // read but not yet returned
  bool discarding_ = false;  // inside a line over the limit, dropped up to its newline
  bool at_end_ = false;
};

// ---- The conversation. ----

constexpr char kGreeting[] =
    "/reset forgets the conversation, /exit or Ctrl-D ends it, Ctrl-C stops a reply";
constexpr char kCommands[] =
    "commands: /reset (forget the conversation), /exit or /quit (end), /help";

// One line on stderr, whatever the reason holds.
void ErrorLine(CliIo& io, absl::string_view reason) {
  std::string line(reason);
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  io.out.flush();
  io.err << "cloister chat: " << line << "\n";
  io.err.flush();
}

// Whether the enclave refused the prompt for its length: past the model's context (the
// generator's check) or more KV cache than the sequence may have. The enclave gives these no
// ErrorReason of their own, so the message is all there is to go by; it only chooses the hint.
bool RefusedForLength(const absl::Status& status) {
  const bool size_code = absl::IsInvalidArgument(status) || absl::IsResourceExhausted(status) ||
                         absl::IsOutOfRange(status);
  return size_code && (absl::StrContains(status.message(), "context") ||
                       absl::StrContains(status.message(), "KV"));
}

std::string TurnError(const absl::Status& status, bool first_turn, const std::string& model) {
  if (RefusedForLength(status)) {
    if (first_turn) {
      return absl::StrCat("the message does not fit the model's context (", status.message(), ")");
    }
    return absl::StrCat("the conversation no longer fits the model's context (", status.message(),
                        "): /reset to start over");
  }
  return RefusedForModel(status, model).message;
}

api::ChatMessage Message(const std::string& role, std::string content) {
  api::ChatMessage message;
  message.set_role(role);
  message.set_content(std::move(content));
  return message;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatInput>> OpenChatInput(int fd) { return FdChatInput::Open(fd); }

Result PrepareChat(const Flags& flags, CliIo& io, ChatSetup& setup) {
  auto name = RequiredFlag(flags, "model", "chat");
  if (!name.ok()) return Usage(name.status());
  if (std::optional<std::string> system = flags.Get("system"); system.has_value()) {
    if (system->empty()) return Usage("--system wants a non-empty text");
    setup.system = *system;
  }
  // generate's checks of the sampling flags, word for word: a placeholder prompt (chat has no
  // --prompt flag) answers its demand for one, and is taken out again.
  Flags sampling = flags;
  sampling.values["prompt"] = "";
  absl::StatusOr<api::GenerateRequest> request = GenerateRequestFromFlags(sampling);
  if (!request.ok()) return Usage(request.status());
  request->clear_prompt();
  setup.request = *std::move(request);
  setup.usage = flags.Has("usage");

  auto options = LoadConnection(flags, io, /*need_key=*/true);
  if (!options.ok()) return Usage(options.status());
  auto client = Client::Connect(*options);
  if (!client.ok()) return Refused(client.status());
  // A wrong name is said once, now, rather than after every line typed.
  auto models = (*client)->ListModels();
  if (!models.ok()) return Refused(models.status());
  const api::ModelInfo* found = nullptr;
  for (const api::ModelInfo& model : *models) {
    if (model.name() == *name) found = &model;
  }
  if (found == nullptr) {
    return Refused(absl::StrCat("model not found: no model '", *name,
                                "' uploaded with this identity key or published "
                                "(`cloister models` lists them)"));
  }
  if (found->kind() == api::MODEL_KIND_ONNX) {
    return Refused(absl::StrCat("'", *name,
                                "' is an ONNX model, not a language model: run it with "
                                "`cloister infer`"));
  }
  setup.client = *std::move(client);
  setup.model = *name;
  return std::nullopt;
}

Result RunChatLoop(ChatSetup& setup, ChatInput& input, CliIo& io) {
  // The user and assistant turns so far; the system message is added to each request.
  std::vector<api::ChatMessage> history;
  if (setup.prompts) io.out << "chatting with " << setup.model << ": " << kGreeting << "\n";
  for (;;) {
    if (setup.prompts) io.out << "> " << std::flush;
    std::string line;
    switch (input.ReadLine(line)) {
      case ChatInput::Line::kInterrupted:
        if (setup.prompts) io.out << "\n";
        return CliError{kExitInterrupted, ""};
      case ChatInput::Line::kEnd:
        if (setup.prompts) io.out << "\n";
        return std::nullopt;
      case ChatInput::Line::kTooLong:
        ErrorLine(io, absl::StrCat("a line is longer than ", kMaxChatLineSize,
                                   " bytes; it was not sent"));
        continue;
      case ChatInput::Line::kRead:
        break;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    if (trimmed.empty()) continue;
    // A line of one word that begins with '/' is a command.
    if (trimmed.front() == '/' &&
        std::none_of(trimmed.begin(), trimmed.end(), absl::ascii_isspace)) {
      if (trimmed == "/exit" || trimmed == "/quit") return std::nullopt;
      if (trimmed == "/reset") {
        history.clear();
        if (setup.prompts) io.out << "[conversation forgotten]\n";
      } else if (trimmed == "/help") {
        io.out << kCommands << "\n";
      } else {
        ErrorLine(io, absl::StrCat("unknown command ", trimmed, " (", kCommands, ")"));
      }
      continue;
    }

    api::GenerateRequest request = setup.request;
    api::ChatPrompt& chat = *request.mutable_chat();
    if (!setup.system.empty()) *chat.add_messages() = Message("system", setup.system);
    for (const api::ChatMessage& message : history) *chat.add_messages() = message;
    *chat.add_messages() = Message("user", line);

    input.ClearInterrupt();
    bool printed = false;
    absl::StatusOr<GenerateResult> reply = setup.client->Generate(
        setup.model, request,
        [&](const api::GenerateChunk& chunk) {
          if (chunk.text().empty()) return;
          io.out << chunk.text() << std::flush;
          printed = true;
        },
        absl::ZeroDuration(), [&input] { return input.Interrupted(); });
    if (printed) io.out << "\n";
    if (!reply.ok()) {
      if (absl::IsCancelled(reply.status()) && input.Interrupted()) {
        io.out << "[cancelled]\n" << std::flush;
      } else {
        ErrorLine(io, TurnError(reply.status(), history.empty(), setup.model));
      }
      input.ClearInterrupt();
      continue;
    }
    if (!printed) io.out << "\n";  // an empty reply is an empty line
    history.push_back(Message("user", std::move(line)));
    history.push_back(Message("assistant", reply->text));
    if (setup.usage) {
      const api::GenerateUsage& usage = reply->usage;
      std::string counts = absl::StrCat("[tokens: prompt ", usage.prompt_tokens());
      if (usage.cached_tokens() > 0) {
        absl::StrAppend(&counts, " (", usage.cached_tokens(), " cached)");
      }
      absl::StrAppend(&counts, ", completion ", usage.completion_tokens(), "]");
      if (setup.dim) counts = absl::StrCat("\x1b[2m", counts, "\x1b[0m");
      io.out << counts << "\n";
    }
    io.out.flush();
    // A Ctrl-C that came as the reply ended has nothing left to stop.
    input.ClearInterrupt();
  }
}

Result RunChat(const Flags& flags, CliIo& io) {
  ChatSetup setup;
  if (Result failed = PrepareChat(flags, io, setup); failed.has_value()) return failed;
  setup.prompts = ::isatty(STDIN_FILENO) == 1;
  setup.dim = ::isatty(STDOUT_FILENO) == 1;
  absl::StatusOr<std::unique_ptr<ChatInput>> input = OpenChatInput(STDIN_FILENO);
  if (!input.ok()) return Refused(input.status());
  return RunChatLoop(setup, **input, io);
}

}  // namespace cloister::sdk::cli_internal

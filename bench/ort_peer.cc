#include "bench/ort_peer.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Closes a descriptor unless it is -1.
void CloseFd(int fd) {
  if (fd >= 0) ::close(fd);
}

// The node_modules folder: `dir` itself when it holds onnxruntime-node, else dir/node_modules.
absl::StatusOr<std::string> ResolveModulesDir(const std::string& dir) {
  std::error_code error;
  if (fs::exists(fs::path(dir) / "onnxruntime-node", error)) return dir;
  const fs::path nested = fs::path(dir) / "node_modules";
  if (fs::exists(nested / "onnxruntime-node", error)) return nested.string();
  return absl::FailedPreconditionError(
      absl::StrCat("onnxruntime-node not found in ", dir,
                   " (install it with scripts/install-bench-deps.sh, or pass --ort-dir)"));
}

// Parses a reply line; a reply with "ok": false becomes Internal carrying the peer's message.
absl::StatusOr<json> ParseReply(const std::string& line, const std::string& request_op) {
  json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!reply.is_object() || !reply.contains("ok") || !reply["ok"].is_boolean()) {
    return absl::InternalError(
        absl::StrCat("ORT peer sent a malformed reply to ", request_op, ": ", line));
  }
  if (!reply["ok"].get<bool>()) {
    const std::string message = reply.contains("error") && reply["error"].is_string()
                                    ? reply["error"].get<std::string>()
                                    : line;
    return absl::InternalError(absl::StrCat("ORT peer (", request_op, "): ", message));
  }
  return reply;
}

}  // namespace

std::string OrtTypeName(runtime::DataType dtype) {
  switch (dtype) {
    case runtime::DataType::kFloat:
      return "float32";
    case runtime::DataType::kDouble:
      return "float64";
    case runtime::DataType::kInt64:
      return "int64";
    case runtime::DataType::kInt32:
      return "int32";
    case runtime::DataType::kUint8:
      return "uint8";
    case runtime::DataType::kBool:
      return "bool";
    default:
      return "";
  }
}

absl::StatusOr<runtime::DataType> DataTypeFromOrtName(const std::string& name) {
  for (runtime::DataType dtype :
       {runtime::DataType::kFloat, runtime::DataType::kDouble, runtime::DataType::kInt64,
        runtime::DataType::kInt32, runtime::DataType::kUint8, runtime::DataType::kBool}) {
    if (OrtTypeName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("ORT element type ", name, " is not supported"));
}

absl::StatusOr<std::unique_ptr<OrtPeer>> OrtPeer::Start(const OrtPeerConfig& config) {
  ASSIGN_OR_RETURN(std::string modules_dir, ResolveModulesDir(config.modules_dir));
  if (!FileExists(config.script)) {
    return absl::FailedPreconditionError(
        absl::StrCat("ORT peer script ", config.script, " not found"));
  }
  // A peer that dies mid-request must surface as a write error (EPIPE), not kill this process.
  ::signal(SIGPIPE, SIG_IGN);

  int to_child[2] = {-1, -1};
  int from_child[2] = {-1, -1};
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    const int err = errno;
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) CloseFd(fd);
    return absl::InternalError(absl::StrCat("pipe for the ORT peer: ", std::strerror(err)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  std::vector<std::string> args = {config.node, config.script, modules_dir};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned =
      ::posix_spawnp(&pid, config.node.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  CloseFd(to_child[0]);
  CloseFd(from_child[1]);
  if (spawned != 0) {
    CloseFd(to_child[1]);
    CloseFd(from_child[0]);
    return absl::FailedPreconditionError(absl::StrCat("cannot start ", config.node,
                                                      " for the ORT peer: ", std::strerror(spawned),
                                                      " (install Node.js, or pass --node)"));
  }
  std::FILE* replies = ::fdopen(from_child[0], "r");
  if (replies == nullptr) {
    CloseFd(from_child[0]);
    CloseFd(to_child[1]);
    ::waitpid(pid, nullptr, 0);
    return absl::InternalError("fdopen for the ORT peer's replies failed");
  }
  std::unique_ptr<OrtPeer> peer(new OrtPeer(pid, to_child[1], replies));

  auto greeting = peer->ReadLine();
  if (!greeting.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(config.node, " ", config.script, " exited without a greeting"));
  }
  auto reply = ParseReply(*greeting, "start");
  if (!reply.ok()) return absl::FailedPreconditionError(reply.status().message());
  if (!(*reply).contains("ort_version") || !(*reply)["ort_version"].is_string()) {
    return absl::FailedPreconditionError("ORT peer greeting names no onnxruntime-node version");
  }
  peer->version_ = (*reply)["ort_version"].get<std::string>();
  return peer;
}

OrtPeer::~OrtPeer() {
  static constexpr char kQuit[] = "{\"op\":\"quit\"}\n";
  (void)!::write(request_fd_, kQuit, sizeof(kQuit) - 1);
  CloseFd(request_fd_);
  std::fclose(replies_);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

absl::StatusOr<std::string> OrtPeer::ReadLine() {
  char* line = nullptr;
  size_t capacity = 0;
  const ssize_t length = ::getline(&line, &capacity, replies_);
  if (length <= 0) {
    std::free(line);
    return absl::InternalError("the ORT peer exited (no reply on its stdout)");
  }
  std::string result(line, static_cast<size_t>(length));
  std::free(line);
  while (!result.empty() && (result.back() == '\n' || result.back() == '\r')) result.pop_back();
  return result;
}

absl::StatusOr<std::string> OrtPeer::Exchange(const std::string& request) {
  const std::string line = request + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(request_fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("cannot write to the ORT peer: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return ReadLine();
}

absl::StatusOr<double> OrtPeer::Load(const std::string& model_path, int threads,
                                     const std::vector<PeerInput>& inputs) {
  json request = {{"op", "load"}, {"model", model_path}, {"threads", threads}};
  json specs = json::array();
  for (const PeerInput& input : inputs) {
    const std::string type = OrtTypeName(input.dtype);
    if (type.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", input.name, ": type ", runtime::TypeName(input.dtype), " has no ORT name"));
    }
    specs.push_back(
        {{"name", input.name}, {"dtype", type}, {"dims", input.shape}, {"file", input.file}});
  }
  request["inputs"] = std::move(specs);
  ASSIGN_OR_RETURN(std::string line, Exchange(request.dump()));
  ASSIGN_OR_RETURN(json reply, ParseReply(line, "load"));
  if (!reply.contains("load_ms") || !reply["load_ms"].is_number()) {
    return absl::InternalError("ORT peer's load reply has no load_ms");
  }
  return reply["load_ms"].get<double>();
}

absl::StatusOr<std::vector<double>> OrtPeer::Time(int iterations) {
  json request = {{"op", "time"}, {"iterations", iterations}};
  ASSIGN_OR_RETURN(std::string line, Exchange(request.dump()));
  ASSIGN_OR_RETURN(json reply, ParseReply(line, "time"));
  if (!reply.contains("times_ms") || !reply["times_ms"].is_array() ||
      reply["times_ms"].size() != static_cast<size_t>(iterations)) {
    return absl::InternalError(
        absl::StrCat("ORT peer's time reply does not hold ", iterations, " times"));
  }
  std::vector<double> times;
  for (const json& value : reply["times_ms"]) {
    if (!value.is_number()) return absl::InternalError("ORT peer sent a non-numeric time");
    times.push_back(value.get<double>());
  }
  return times;
}

absl::StatusOr<std::vector<std::pair<std::string, runtime::Tensor>>> OrtPeer::Outputs(
    const std::string& dir) {
  json request = {{"op", "dump"}, {"dir", dir}};
  ASSIGN_OR_RETURN(std::string line, Exchange(request.dump()));
  ASSIGN_OR_RETURN(json reply, ParseReply(line, "dump"));
  if (!reply.contains("outputs") || !reply["outputs"].is_array()) {
    return absl::InternalError("ORT peer's dump reply has no outputs");
  }
  std::vector<std::pair<std::string, runtime::Tensor>> outputs;
  for (const json& entry : reply["outputs"]) {
    const bool well_formed =
        entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
        entry.contains("dtype") && entry["dtype"].is_string() && entry.contains("file") &&
        entry["file"].is_string() && entry.contains("dims") && entry["dims"].is_array() &&
        std::all_of(entry["dims"].begin(), entry["dims"].end(),
                    [](const json& dim) { return dim.is_number_integer(); });
    if (!well_formed) {
      return absl::InternalError(absl::StrCat("ORT peer sent a malformed output: ", entry.dump()));
    }
    ASSIGN_OR_RETURN(runtime::DataType dtype,
                     DataTypeFromOrtName(entry["dtype"].get<std::string>()));
    std::vector<int64_t> shape = entry["dims"].get<std::vector<int64_t>>();
    ASSIGN_OR_RETURN(runtime::Tensor tensor, runtime::Tensor::Create(dtype, shape));
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(entry["file"].get<std::string>()));
    if (bytes.size() != tensor.size()) {
      return absl::InternalError(absl::StrCat("ORT output ", entry["name"].get<std::string>(), ": ",
                                              bytes.size(), " bytes for shape ",
                                              runtime::ShapeToString(shape)));
    }
    if (!bytes.empty()) std::memcpy(tensor.raw_data(), bytes.data(), bytes.size());
    outputs.emplace_back(entry["name"].get<std::string>(), std::move(tensor));
  }
  return outputs;
}

}  // namespace cloister::bench

#include "tests/support/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

extern char** environ;

namespace cloister::testing {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            const std::string& out_path, const std::string& err_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argp[0], &actions, nullptr, argp.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// Waits for `pid` up to `timeout`; returns the exit code, or -1 (and kills) on timeout/signal.
int WaitFor(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// /proc/PID/stat ("pid (comm) state ppid ..."): the command name, and the fields after it,
// from field 3 (state) on. comm may hold spaces and parentheses, so it ends at the last ')'.
// False for a process that is gone.
bool ReadStat(pid_t pid, std::string& name, std::vector<std::string>& fields) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  size_t open = stat.find('(');
  size_t close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  name = stat.substr(open + 1, close - open - 1);
  std::istringstream rest(stat.substr(close + 1));
  fields.clear();
  for (std::string field; rest >> field;) fields.push_back(std::move(field));
  return !fields.empty();
}

// The parent pid and command name. False for a process that is gone or exited and not yet
// reaped.
bool ReadParent(pid_t pid, pid_t& parent, std::string& name) {
  std::vector<std::string> fields;
  if (!ReadStat(pid, name, fields) || fields.size() < 2) return false;
  if (fields[0] == "Z" || fields[0] == "X") return false;
  parent = static_cast<pid_t>(std::strtoll(fields[1].c_str(), nullptr, 10));
  return true;
}

}  // namespace

std::vector<pid_t> ChildProcesses(pid_t parent, const std::string& name_prefix) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    pid_t its_parent = 0;
    std::string command;
    if (!ReadParent(pid, its_parent, command)) continue;
    if (its_parent == parent && command.rfind(name_prefix, 0) == 0) children.push_back(pid);
  }
  std::sort(children.begin(), children.end());
  return children;
}

double ProcessCpuSeconds(pid_t pid) {
  std::string name;
  std::vector<std::string> fields;
  // utime and stime, fields 14 and 15 of proc(5), in clock ticks.
  if (!ReadStat(pid, name, fields) || fields.size() < 13) return 0;
  const double ticks =
      std::strtod(fields[11].c_str(), nullptr) + std::strtod(fields[12].c_str(), nullptr);
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::vector<pid_t> EnclaveWorkers(pid_t cloisterd) {
  return ChildProcesses(cloisterd, "cloister-enclav");  // "cloister-enclave" cut to 15
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

RunResult Run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              absl::Duration timeout) {
  std::string dir = MakeTempDir("cloister-run");
  RunResult result;
  pid_t pid = Spawn(argv, env, dir + "/out", dir + "/err");
  if (pid < 0) {
    result.err = "cannot start " + argv[0];
    return result;
  }
  result.exit_code = WaitFor(pid, timeout);
  result.out = ReadWholeFile(dir + "/out");
  result.err = ReadWholeFile(dir + "/err");
  std::remove((dir + "/out").c_str());
  std::remove((dir + "/err").c_str());
  ::rmdir(dir.c_str());
  return result;
}

Process::Process(std::vector<std::string> argv, std::string log_dir,
                 std::map<std::string, std::string> env)
    : out_path_(log_dir + "/stdout.log"), err_path_(log_dir + "/stderr.log") {
  pid_ = Spawn(argv, env, out_path_, err_path_);
}

Process::~Process() {
  if (Running()) Stop(SIGKILL, absl::Seconds(5));
}

bool Process::Running() {
  if (pid_ < 0 || exited_) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return false;
  }
  return true;
}

std::string Process::WaitForStdout(const std::string& text, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::string out = Stdout();
    auto pos = out.find(text);
    if (pos != std::string::npos) {
      auto end = out.find('\n', pos);
      if (end != std::string::npos) {
        auto begin = out.rfind('\n', pos);
        begin = begin == std::string::npos ? 0 : begin + 1;
        return out.substr(begin, end - begin);
      }
    }
    if (!Running()) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

int Process::Stop(int signal, absl::Duration timeout) {
  if (!Running()) return exit_code_;
  ::kill(pid_, signal);
  exit_code_ = WaitFor(pid_, timeout);
  exited_ = true;
  return exit_code_;
}

std::string Process::Stdout() const { return ReadWholeFile(out_path_); }
std::string Process::Stderr() const { return ReadWholeFile(err_path_); }

}  // namespace cloister::testing

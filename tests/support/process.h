// Test support: runs the real Cloister programs as child processes (cloisterd, cloister,
// cloister-enclave) with arguments and environment, captures their output to files and waits
// with a time limit. Not thread-safe; one owner per Process.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/support/temp_dir.h"

namespace cloister::testing {

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  std::string out;
  std::string err;
};

// Runs a program to completion (killed after `timeout`).
RunResult Run(const std::vector<std::string>& argv,
              const std::map<std::string, std::string>& env = {},
              absl::Duration timeout = absl::Seconds(60));

// A long-running child (a server). Output goes to files under `log_dir`.
class Process {
 public:
  Process(std::vector<std::string> argv, std::string log_dir,
          std::map<std::string, std::string> env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Waits until stdout contains `text`; returns the line that contains it, or "" on timeout
  // or exit.
  std::string WaitForStdout(const std::string& text, absl::Duration timeout);
  // Sends `signal` and waits for the exit code (-1 if it had to be killed).
  int Stop(int signal, absl::Duration timeout = absl::Seconds(20));
  bool Running();
  pid_t pid() const { return pid_; }
  std::string Stdout() const;
  std::string Stderr() const;

 private:
  pid_t pid_ = -1;
  std::string out_path_, err_path_;
  int exit_code_ = -1;
  bool exited_ = false;
};

// The live children of `parent` whose command name (/proc/PID/comm, which the kernel cuts to
// 15 characters) starts with `name_prefix`, in ascending pid order.
std::vector<pid_t> ChildProcesses(pid_t parent, const std::string& name_prefix);
// cloisterd's enclave worker processes (its live cloister-enclave children).
std::vector<pid_t> EnclaveWorkers(pid_t cloisterd);
// CPU time (user + system) process `pid` has used so far, in seconds, from /proc/PID/stat, at
// the kernel's clock tick (10 ms); 0 when there is no such process.
double ProcessCpuSeconds(pid_t pid);

std::string ReadWholeFile(const std::string& path);

}  // namespace cloister::testing

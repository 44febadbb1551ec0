#include "tests/support/appliance.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <string_view>
#include <vector>

namespace cloister::testing {

absl::Status Appliance::Start() {
  log_dir_ = MakeTempDir("cloisterd-log");
  std::vector<std::string> argv = {cloisterd_binary_, "--listen", "127.0.0.1:0", "--data-dir",
                                   data_dir_};
  argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
  process_ = std::make_unique<Process>(std::move(argv), log_dir_);
  std::string line = process_->WaitForStdout("cloisterd listening on ", absl::Seconds(60));
  if (line.empty()) {
    return absl::UnavailableError("cloisterd did not start: " + process_->Stderr());
  }
  address_ = line.substr(line.rfind(' ') + 1);
  // {"ts":...,"event":"operator_listening","address":"HOST:PORT","metrics":"http://HOST:PORT/metrics"}
  std::string logs = process_->Stderr();
  size_t event = logs.find("\"event\":\"operator_listening\"");
  if (event != std::string::npos) {
    auto field = [&](const std::string& key) -> std::string {
      std::string marker = "\"" + key + "\":\"";
      size_t start = logs.find(marker, event);
      if (start == std::string::npos) return "";
      start += marker.size();
      return logs.substr(start, logs.find('"', start) - start);
    };
    operator_address_ = field("address");
    metrics_address_ = field("metrics");
    constexpr std::string_view kScheme = "http://", kPath = "/metrics";
    if (metrics_address_.rfind(kScheme, 0) == 0) metrics_address_.erase(0, kScheme.size());
    if (metrics_address_.size() > kPath.size() &&
        metrics_address_.compare(metrics_address_.size() - kPath.size(), kPath.size(), kPath) == 0) {
      metrics_address_.resize(metrics_address_.size() - kPath.size());
    }
  }
  return absl::OkStatus();
}

int Appliance::Stop() { return process_ ? process_->Stop(SIGTERM) : 0; }

std::vector<pid_t> Appliance::WorkerPids() const {
  std::vector<pid_t> children;
  if (pid() <= 0) return children;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/PID/stat: "PID (COMM) STATE PPID ..."; COMM may hold spaces and parentheses.
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    pid_t parent = 0;
    if (rest >> state >> parent && parent == pid()) children.push_back(std::stoi(name));
  }
  return children;
}

std::string Appliance::Logs() const {
  return process_ ? process_->Stdout() + process_->Stderr() : std::string();
}

}  // namespace cloister::testing

#include "tests/support/appliance.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string_view>
#include <vector>

#include "sdk/identity.h"

namespace cloister::testing {

absl::Status Appliance::Start() {
  log_dir_ = MakeTempDir("cloisterd-log");
  std::vector<std::string> argv = {cloisterd_binary_, "--listen", "127.0.0.1:0", "--data-dir",
                                   data_dir_};
  if (std::find(extra_args_.begin(), extra_args_.end(), "--config") == extra_args_.end()) {
    // Free operator and metrics ports, so that appliances (and other daemons on the machine)
    // never collide on the default 127.0.0.1:7701.
    const std::string config = log_dir_ + "/cloisterd.yaml";
    std::ofstream(config) << "operator:\n  listen: 127.0.0.1:0\n";
    argv.insert(argv.end(), {"--config", config});
  }
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
  return pid() > 0 ? EnclaveWorkers(pid()) : std::vector<pid_t>();
}

sdk::ClientOptions Appliance::TenantOptions(const std::string& tenant,
                                            const std::string& token) const {
  sdk::ClientOptions options;
  options.server = address_;
  options.tenant_id = tenant;
  options.token = token;
  options.policy_path = data_dir_ + "/dev-policy.yaml";
  options.identity = std::make_shared<const sdk::TenantIdentity>(sdk::TenantIdentity::Generate());
  return options;
}

std::string Appliance::Logs() const {
  return process_ ? process_->Stdout() + process_->Stderr() : std::string();
}

}  // namespace cloister::testing

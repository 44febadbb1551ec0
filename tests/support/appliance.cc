#include "tests/support/appliance.h"

#include <signal.h>

#include <vector>

namespace cloister::testing {

absl::Status Appliance::Start() {
  log_dir_ = MakeTempDir("cloisterd-log");
  process_ =
      std::make_unique<Process>(std::vector<std::string>{cloisterd_binary_, "--listen",
                                                         "127.0.0.1:0", "--data-dir", data_dir_},
                                log_dir_);
  std::string line = process_->WaitForStdout("cloisterd listening on ", absl::Seconds(60));
  if (line.empty()) {
    return absl::UnavailableError("cloisterd did not start: " + process_->Stderr());
  }
  address_ = line.substr(line.rfind(' ') + 1);
  return absl::OkStatus();
}

int Appliance::Stop() { return process_ ? process_->Stop(SIGTERM) : 0; }

std::string Appliance::Logs() const {
  return process_ ? process_->Stdout() + process_->Stderr() : std::string();
}

}  // namespace cloister::testing

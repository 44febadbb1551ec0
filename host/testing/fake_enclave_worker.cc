// fake_enclave_worker: a stand-in for `cloister-enclave` in host tests only. It accepts the
// worker command line that ProcessEnclaveClient passes (--fd N --data-dir D --sim-dir S
// [--dev-policy-out P]), writes S/ready and P (when given) like the real worker writes its
// simulated roots and development policy, then answers frames on fd N with FakeEnclave (streams
// and cancellations included: FakeEnclave::Respond) until the socket closes.
// Test knobs (environment): FAKE_ENCLAVE_EXIT_AT_START=CODE exits before answering anything;
// FAKE_ENCLAVE_IGNORE_SIGTERM=1 ignores SIGTERM (to test the SIGKILL fallback);
// FAKE_ENCLAVE_FIRST_EVIDENCE_ERROR=1 answers the first GetEvidenceCall with FAILED_PRECONDITION
// "not ready yet" (to test that cloisterd retries until the worker is ready).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "base/file.h"
#include "host/testing/fake_enclave.h"
#include "proto/frame.h"

int main(int argc, char** argv) {
  int fd = -1;
  std::string data_dir, sim_dir, policy_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    absl::string_view flag = argv[i];
    std::string value = argv[i + 1];
    if (flag == "--fd") {
      if (!absl::SimpleAtoi(value, &fd)) return 2;
    } else if (flag == "--data-dir") {
      data_dir = value;
    } else if (flag == "--sim-dir") {
      sim_dir = value;
    } else if (flag == "--dev-policy-out") {
      policy_path = value;
    } else if (flag == "--tee") {
      if (value != "sim") {
        std::fprintf(stderr, "fake_enclave_worker: only --tee sim, not %s\n", value.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "fake_enclave_worker: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (fd < 0 || data_dir.empty() || sim_dir.empty()) {
    std::fprintf(stderr, "fake_enclave_worker: missing flags\n");
    return 2;
  }
  // ProcessEnclaveClient closes every descriptor but 0-3 before exec: check none leaked.
  if (DIR* fds = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(fds)) {
      int open_fd;
      if (!absl::SimpleAtoi(entry->d_name, &open_fd) || open_fd <= 3 || open_fd == dirfd(fds)) {
        continue;
      }
      std::fprintf(stderr, "fake_enclave_worker: inherited an unexpected fd %d\n", open_fd);
      return 3;
    }
    closedir(fds);
  }
  if (const char* code = std::getenv("FAKE_ENCLAVE_EXIT_AT_START")) return std::atoi(code);
  if (std::getenv("FAKE_ENCLAVE_IGNORE_SIGTERM") != nullptr) signal(SIGTERM, SIG_IGN);
  bool fail_first_evidence = std::getenv("FAKE_ENCLAVE_FIRST_EVIDENCE_ERROR") != nullptr;

  if (!cloister::MakeDirs(sim_dir).ok() ||
      !cloister::WriteFileAtomic(sim_dir + "/ready", "fake\n").ok() ||
      (!policy_path.empty() &&
       !cloister::WriteFileAtomic(policy_path, "# fake development policy\n").ok())) {
    std::fprintf(stderr, "fake_enclave_worker: cannot write its files\n");
    return 1;
  }
  cloister::host::testing::FakeEnclave enclave;
  while (true) {
    absl::StatusOr<std::string> frame = cloister::boundary::ReadFrame(fd);
    if (!frame.ok()) return 0;  // cloisterd closed the socket
    cloister::boundary::v1::HostToEnclave call;
    if (!call.ParseFromString(*frame)) return 4;
    cloister::host::testing::FakeEnclave::Response response;
    if (fail_first_evidence && call.has_get_evidence()) {
      fail_first_evidence = false;
      auto& reply = response.frames.emplace_back();
      reply.set_call_id(call.call_id());
      reply.mutable_status()->set_code(9);
      reply.mutable_status()->set_message("not ready yet");
    } else {
      response = enclave.Respond(call);
    }
    for (const auto& frame : response.frames) {
      if (!cloister::boundary::WriteFrame(fd, frame.SerializeAsString()).ok()) return 0;
    }
    if (response.crash) _exit(3);  // asked to crash
  }
}

// Fuzz target for the enclave's side of the boundary (enclave/enclave.h): the host is untrusted,
// so every HostToEnclave it can send (evidence requests, session openings, model loads and
// reloads, sealed calls, batches, audit checkpoints, in any combination of fields) must get an
// EnclaveToHost with a status, never a crash, a hang or an abort. One simulated enclave serves
// every input, so state left by one input (a refused session, a counter) meets the next.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "cloister/boundary/v1/boundary.pb.h"
#include "enclave/enclave.h"

namespace {

std::string& SimDir() {
  static std::string dir;
  return dir;
}

cloister::enclave::Enclave* TheEnclave() {
  static cloister::enclave::Enclave* enclave = [] {
    char dir_template[] = "/tmp/cloister-boundary-fuzz-XXXXXX";
    const char* dir = mkdtemp(dir_template);
    if (dir == nullptr) std::abort();
    SimDir() = dir;
    std::atexit([] { std::filesystem::remove_all(SimDir()); });
    cloister::enclave::EnclaveOptions options;
    options.sim_dir = std::string(dir) + "/sim";
    options.measurement = cloister::Bytes(48, 0x42);
    options.load_options.threads = 1;
    auto made = cloister::enclave::Enclave::Create(std::move(options));
    if (!made.ok()) std::abort();
    return made->release();  // lives for the whole fuzzing process
  }();
  return enclave;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cloister::boundary::v1::HostToEnclave call;
  if (!call.ParseFromArray(data, static_cast<int>(size))) return 0;  // the frame layer refuses it
  const cloister::boundary::v1::EnclaveToHost reply = TheEnclave()->Handle(call);
  if (reply.call_id() != call.call_id()) __builtin_trap();  // every reply answers its call
  return 0;
}

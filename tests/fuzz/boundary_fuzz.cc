// Fuzz target for the enclave's side of the boundary (enclave/enclave.h): the host is untrusted,
// so every HostToEnclave it can send (evidence requests, session openings, model loads and
// reloads, sealed calls, batches, audit checkpoints, in any combination of fields) must get an
// EnclaveToHost with a status, never a crash, a hang or an abort. One simulated enclave serves
// every input, so state left by one input (a refused session, a counter) meets the next.
#include <cstddef>
#include <cstdint>

#include "cloister/boundary/v1/boundary.pb.h"
#include "tests/fuzz/fuzz_enclave.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cloister::boundary::v1::HostToEnclave call;
  if (!call.ParseFromArray(data, static_cast<int>(size))) return 0;  // the frame layer refuses it
  const cloister::boundary::v1::EnclaveToHost reply =
      cloister::fuzzing::TheFuzzEnclave().enclave->Handle(call);
  if (reply.call_id() != call.call_id()) __builtin_trap();  // every reply answers its call
  return 0;
}

// `cloister-bench coalescing`: what moving a batch's requests through the enclave's PCIe path as
// one coalesced transfer saves over moving each request on its own (DESIGN.md section 7). For
// each payload size, N requests (64 by default) are moved to the executor's side both ways in
// the same sitting, through one TransferPath (emulated mode by default: AES-256-GCM on the
// sender, authenticate and decrypt on the receiver):
//
//   separate   per request: one GatherToDevice of its bytes
//   coalesced  one GatherToDevice of all N requests' bytes, back to back
//
// Both sides seal straight from the requests' bytes, as the batch runner does (in modes off and
// driver the CUDA path gathers them into pinned memory first), and include the release
// (zeroing) of every buffer. The two sides alternate
// within each iteration (their order flips every iteration) so that load on a shared machine
// hits both alike. Before timing, one transfer of each kind is checked to deliver the bytes sent.
//
// Threading: runs on the calling thread (the TransferPath uses its own pool for chunks).
// Ownership: plain values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/runtime_vs_ort.h"

namespace cloister::bench {

struct CoalescingOptions {
  int requests = 64;                                            // N
  std::vector<int> payload_sizes = {64, 4096, 65536, 1 << 20};  // bytes per request
  int iterations = 30;                                          // timed runs per side and size
  int warmup = 3;                                               // untimed runs per side and size
  int threads = 0;                // the TransferPath's threads; 0: its default
  std::string mode = "emulated";  // off, driver or emulated
  // cpu: the enclave's TransferPath (the "device side" is the executor's thread). gpu: the CUDA
  // path (enclave/gpu/cuda_transfer.h): pinned memory, a real copy over PCIe, decryption by
  // CUDA kernels; needs a device and a build with CUDA.
  std::string device = "cpu";
  bool json = false;
};

struct CoalescingResult {
  int payload_size = 0;  // bytes per request
  int requests = 0;
  std::string mode;
  std::string device;
  int threads = 0;
  Timing separate;   // milliseconds per N requests
  Timing coalesced;  // milliseconds per N requests
  double gain() const { return separate.median_ms / coalesced.median_ms; }
};

// The target: coalescing N 64-byte requests at least this many times faster than N transfers.
inline constexpr double kCoalescingTargetGain = 5.0;

// InvalidArgument naming the flag for an unknown flag or a bad value.
absl::StatusOr<CoalescingOptions> ParseCoalescingFlags(const std::vector<std::string>& args,
                                                       CoalescingOptions defaults);
std::string CoalescingUsage();

// One JSON object on one line: payload (bytes), separate_us, coalesced_us (medians per N
// requests), gain, and the extras requests, mode, device, threads, iterations, separate_p90_us,
// coalesced_p90_us.
std::string CoalescingJsonLine(const CoalescingResult& result);
// An aligned table and one line with the verdict against kCoalescingTargetGain at 64 B.
std::string CoalescingTable(const std::vector<CoalescingResult>& results);

// Runs every payload size. With --json writes one JSON line per size to `out` as it finishes;
// without, progress to `log` and the table to `out` at the end. Errors: the path cannot be made,
// a transfer fails, or a transfer delivers other bytes than were sent.
absl::StatusOr<std::vector<CoalescingResult>> RunCoalescing(const CoalescingOptions& options,
                                                            std::FILE* out, std::FILE* log);

}  // namespace cloister::bench

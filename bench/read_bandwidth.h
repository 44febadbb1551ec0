// The host's memory read bandwidth, for the benchmarks' bandwidth_fraction (llm-vs-llamacpp):
// threads summing a buffer with the widest loads the CPU has.
// Threading: spawns and joins its own threads. Ownership: plain values.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"

namespace cloister::bench {

// Memory read bandwidth in bytes/s: `threads` threads each sum their share of a `size`-byte
// buffer (filled first, by those threads); the best of `passes` passes. InvalidArgument for a
// size under 1 MiB or no threads or passes; Internal when a sum comes out wrong (the compiler
// or the machine skipped reads).
absl::StatusOr<double> MeasureReadBandwidth(size_t size, int threads, int passes);

}  // namespace cloister::bench

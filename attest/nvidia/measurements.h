// Comparison of a GPU report's measurement blocks with the reference values of its driver and
// VBIOS RIMs, with the rules NVIDIA's verifiers share (shared/specs/attestation-formats.md
// section 5.4):
//   - the golden set is the active entries of both RIMs; an index active in both is a conflict;
//   - RIM index i is compared with report block i + 1: it matches when one of the entry's
//     alternatives equals the block's digest and the sizes agree; a missing block mismatches;
//   - index 35 is skipped when the report's NVDEC0_STATUS is 0x55 (NVDEC disabled);
//   - more golden entries than report blocks fails.
// The caller decides whether the RIMs were authentic; this only compares.
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attest/nvidia/rim.h"
#include "attest/spdm.h"
#include "base/bytes.h"

namespace cloister::attest {

// The RIM index whose comparison depends on NVDEC0 (section 5.4).
inline constexpr uint32_t kNvdecRimIndex = 35;
inline constexpr uint8_t kNvdecEnabled = 0xAA;
inline constexpr uint8_t kNvdecDisabled = 0x55;

enum class RimKind { kDriver, kVbios };
// "driver" or "vbios".
std::string RimKindName(RimKind kind);

struct MeasurementMismatch {
  uint32_t index = 0;  // RIM index; the report block is index + 1
  RimKind source = RimKind::kDriver;
  size_t golden_size = 0;
  std::vector<Bytes> golden;     // the RIM's alternatives
  std::optional<Bytes> runtime;  // the report block's value; nullopt when the block is missing
};

struct MeasurementComparison {
  std::vector<uint32_t> conflicting_indices;    // active in both RIMs, ascending
  std::vector<MeasurementMismatch> mismatches;  // ascending by index
  std::vector<uint32_t> matched_indices;        // ascending
  bool nvdec_index_skipped = false;             // index 35 skipped (NVDEC disabled)
  size_t golden_count = 0;                      // active entries of both RIMs together
  size_t runtime_count = 0;                     // blocks in the report

  // True when there is no conflict, no mismatch, and no more golden entries than blocks.
  bool Matches() const;
  // The mismatching indices, ascending ("1, 2, 3, 9"), or "" when none.
  std::string MismatchedIndexList() const;
};

// Compares `report` with whichever RIMs are given (nullptr for a missing one; the comparison
// then covers only the other). InvalidArgument when the report's NVDEC0_STATUS is neither
// 0xAA nor 0x55.
absl::StatusOr<MeasurementComparison> CompareMeasurements(const SpdmReport& report,
                                                          const Rim* driver_rim,
                                                          const Rim* vbios_rim);

}  // namespace cloister::attest

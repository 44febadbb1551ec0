#include "attest/nvidia/measurements.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cloister::attest {

std::string RimKindName(RimKind kind) { return kind == RimKind::kDriver ? "driver" : "vbios"; }

bool MeasurementComparison::Matches() const {
  return conflicting_indices.empty() && mismatches.empty() && golden_count <= runtime_count;
}

std::string MeasurementComparison::MismatchedIndexList() const {
  std::vector<uint32_t> indices;
  for (const MeasurementMismatch& mismatch : mismatches) indices.push_back(mismatch.index);
  return absl::StrJoin(indices, ", ");
}

absl::StatusOr<MeasurementComparison> CompareMeasurements(const SpdmReport& report,
                                                          const Rim* driver_rim,
                                                          const Rim* vbios_rim) {
  bool skip_nvdec = false;
  if (report.nvdec0_status.has_value()) {
    if (*report.nvdec0_status == kNvdecDisabled) {
      skip_nvdec = true;
    } else if (*report.nvdec0_status != kNvdecEnabled) {
      return absl::InvalidArgumentError(
          absl::StrCat("NVDEC0_STATUS is 0x", absl::Hex(*report.nvdec0_status, absl::kZeroPad2),
                       "; expected 0xaa (enabled) or 0x55 (disabled)"));
    }
  }

  // The golden set, by index; a second active entry for an index is a conflict.
  struct Golden {
    const RimMeasurement* entry;
    RimKind source;
  };
  std::map<uint32_t, Golden> golden;
  MeasurementComparison out;
  out.runtime_count = report.blocks.size();
  for (auto [rim, kind] :
       {std::pair{driver_rim, RimKind::kDriver}, std::pair{vbios_rim, RimKind::kVbios}}) {
    if (rim == nullptr) continue;
    for (const RimMeasurement* entry : rim->ActiveMeasurements()) {
      ++out.golden_count;
      auto [it, inserted] = golden.emplace(entry->index, Golden{entry, kind});
      if (!inserted) out.conflicting_indices.push_back(entry->index);
    }
  }
  std::sort(out.conflicting_indices.begin(), out.conflicting_indices.end());

  for (const auto& [index, reference] : golden) {
    if (index == kNvdecRimIndex && skip_nvdec) {
      out.nvdec_index_skipped = true;
      continue;
    }
    // RIM indices stop at 254, so the block index fits its byte.
    const SpdmMeasurementBlock* block = report.FindBlock(static_cast<uint8_t>(index + 1));
    bool matched = false;
    if (block != nullptr && block->value.size() == reference.entry->size) {
      for (const Bytes& alternative : reference.entry->alternatives) {
        matched = matched || alternative == block->value;
      }
    }
    if (matched) {
      out.matched_indices.push_back(index);
      continue;
    }
    MeasurementMismatch mismatch;
    mismatch.index = index;
    mismatch.source = reference.source;
    mismatch.golden_size = reference.entry->size;
    mismatch.golden = reference.entry->alternatives;
    if (block != nullptr) mismatch.runtime = block->value;
    out.mismatches.push_back(std::move(mismatch));
  }
  return out;
}

}  // namespace cloister::attest

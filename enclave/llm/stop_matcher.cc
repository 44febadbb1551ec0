#include "enclave/llm/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace cloister::llm {
namespace {

bool IsContinuationByte(char byte) { return (static_cast<unsigned char>(byte) & 0xC0) == 0x80; }

// Bytes a UTF-8 sequence has when it starts with `lead` (1 for anything that is not a lead of
// a longer sequence, so invalid bytes pass through one at a time).
size_t SequenceLength(char lead) {
  const auto byte = static_cast<unsigned char>(lead);
  if (byte >= 0xF0 && byte <= 0xF7) return 4;
  if (byte >= 0xE0) return byte <= 0xEF ? 3 : 1;
  if (byte >= 0xC0) return 2;
  return 1;
}

// The largest cut <= `cut` that does not split a UTF-8 character of `text`: it moves back over
// continuation bytes (at most three, so invalid text cannot hold back much) to the lead byte,
// and before a character that the text does not yet hold whole.
size_t CharacterBoundary(std::string_view text, size_t cut) {
  size_t boundary = cut;
  while (boundary > 0 && cut - boundary < 3 && boundary < text.size() &&
         IsContinuationByte(text[boundary])) {
    --boundary;
  }
  if (boundary < text.size() && IsContinuationByte(text[boundary])) return cut;  // invalid
  if (boundary == text.size()) {
    // The text ends at the cut: hold a trailing character that is still incomplete.
    size_t lead = text.size();
    while (lead > 0 && text.size() - lead < 3 && IsContinuationByte(text[lead - 1])) --lead;
    if (lead > 0) {
      --lead;
      if (!IsContinuationByte(text[lead]) && lead + SequenceLength(text[lead]) > text.size()) {
        return lead;
      }
    }
  }
  return boundary;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& stop : stops) {
    if (stop.empty()) continue;
    longest_stop_ = std::max(longest_stop_, stop.size());
    stops_.push_back(std::move(stop));
  }
}

StopMatcher::Result StopMatcher::Push(std::string_view delta) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  held_.append(delta);

  // The stop that completes first; ties to the one that starts first.
  size_t best_start = std::string::npos;
  size_t best_end = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t start = held_.find(stop);
    if (start == std::string::npos) continue;
    const size_t end = start + stop.size();
    if (end < best_end || (end == best_end && start < best_start)) {
      best_start = start;
      best_end = end;
    }
  }
  if (best_start != std::string::npos) {
    stopped_ = true;
    result.stopped = true;
    result.text = held_.substr(0, best_start);
    held_.clear();
    return result;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string: any later match
  // must start there, since none is complete now.
  size_t hold = 0;
  const size_t longest_suffix = std::min(held_.size(), longest_stop_ - (longest_stop_ > 0));
  for (size_t length = longest_suffix; length > 0 && hold == 0; --length) {
    const std::string_view suffix = std::string_view(held_).substr(held_.size() - length);
    for (const std::string& stop : stops_) {
      if (stop.size() > length && std::string_view(stop).substr(0, length) == suffix) {
        hold = length;
        break;
      }
    }
  }
  const size_t cut = CharacterBoundary(held_, held_.size() - hold);
  result.text = held_.substr(0, cut);
  held_.erase(0, cut);
  return result;
}

std::string StopMatcher::Finish() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

}  // namespace cloister::llm

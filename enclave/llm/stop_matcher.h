// StopMatcher: applies stop strings to one sequence's streamed text with OpenAI semantics: the
// output ends just before the first stop string that appears, which is not included. Text that
// might be the beginning of a stop string is held back until the next delta settles it, and a
// UTF-8 character is never split between two results.
//
// Which stop wins: the one whose last byte comes first in the stream (the one a byte-by-byte
// stream would complete first), and among those ending at the same byte the one that starts
// first (the longest). So the output does not depend on how the text is cut into deltas.
//
// Threading: one per sequence; not thread-safe. Owns copies of the stop strings.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace cloister::llm {

class StopMatcher {
 public:
  // Empty strings are ignored; no stop strings at all means text passes straight through
  // (still whole UTF-8 characters).
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string appeared; `text` is the last output
  };

  // Adds `delta` to the stream. After a stop, returns an empty text with stopped set.
  Result Push(std::string_view delta);

  // The end of the stream without a stop: releases what was held back (possibly an incomplete
  // UTF-8 character, as received). Empty after a stop.
  std::string Finish();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::string held_;  // received but not yet emitted
  bool stopped_ = false;
};

}  // namespace cloister::llm

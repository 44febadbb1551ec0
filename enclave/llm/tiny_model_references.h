// Test support: the shared tiny model's references (reference.json, reference_logits.npy) and
// a greedy run of every reference prompt through one Generator. Header-only, for the CPU and
// the CUDA engine's tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "enclave/llm/generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cloister::llm::testing {

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A float32 .npy vector (little-endian, C order).
inline std::vector<float> ReadNpy(const std::string& path) {
  std::string bytes = ReadText(path);
  EXPECT_EQ(bytes.substr(1, 5), "NUMPY");
  uint16_t header_size = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  std::string header = bytes.substr(10, header_size);
  EXPECT_THAT(header, ::testing::HasSubstr("'<f4'"));
  size_t offset = 10 + header_size;
  std::vector<float> values((bytes.size() - offset) / 4);
  std::memcpy(values.data(), bytes.data() + offset, values.size() * 4);
  return values;
}

struct Reference {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;
  std::string generated_text;
  std::vector<double> margins;  // top-1 minus top-2 logit at each generated step
};

inline std::vector<Reference> LoadReferences(const std::string& dir) {
  nlohmann::json root = nlohmann::json::parse(ReadText(dir + "/reference.json"));
  std::vector<Reference> out;
  for (const auto& prompt : root["prompts"]) {
    Reference r;
    r.prompt_ids = prompt["prompt_ids"].get<std::vector<int32_t>>();
    r.generated_ids = prompt["generated_ids"].get<std::vector<int32_t>>();
    r.generated_text = prompt["generated_text"].get<std::string>();
    r.margins = prompt["margins"].get<std::vector<double>>();
    out.push_back(std::move(r));
  }
  return out;
}

// The largest |a - b| / max(1, |b|).
inline double WorstRelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double error = std::abs(double{a[i]} - b[i]) / std::max(1.0, std::abs(double{b[i]}));
    worst = std::max(worst, error);
  }
  return worst;
}

// Runs every request through `generator` until it is idle; the ids (and texts) per request.
inline std::vector<std::vector<int32_t>> RunAll(Generator& generator,
                                               const std::vector<GenerationRequest>& requests,
                                               std::vector<std::string>* texts = nullptr) {
  std::vector<uint64_t> ids;
  for (const GenerationRequest& request : requests) {
    auto id = generator.Add(request);
    EXPECT_TRUE(id.ok()) << id.status();
    ids.push_back(id.ok() ? *id : 0);
  }
  std::vector<std::vector<int32_t>> out(requests.size());
  if (texts) texts->assign(requests.size(), "");
  int steps = 0;
  while (!generator.idle() && steps++ < 10000) {
    auto events = generator.Step();
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) break;
    for (const TokenEvent& event : *events) {
      size_t index = std::find(ids.begin(), ids.end(), event.sequence) - ids.begin();
      out[index].push_back(event.token.id);
      if (texts) (*texts)[index] += event.text;
    }
  }
  return out;
}

// Greedy requests for the reference prompts, at most 48 tokens each (as the references).
inline std::vector<GenerationRequest> GreedyRequests(const std::vector<Reference>& refs,
                                                     int64_t context) {
  std::vector<GenerationRequest> requests;
  for (const Reference& r : refs) {
    GenerationRequest request;
    request.prompt_ids = r.prompt_ids;
    request.sampling.temperature = 0;
    request.max_tokens =
        std::min<int64_t>(48, context - static_cast<int64_t>(r.prompt_ids.size()));
    requests.push_back(std::move(request));
  }
  return requests;
}

}  // namespace cloister::llm::testing

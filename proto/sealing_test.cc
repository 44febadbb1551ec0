// Serializing for sealing in place: the bytes are exactly the message's serialization, followed
// by room for the AEAD tag; the InferRequestPayload written straight from the caller's tensors
// is byte for byte what the message would give.
#include "proto/sealing.h"

#include <string>
#include <vector>

#include "crypto/aead.h"
#include "gtest/gtest.h"

namespace cloister::proto {
namespace {

api::v1::Tensor MakeTensor(const std::string& name, size_t size, std::vector<int64_t> shape) {
  api::v1::Tensor tensor;
  tensor.set_name(name);
  tensor.set_datatype("FP32");
  for (int64_t d : shape) tensor.add_shape(d);
  std::string raw(size, '\0');
  for (size_t i = 0; i < size; ++i) raw[i] = static_cast<char>(i * 7 + 3);
  tensor.set_raw(std::move(raw));
  return tensor;
}

std::string Plaintext(std::span<uint8_t> sealed_span) {
  return std::string(reinterpret_cast<const char*>(sealed_span.data()),
                     sealed_span.size() - crypto::kAeadTagSize);
}

TEST(SealingTest, InferRequestFromTheCallersTensorsMatchesTheMessage) {
  const std::vector<std::vector<api::v1::Tensor>> input_sets = {
      {MakeTensor("x", 16, {1, 4})},
      // A tensor over 2 MiB (a four-byte length), an empty one, and one with no shape.
      {MakeTensor("a", (3 << 20) + 5, {1, 3, 48, 192}), MakeTensor("b", 0, {0}),
       MakeTensor("", 200, {})},
  };
  const std::vector<std::vector<std::string>> output_sets = {{}, {"y"}, {"z", "", "logits"}};
  for (const auto& inputs : input_sets) {
    for (const auto& outputs : output_sets) {
      api::v1::InferRequestPayload payload;
      for (const auto& input : inputs) *payload.add_inputs() = input;
      for (const auto& output : outputs) payload.add_outputs(output);

      std::string direct;
      auto written = SerializeInferRequestForSealing(inputs, outputs, direct);
      ASSERT_TRUE(written.ok()) << written.status();
      EXPECT_EQ(written->size(), direct.size());
      EXPECT_EQ(direct.size(), payload.ByteSizeLong() + crypto::kAeadTagSize);
      EXPECT_TRUE(Plaintext(*written) == payload.SerializeAsString())
          << inputs.size() << " inputs, " << outputs.size() << " outputs";

      std::string via_message;
      auto whole = SerializeForSealing(payload, via_message);
      ASSERT_TRUE(whole.ok()) << whole.status();
      EXPECT_TRUE(via_message == direct);
    }
  }
}

}  // namespace
}  // namespace cloister::proto

#include "proto/wipe.h"

#include <gtest/gtest.h>

#include <string>

#include "cloister/api/v1/api.pb.h"

namespace cloister::proto {
namespace {

bool AllZero(const std::string& bytes) {
  return bytes.find_first_not_of('\0') == std::string::npos;
}

TEST(WipeMessageTest, EveryStringNestedRepeatedAndUnknownIsZeroedInPlace) {
  api::v1::InferRequestPayload payload;
  for (int i = 0; i < 3; ++i) {
    api::v1::Tensor* tensor = payload.add_inputs();
    tensor->set_name("input-" + std::to_string(i));
    tensor->set_datatype("FP32");
    tensor->add_shape(4);
    tensor->set_raw(std::string(4096, static_cast<char>('a' + i)));
  }
  payload.add_outputs("a-requested-output-name-longer-than-small-string-storage");
  // An unknown length-delimited field (number 1000) as a newer client might send.
  std::string serialized = payload.SerializeAsString();
  serialized += std::string("\xc2\x3e\x07", 3) + "unknown";
  api::v1::InferRequestPayload parsed;
  ASSERT_TRUE(parsed.ParseFromString(serialized));
  ASSERT_EQ(parsed.GetReflection()->GetUnknownFields(parsed).field_count(), 1);

  // Where the bytes live now; after the wipe the same memory must hold zeros.
  const char* raw_storage = parsed.inputs(1).raw().data();
  const size_t raw_size = parsed.inputs(1).raw().size();
  WipeMessage(parsed);

  ASSERT_EQ(parsed.inputs_size(), 3);
  for (const auto& tensor : parsed.inputs()) {
    EXPECT_TRUE(AllZero(tensor.raw()));
    EXPECT_EQ(tensor.raw().size(), 4096u);  // the shape of the message is kept
    EXPECT_TRUE(AllZero(tensor.name()));
    EXPECT_TRUE(AllZero(tensor.datatype()));
    EXPECT_EQ(tensor.shape(0), 4);  // numbers are left alone
  }
  EXPECT_TRUE(AllZero(parsed.outputs(0)));
  EXPECT_EQ(parsed.inputs(1).raw().data(), raw_storage);
  EXPECT_TRUE(AllZero(std::string(raw_storage, raw_size)));
  EXPECT_TRUE(AllZero(
      parsed.GetReflection()->GetUnknownFields(parsed).field(0).length_delimited()));
}

TEST(WipeMessageTest, UnsetFieldsStayUnset) {
  api::v1::ReplyEnvelope envelope;
  WipeMessage(envelope);
  EXPECT_EQ(envelope.ByteSizeLong(), 0u);
}

TEST(WipeStringTest, ZeroesEveryByte) {
  std::string bytes = "plaintext that must not linger in freed memory";
  const size_t size = bytes.size();
  WipeString(bytes);
  EXPECT_EQ(bytes.size(), size);
  EXPECT_TRUE(AllZero(bytes));
}

}  // namespace
}  // namespace cloister::proto

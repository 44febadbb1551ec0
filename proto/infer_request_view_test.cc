// ReadInferRequestView against protobuf's own parser: the same requests accepted and refused,
// the same contents read, over valid requests, their encodings that protobuf also accepts
// (unpacked shapes, fields repeated, unknown fields, field 4 as a varint) and random damage.
#include "proto/infer_request_view.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace cloister::proto {
namespace {

api::v1::InferRequestPayload Sample(std::mt19937& random) {
  api::v1::InferRequestPayload payload;
  const int inputs = static_cast<int>(random() % 4);
  for (int i = 0; i < inputs; ++i) {
    api::v1::Tensor* tensor = payload.add_inputs();
    tensor->set_name("input_" + std::to_string(i));
    tensor->set_datatype(random() % 2 ? "FP32" : "INT64");
    const int rank = static_cast<int>(random() % 4);
    for (int d = 0; d < rank; ++d) tensor->add_shape(static_cast<int64_t>(random() % 300));
    std::string raw(random() % 2000, '\0');
    for (char& c : raw) c = static_cast<char>(random());
    tensor->set_raw(raw);
  }
  for (int o = 0; o < static_cast<int>(random() % 3); ++o) {
    payload.add_outputs("out_" + std::to_string(o));
  }
  return payload;
}

ByteSpan Span(const std::string& bytes) {
  return {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
}

// The payload the view stands for, as one message.
api::v1::InferRequestPayload Whole(const InferRequestView& view) {
  api::v1::InferRequestPayload whole = view.rest;
  whole.clear_inputs();
  for (const InferRequestView::Input& input : view.inputs) {
    api::v1::Tensor* tensor = whole.add_inputs();
    *tensor = input.meta;
    tensor->set_raw(std::string(reinterpret_cast<const char*>(input.raw.data()), input.raw.size()));
  }
  return whole;
}

// Both readers agree on `bytes`: both refuse it, or both read the same message.
void ExpectSameAsProtobuf(const std::string& bytes, const std::string& what) {
  api::v1::InferRequestPayload parsed;
  const bool protobuf = parsed.ParseFromString(bytes);
  InferRequestView view;
  const bool ours = ReadInferRequestView(Span(bytes), view);
  ASSERT_EQ(ours, protobuf) << what;
  if (!ours) return;
  EXPECT_TRUE(view.rest.inputs().empty()) << what;
  EXPECT_EQ(Whole(view).SerializeAsString(), parsed.SerializeAsString()) << what;
  for (const InferRequestView::Input& input : view.inputs) {
    EXPECT_TRUE(input.meta.raw().empty()) << what;
    if (!input.raw.empty()) {
      // A view into `bytes`, not a copy.
      EXPECT_GE(input.raw.data(), Span(bytes).data()) << what;
      EXPECT_LE(input.raw.data() + input.raw.size(), Span(bytes).data() + bytes.size()) << what;
    }
  }
}

TEST(InferRequestViewTest, ReadsWhatTheSdkSendsWithTheTensorsInPlace) {
  std::mt19937 random(7);
  for (int i = 0; i < 200; ++i) {
    const std::string bytes = Sample(random).SerializeAsString();
    ExpectSameAsProtobuf(bytes, "sample " + std::to_string(i));
  }
  api::v1::InferRequestPayload empty;
  ExpectSameAsProtobuf(empty.SerializeAsString(), "empty");
}

// Encodings protobuf accepts that the SDK does not write.
TEST(InferRequestViewTest, OtherEncodingsReadAsProtobufReadsThem) {
  api::v1::Tensor tensor;
  tensor.set_name("x");
  tensor.set_datatype("FP32");
  tensor.add_shape(2);
  tensor.set_raw(std::string(8, '\x11'));
  const std::string one = tensor.SerializeAsString();
  auto payload_of = [](const std::string& tensor_bytes) {
    // Field 1, length-delimited, holding `tensor_bytes` (under 128 bytes).
    return std::string("\x0a", 1) + static_cast<char>(tensor_bytes.size()) + tensor_bytes;
  };
  // raw twice (the last wins), name twice, shape unpacked (field 3 as varints) and packed.
  const std::string twice = one + std::string("\x22\x02zz", 4) + std::string("\x0a\x01y", 3) +
                            std::string("\x18\x05\x18\x06", 4);
  ExpectSameAsProtobuf(payload_of(twice), "fields repeated, shape unpacked");
  // Unknown fields in the tensor and in the payload (field 9 varint, field 10 fixed64).
  const std::string unknown_tensor = one + std::string("\x48\x01", 2);
  ExpectSameAsProtobuf(payload_of(unknown_tensor) + std::string("\x51", 1) + std::string(8, 'u'),
                       "unknown fields");
  // Field 4 as a varint: an unknown field for protobuf, not a view.
  ExpectSameAsProtobuf(payload_of(std::string("\x0a\x01x\x20\x07", 5)), "raw as a varint");
  // Field 1 as a varint at the top.
  ExpectSameAsProtobuf(std::string("\x08\x05", 2), "inputs as a varint");
  // A group that closes, and one that does not.
  ExpectSameAsProtobuf(std::string("\x5b\x08\x01\x5c", 4), "a closed group");
  ExpectSameAsProtobuf(std::string("\x5b\x08\x01", 3), "an open group");
  // A name that is not UTF-8 (proto3 strings are checked), a tag 0, a length past the end.
  ExpectSameAsProtobuf(payload_of(std::string("\x0a\x02\xff\xfe", 4)), "name not UTF-8");
  ExpectSameAsProtobuf(std::string("\x00\x00", 2), "tag 0");
  ExpectSameAsProtobuf(payload_of(one).substr(0, 10), "cut short");
  ExpectSameAsProtobuf(std::string("\x0a\x7f", 2) + one, "length past the end");
  ExpectSameAsProtobuf(std::string("\x12\x02\xc3\x28", 4), "output name not UTF-8");
}

TEST(InferRequestViewTest, DamagedRequestsAreRefusedOrReadAsProtobufReadsThem) {
  std::mt19937 random(11);
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = Sample(random).SerializeAsString();
    if (bytes.empty()) continue;
    switch (random() % 4) {
      case 0:  // a byte changed
        bytes[random() % bytes.size()] = static_cast<char>(random());
        break;
      case 1:  // cut short
        bytes.resize(random() % bytes.size());
        break;
      case 2:  // a byte inserted
        bytes.insert(bytes.begin() + static_cast<long>(random() % bytes.size()),
                     static_cast<char>(random()));
        break;
      default:  // several bytes changed near the start, where the tags and lengths are
        for (int k = 0; k < 3; ++k) {
          bytes[random() % std::min<size_t>(bytes.size(), 24)] = static_cast<char>(random());
        }
    }
    ExpectSameAsProtobuf(bytes, "damaged request " + std::to_string(i));
  }
}

}  // namespace
}  // namespace cloister::proto

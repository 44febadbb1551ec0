// An InferRequestPayload (cloister.api.v1) read in place: every input tensor's `raw` bytes are a
// view into the serialized request instead of a copy, so an opened 1.77 MB request is not copied
// into a second plaintext buffer (which would then need wiping too). The request's other fields
// (tensor names, data types, shapes, output names, unknown fields) go through protobuf's own
// parser, so what is accepted and how it reads is protobuf's: a field seen twice keeps the last
// value, `shape` packed or not, UTF-8 checked in strings. Only a `raw` field of wire type
// length-delimited is taken as a view; any other encoding of field 4 reaches the parser.
#pragma once

#include <vector>

#include "base/bytes.h"
#include "cloister/api/v1/api.pb.h"

namespace cloister::proto {

struct InferRequestView {
  struct Input {
    api::v1::Tensor meta;  // name, datatype, shape; `raw` left empty
    ByteSpan raw;          // the tensor's bytes, inside the serialized request
  };
  std::vector<Input> inputs;
  api::v1::InferRequestPayload rest;  // the output names (and unknown fields); no inputs
};

// Reads `bytes` as an InferRequestPayload; false where protobuf's parser would refuse it. The
// views in `out` stay valid while `bytes` does.
bool ReadInferRequestView(ByteSpan bytes, InferRequestView& out);

}  // namespace cloister::proto

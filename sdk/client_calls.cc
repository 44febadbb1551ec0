// Client (client.h): ListModels, DeleteModel and Infer, each one sealed unary call.
#include <iterator>
#include <string>
#include <vector>

#include "base/status.h"
#include "crypto/model_handle.h"
#include "proto/sealing.h"
#include "sdk/client.h"
#include "sdk/npy.h"

namespace cloister::sdk {

namespace api = ::cloister::api::v1;

namespace {

// Serializes a whole request message for SealedUnaryCall.
auto SerializerOf(const google::protobuf::MessageLite& request) {
  return [&request](std::string& buffer) { return proto::SerializeForSealing(request, buffer); };
}

}  // namespace

absl::StatusOr<std::vector<api::ModelInfo>> Client::ListModels() {
  api::ListModelsRequest request;
  api::ListModelsReply reply;
  RETURN_IF_ERROR(
      SealedUnaryCall(crypto::MessageKind::kListModels, "", SerializerOf(request), reply));
  return std::vector<api::ModelInfo>(reply.models().begin(), reply.models().end());
}

absl::Status Client::DeleteModel(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  api::DeleteModelRequest request;
  request.set_name(name);
  api::DeleteModelReply reply;
  return SealedUnaryCall(crypto::MessageKind::kDeleteModel,
                         crypto::ModelHandle(identity_->public_key(), name), SerializerOf(request),
                         reply);
}

absl::StatusOr<std::vector<api::Tensor>> Client::Infer(const std::string& name,
                                                       const std::vector<api::Tensor>& inputs,
                                                       const std::vector<std::string>& outputs,
                                                       absl::Duration timeout) {
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  if (inputs.empty()) return absl::InvalidArgumentError("no input tensors given");
  // Check sizes here so a malformed tensor gets a clear local error.
  for (const api::Tensor& input : inputs) RETURN_IF_ERROR(ValidateTensor(input));
  api::InferReplyPayload reply;
  RETURN_IF_ERROR(SealedUnaryCall(
      crypto::MessageKind::kInfer, ModelHandleFor(name),
      [&](std::string& buffer) {
        return proto::SerializeInferRequestForSealing(inputs, outputs, buffer);
      },
      reply, timeout));
  return std::vector<api::Tensor>(std::make_move_iterator(reply.mutable_outputs()->begin()),
                                  std::make_move_iterator(reply.mutable_outputs()->end()));
}

}  // namespace cloister::sdk

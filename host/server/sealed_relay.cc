#include "host/server/sealed_relay.h"

#include <utility>

#include "host/enclave_client/enclave_client.h"

namespace cloister::host {

boundary::v1::ForwardedRequest ToForwardedRequest(const api::v1::SealedRequest& call, std::string ciphertext) {
  boundary::v1::ForwardedRequest item;
  item.set_session_id(call.session_id());
  item.set_request_id(call.request_id());
  item.set_model_handle(call.model_handle());
  item.set_sequence(call.sequence());
  item.set_ciphertext(std::move(ciphertext));
  return item;
}

absl::Status ToSealedReply(boundary::v1::EnclaveReply& item, absl::string_view request_id,
                           api::v1::SealedReply& response) {
  if (item.has_status() && item.status().code() != 0) return FromBoundaryStatus(item.status());
  if (item.request_id() != request_id) {
    return absl::InternalError("enclave replied for a different request id");
  }
  response.set_sequence(item.sequence());
  response.set_ciphertext(std::move(*item.mutable_ciphertext()));
  return absl::OkStatus();
}

}  // namespace cloister::host

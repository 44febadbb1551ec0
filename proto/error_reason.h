// Error reasons (cloister/api/v1/error.proto) carried on absl::Status and across each hop: the
// boundary Status, the sealed ReplyEnvelope and gRPC status details. Code that decides what to
// do about an error (retry, attest again, back off) asks ReasonOf, never the message.
//
// Threading: pure functions. Ownership: nothing kept.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "cloister/api/v1/error.pb.h"
#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::proto {

using api::v1::ErrorReason;

// The absl::Status payload key under which the reason travels in process.
inline constexpr char kErrorReasonPayload[] = "type.googleapis.com/cloister.api.v1.ErrorReason";
// The ErrorInfo domain of every Cloister reason.
inline constexpr char kErrorDomain[] = "cloister";

// `status` with `reason` attached (replacing any earlier one); OK and UNSPECIFIED leave it as is.
absl::Status WithReason(absl::Status status, ErrorReason reason);
// The reason attached to `status`; ERROR_REASON_UNSPECIFIED when none is.
ErrorReason ReasonOf(const absl::Status& status);
// "SESSION_LOST"; "" for UNSPECIFIED or a number this build does not know.
std::string_view ReasonName(ErrorReason reason);

// The boundary Status of `status` (code, message, reason); OK clears it.
void SetBoundaryStatus(const absl::Status& status, boundary::v1::Status& out);
// The absl::Status a boundary Status stands for. A code outside absl's range is UNKNOWN
// "enclave error with unknown code N: MESSAGE"; an unknown reason is dropped.
absl::Status FromBoundaryStatus(const boundary::v1::Status& status);

// gRPC status details (the bytes of an ErrorStatus holding one ErrorInfo) for `status`; empty
// when it has no reason.
std::string GrpcErrorDetails(const absl::Status& status);
// The reason in gRPC status details; UNSPECIFIED when there is none, the bytes are not an
// ErrorStatus, or its ErrorInfo is of another domain or names a reason this build does not know.
ErrorReason ReasonFromGrpcDetails(std::string_view details);

}  // namespace cloister::proto

#include "proto/error_reason.h"

#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace cloister::proto {

namespace {

constexpr char kErrorInfoType[] = "type.googleapis.com/cloister.api.v1.ErrorInfo";

std::optional<ErrorReason> ReasonNamed(std::string_view name) {
  ErrorReason reason;
  if (!api::v1::ErrorReason_Parse(std::string(name), &reason)) return std::nullopt;
  return reason;
}

}  // namespace

absl::Status WithReason(absl::Status status, ErrorReason reason) {
  if (status.ok() || reason == api::v1::ERROR_REASON_UNSPECIFIED) return status;
  status.SetPayload(kErrorReasonPayload, absl::Cord(std::string(ReasonName(reason))));
  return status;
}

ErrorReason ReasonOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kErrorReasonPayload);
  if (!payload.has_value()) return api::v1::ERROR_REASON_UNSPECIFIED;
  return ReasonNamed(std::string(*payload)).value_or(api::v1::ERROR_REASON_UNSPECIFIED);
}

std::string_view ReasonName(ErrorReason reason) {
  if (reason == api::v1::ERROR_REASON_UNSPECIFIED || !api::v1::ErrorReason_IsValid(reason)) {
    return {};
  }
  return api::v1::ErrorReason_Name(reason);
}

void SetBoundaryStatus(const absl::Status& status, boundary::v1::Status& out) {
  out.Clear();
  if (status.ok()) return;
  out.set_code(static_cast<int>(status.code()));
  out.set_message(std::string(status.message()));
  out.set_reason(ReasonOf(status));
}

absl::Status FromBoundaryStatus(const boundary::v1::Status& status) {
  if (status.code() == 0) return absl::OkStatus();
  int code = status.code();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(
        absl::StrCat("enclave error with unknown code ", code, ": ", status.message()));
  }
  return WithReason(absl::Status(static_cast<absl::StatusCode>(code), status.message()),
                    api::v1::ErrorReason_IsValid(status.reason())
                        ? status.reason()
                        : api::v1::ERROR_REASON_UNSPECIFIED);
}

std::string GrpcErrorDetails(const absl::Status& status) {
  std::string_view name = ReasonName(ReasonOf(status));
  if (status.ok() || name.empty()) return {};
  api::v1::ErrorInfo info;
  info.set_reason(std::string(name));
  info.set_domain(kErrorDomain);
  api::v1::ErrorStatus details;
  details.set_code(static_cast<int>(status.code()));
  details.set_message(std::string(status.message()));
  google::protobuf::Any* any = details.add_details();
  any->set_type_url(kErrorInfoType);
  any->set_value(info.SerializeAsString());
  return details.SerializeAsString();
}

ErrorReason ReasonFromGrpcDetails(std::string_view details) {
  api::v1::ErrorStatus status;
  if (details.empty() || !status.ParseFromArray(details.data(), static_cast<int>(details.size()))) {
    return api::v1::ERROR_REASON_UNSPECIFIED;
  }
  for (const google::protobuf::Any& any : status.details()) {
    api::v1::ErrorInfo info;
    if (any.type_url() != kErrorInfoType || !info.ParseFromString(any.value())) continue;
    if (info.domain() != kErrorDomain) continue;
    return ReasonNamed(info.reason()).value_or(api::v1::ERROR_REASON_UNSPECIFIED);
  }
  return api::v1::ERROR_REASON_UNSPECIFIED;
}

}  // namespace cloister::proto

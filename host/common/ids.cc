#include "host/common/ids.h"

#include "absl/strings/str_cat.h"

namespace cloister::host {
namespace {

bool IsAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

bool IsValidTenantId(absl::string_view tenant_id) {
  if (tenant_id.empty() || tenant_id.size() > kMaxTenantIdSize) return false;
  if (!IsAlnum(tenant_id[0])) return false;
  for (char c : tenant_id) {
    if (!IsAlnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

bool IsValidModelHandle(absl::string_view handle) {
  if (handle.size() != kModelHandleSize) return false;
  for (char c : handle) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status CheckTenantId(absl::string_view tenant_id) {
  if (IsValidTenantId(tenant_id)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid tenant id (", tenant_id.size(),
                   " characters): use 1 to 64 of [A-Za-z0-9._-], starting with a letter or digit"));
}

absl::Status CheckModelHandle(absl::string_view handle) {
  if (IsValidModelHandle(handle)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("invalid model handle (", handle.size(),
                                                 " characters): expected 32 lowercase hex digits"));
}

absl::Status CheckRequestId(absl::string_view request_id) {
  if (request_id.empty()) return absl::InvalidArgumentError("request id is empty");
  if (request_id.size() > kMaxRequestIdSize) {
    return absl::InvalidArgumentError(absl::StrCat("request id of ", request_id.size(),
                                                   " characters exceeds the limit of ",
                                                   kMaxRequestIdSize));
  }
  for (char c : request_id) {
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(
          "request id must be printable ASCII without spaces or control characters");
    }
  }
  return absl::OkStatus();
}

}  // namespace cloister::host

#include "host/tenants/tenant_registry.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/random.h"
#include "host/common/ids.h"
#include "host/common/std_string_view.h"

namespace cloister::host {
namespace {

constexpr char kUnauthenticated[] = "unknown tenant or wrong API token";
constexpr size_t kTokenSize = 32;

}  // namespace

Bytes TokenHash(absl::string_view token) { return crypto::Sha256(AsBytes(ToStd(token))); }

absl::StatusOr<std::shared_ptr<const TenantRegistry::Snapshot>> TenantRegistry::Build(
    std::vector<TenantCredential> tenants) {
  auto snapshot = std::make_shared<Snapshot>();
  for (TenantCredential& tenant : tenants) {
    RETURN_IF_ERROR(CheckTenantId(tenant.tenant_id));
    // Empty: a tenant admitted by its client certificate alone; no token matches it.
    if (!tenant.token_sha256.empty() && tenant.token_sha256.size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat("tenant ", tenant.tenant_id,
                                                     ": token hash must be 32 bytes, got ",
                                                     tenant.token_sha256.size()));
    }
    auto [it, inserted] =
        snapshot->emplace(std::move(tenant.tenant_id), std::move(tenant.token_sha256));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tenant ", it->first, " is listed twice"));
    }
  }
  return std::shared_ptr<const Snapshot>(std::move(snapshot));
}

absl::StatusOr<std::unique_ptr<TenantRegistry>> TenantRegistry::Create(
    std::vector<TenantCredential> tenants) {
  ASSIGN_OR_RETURN(auto snapshot, Build(std::move(tenants)));
  return std::unique_ptr<TenantRegistry>(new TenantRegistry(std::move(snapshot)));
}

TenantRegistry::TenantRegistry(std::shared_ptr<const Snapshot> snapshot)
    : snapshot_(std::move(snapshot)) {}

absl::Status TenantRegistry::Replace(std::vector<TenantCredential> tenants) {
  ASSIGN_OR_RETURN(auto snapshot, Build(std::move(tenants)));
  snapshot_.store(std::move(snapshot));
  return absl::OkStatus();
}

absl::Status TenantRegistry::Authenticate(absl::string_view tenant_id,
                                          absl::string_view token) const {
  std::shared_ptr<const Snapshot> snapshot = snapshot_.load();
  Bytes presented = TokenHash(token);
  auto it = snapshot->find(tenant_id);
  // An unknown tenant still costs one comparison, so timing does not tell ids apart.
  static const Bytes kNoTenant(32, 0);
  const Bytes& expected = it == snapshot->end() ? kNoTenant : it->second;
  bool match = expected.size() == presented.size() && ConstantTimeEquals(presented, expected);
  if (it == snapshot->end() || !match) return absl::UnauthenticatedError(kUnauthenticated);
  return absl::OkStatus();
}

size_t TenantRegistry::tenant_count() const { return snapshot_.load()->size(); }

absl::StatusOr<std::string> LoadOrCreateDevToken(const std::string& token_path) {
  if (FileExists(token_path)) {
    struct stat st;
    if (::stat(token_path.c_str(), &st) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("cannot stat ", token_path));
    }
    if ((st.st_mode & 077) != 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s is accessible to other users (mode %04o); run chmod 600 on it",
                          token_path, st.st_mode & 07777));
    }
    ASSIGN_OR_RETURN(std::string text, ReadFile(token_path, 4096));
    std::string token(absl::StripAsciiWhitespace(text));
    absl::StatusOr<Bytes> decoded = HexDecode(token);
    if (!decoded.ok() || decoded->size() != kTokenSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          token_path, " does not hold a token (64 hex characters); delete it to make a new one"));
    }
    return token;
  }
  std::string token = HexEncode(crypto::RandomBytes(kTokenSize));
  RETURN_IF_ERROR(WriteFileAtomic(token_path, token, 0600));
  return token;
}

}  // namespace cloister::host

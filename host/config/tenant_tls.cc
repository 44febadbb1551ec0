#include "host/config/tenant_tls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace cloister::host {
namespace {

// The metadata key the service reads the tenant from (PROTOCOL.md section 1).
constexpr char kTenantMetadataKey[] = "x-cloister-tenant";
// How often the file watcher re-reads the certificate files.
constexpr unsigned kCertificateRefreshSeconds = 60;

absl::Status CheckPem(const std::string& path, absl::string_view field, absl::string_view kind) {
  absl::Status status = CheckPemFile(path, kind);
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", status.message()));
}

}  // namespace

std::vector<std::string> PeerCertificateNames(const grpc::AuthContext& context) {
  std::vector<std::string> names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name", "peer_dns",
                               "peer_uri", "peer_email", "peer_ip"}) {
    for (const grpc::string_ref& value : context.FindPropertyValues(property)) {
      names.emplace_back(value.data(), value.size());
    }
  }
  return names;
}

TenantIdentityCheck::TenantIdentityCheck(const std::vector<TenantConfig>& tenants)
    : snapshot_(Build(tenants)) {}

std::shared_ptr<const TenantIdentityCheck::Snapshot> TenantIdentityCheck::Build(
    const std::vector<TenantConfig>& tenants) {
  auto snapshot = std::make_shared<Snapshot>();
  for (const TenantConfig& tenant : tenants) {
    if (tenant.mtls_identities.empty()) continue;
    (*snapshot)[tenant.tenant_id].insert(tenant.mtls_identities.begin(),
                                         tenant.mtls_identities.end());
  }
  return snapshot;
}

void TenantIdentityCheck::Replace(const std::vector<TenantConfig>& tenants) {
  snapshot_.store(Build(tenants));
}

absl::Status TenantIdentityCheck::Check(absl::string_view tenant_id,
                                        const std::vector<std::string>& peer_names) const {
  std::shared_ptr<const Snapshot> snapshot = snapshot_.load();
  auto bound = snapshot->find(tenant_id);
  if (bound == snapshot->end()) return absl::OkStatus();
  for (const std::string& name : peer_names) {
    if (bound->second.contains(name)) return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      absl::StrCat("tenant ", tenant_id,
                   " must connect with a client certificate that names one of its "
                   "mtls_identities"));
}

absl::StatusOr<bool> TenantIdentityCheck::AdmitByCertificate(absl::string_view tenant_id,
                                                             const grpc::AuthContext& peer) const {
  std::shared_ptr<const Snapshot> snapshot = snapshot_.load();
  if (!snapshot->contains(tenant_id)) return false;
  // Names only count from a certificate the TLS handshake verified against the client CA.
  std::vector<std::string> names;
  if (peer.IsPeerAuthenticated()) names = PeerCertificateNames(peer);
  RETURN_IF_ERROR(Check(tenant_id, names));
  return true;
}

grpc::Status TenantIdentityCheck::Process(const InputMetadata& auth_metadata,
                                          grpc::AuthContext* context, OutputMetadata*,
                                          OutputMetadata*) {
  auto tenant = auth_metadata.find(kTenantMetadataKey);
  // No tenant named: the service refuses the call itself (or it is the health service).
  if (tenant == auth_metadata.end()) return grpc::Status::OK;
  std::string tenant_id(tenant->second.data(), tenant->second.size());
  std::vector<std::string> names;
  if (context != nullptr) names = PeerCertificateNames(*context);
  absl::Status allowed = Check(tenant_id, names);
  if (allowed.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(allowed.message()));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TenantPortCredentials(
    const TlsConfig& tls, std::shared_ptr<TenantIdentityCheck> identities) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  // gRPC's watcher would only log unreadable files and fail handshakes; fail here instead.
  if (absl::Status status = CheckPem(tls.cert_file, "tls.cert_file", "CERTIFICATE"); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckPem(tls.key_file, "tls.key_file", "PRIVATE KEY"); !status.ok()) {
    return status;
  }
  std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> provider;
  if (tls.client_ca_file.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.key_file, tls.cert_file, kCertificateRefreshSeconds);
  } else {
    if (absl::Status status = CheckPem(tls.client_ca_file, "tls.client_ca_file", "CERTIFICATE");
        !status.ok()) {
      return status;
    }
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.key_file, tls.cert_file, tls.client_ca_file, kCertificateRefreshSeconds);
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(tls.require_client_cert
                                      ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(options);
  if (credentials == nullptr) {
    return absl::InvalidArgumentError("tls: gRPC refused the TLS settings");
  }
  if (identities != nullptr) credentials->SetAuthMetadataProcessor(std::move(identities));
  return credentials;
}

}  // namespace cloister::host

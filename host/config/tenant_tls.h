// TLS on cloisterd's tenant port: server credentials built from the files in the config's `tls`
// section, and the check that binds tenants to client-certificate identities (mutual TLS).
//
// The certificate, key and client CA are read by gRPC's file watcher, which re-reads them every
// minute: replacing the files (write elsewhere, then rename over) rotates them without a restart.
// A tenant whose config lists `mtls_identities` may only be acted for by a client whose
// certificate carries one of them as its common name or a subject alternative name. Such a
// tenant may call without an API token (the verified certificate alone admits it, see
// AdmitByCertificate); a token it does send must still be right.
//
// Threading: TenantIdentityCheck::Process runs on gRPC threads and reads an immutable snapshot;
// Replace() swaps a new snapshot in atomically and is safe from any thread.
// Ownership: the credentials share ownership of the identity check.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"
#include "host/config/daemon_config.h"

namespace cloister::host {

// The certificate names a TLS peer presented: common name and subject alternative names, as
// gRPC's auth context lists them. Empty for a plaintext peer or one without a certificate.
std::vector<std::string> PeerCertificateNames(const grpc::AuthContext& context);

class TenantIdentityCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit TenantIdentityCheck(const std::vector<TenantConfig>& tenants);

  // Takes the identities of `tenants`; calls already past the check are not affected.
  void Replace(const std::vector<TenantConfig>& tenants);

  // OK when `tenant_id` has no identities bound or `peer_names` holds one of them; otherwise
  // UNAUTHENTICATED naming the tenant (never the identities).
  absl::Status Check(absl::string_view tenant_id, const std::vector<std::string>& peer_names) const;

  // Admission without an API token: false when `tenant_id` has no identities bound (it needs
  // its token); true when the verified peer certificate of `peer` names one of them; otherwise
  // UNAUTHENTICATED naming the tenant, as Check().
  absl::StatusOr<bool> AdmitByCertificate(absl::string_view tenant_id,
                                          const grpc::AuthContext& peer) const;

  // grpc::AuthMetadataProcessor: reads x-cloister-tenant and the peer's certificate names.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  using Snapshot = std::map<std::string, std::set<std::string>, std::less<>>;
  static std::shared_ptr<const Snapshot> Build(const std::vector<TenantConfig>& tenants);

  std::atomic<std::shared_ptr<const Snapshot>> snapshot_;
};

// The tenant port's credentials: plaintext when `tls` is not enabled, otherwise TLS from the
// watched files, asking for client certificates when a client CA is set (and refusing
// connections without one when require_client_cert). `identities` is installed on TLS
// credentials when given. InvalidArgument naming the field when a file is missing or holds no
// PEM block of the right kind.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TenantPortCredentials(
    const TlsConfig& tls, std::shared_ptr<TenantIdentityCheck> identities);

}  // namespace cloister::host

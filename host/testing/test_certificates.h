// Test support: a throwaway PKI made with the openssl command-line tool, for tests of TLS on
// the tenant port. One CA signs a server certificate (CN localhost, SANs DNS:localhost and
// IP:127.0.0.1) and two client certificates; a second, unrelated CA signs a third client, so
// tests can present a certificate the server must not accept.
// Thread-compatible: call once per test from one thread. Keys are written 0600.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace cloister::host::testing {

struct TestCertificates {
  std::string ca_cert;      // the CA that signs the server and the clients
  std::string server_cert;  // leaf, then nothing: the CA is the client's root
  std::string server_key;
  std::string client_cert;  // CN acme-client, SAN URI spiffe://cloister.test/tenant/acme
  std::string client_key;
  std::string other_client_cert;  // CN globex-client, same CA
  std::string other_client_key;
  std::string rogue_client_cert;  // CN acme-client, signed by another CA
  std::string rogue_client_key;
};

// Writes the files into `dir` (which must exist). Internal with openssl's output when a step
// fails; NotFound when there is no openssl on PATH.
absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir);

}  // namespace cloister::host::testing

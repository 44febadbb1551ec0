// Test support for the tenant service's in-process tests (the service, upload, multi-worker and
// operator tests): ServiceTest, a CloisterService in front of the tests' enclave clients, with
// the real scheduler and file blob store, served on 127.0.0.1:0, and the client calls the tests
// make; CloisterServiceTest, that service in front of one FakeEnclave. Tenants "acme" and
// "globex" are registered with the tokens "acme-token" and "globex-token".
// Not thread-safe except for the client calls, which tests may make from several threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/server_interceptor.h"
#include "gtest/gtest.h"
#include "host/enclave_client/enclave_client.h"
#include "host/scheduler/scheduler.h"
#include "host/server/cloister_service.h"
#include "host/server/grpc_server.h"
#include "host/storage/file_blob_store.h"
#include "host/tenants/tenant_registry.h"
#include "host/testing/fake_enclave_client.h"

namespace cloister::host::testing {

inline constexpr char kHandle[] = "0123456789abcdef0123456789abcdef";
inline constexpr char kOtherHandle[] = "fedcba9876543210fedcba9876543210";
inline constexpr char kUnauthenticated[] = "unknown tenant or wrong API token";

struct UploadOptions {
  uint64_t declared_size = 0;  // 0: the real size
  bool send_start = true;
  bool send_finish = true;
  std::string finish_handle;  // empty: the same handle
};

class ServiceTest : public ::testing::Test {
 protected:
  using InterceptorFactories =
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>;

  // A fresh folder for the test (root_) and the tenant registry.
  void SetUp() override;
  // Stops the server, the scheduler and the service, and removes the folder, before the
  // derived fixture's members (its enclave clients) go.
  void TearDown() override;

  // The blob store under root_/models, a scheduler over `workers`, and the service in front of
  // `service_workers` (empty: the same workers) on a fresh server with `interceptors`.
  void StartService(std::vector<EnclaveClient*> workers, SchedulerOptions scheduler_options,
                    ServiceOptions options, InterceptorFactories interceptors = {},
                    std::vector<EnclaveClient*> service_workers = {});
  // Replaces the service (and its server) with one built from `options`, in front of `workers`
  // (empty: the ones it had); the scheduler and blob store stay.
  void RestartService(ServiceOptions options, std::vector<EnclaveClient*> workers = {});

  static void Authorize(grpc::ClientContext& context, const std::string& tenant,
                        const std::string& token);
  // As `tenant` with its token "<tenant>-token".
  static void AsTenant(grpc::ClientContext& context, const std::string& tenant = "acme");

  // Opens a session; the RPC's status, and the session id in `session_id`.
  grpc::Status TryOpenSession(const std::string& tenant, const std::string& token,
                              std::string* session_id = nullptr,
                              const std::string& evidence_digest = std::string(32, 'd'));
  // Opens a session for `tenant` (token "<tenant>-token"), expecting success.
  std::string OpenSession(const std::string& tenant,
                          const std::string& evidence_digest = std::string(32, 'd'));

  static api::v1::SealedRequest Sealed(const std::string& session, const std::string& request_id,
                                    const std::string& handle, const std::string& ciphertext,
                                    uint64_t sequence = 1);

  // Uploads `chunks` as one model, as acme; returns the RPC status and fills `response`.
  grpc::Status Upload(const std::string& session, const std::string& handle,
                      const std::vector<std::string>& chunks,
                      api::v1::UploadModelResponse& response, UploadOptions options = {});
  // Uploads `ciphertext` in one chunk, as acme.
  grpc::Status Upload(const std::string& session, const std::string& handle,
                      const std::string& ciphertext,
                      api::v1::UploadModelResponse* response = nullptr);
  // Opens an upload stream as acme and sends its start for `declared_size` bytes of kHandle,
  // for tests that pace the rest themselves.
  std::unique_ptr<grpc::ClientWriter<api::v1::UploadModelRequest>> StartUpload(
      grpc::ClientContext& context, const std::string& session, uint64_t declared_size,
      api::v1::UploadModelResponse& response);

  // Infer as `tenant`, within `timeout` (infinite: no deadline).
  grpc::Status Infer(const api::v1::SealedRequest& call, api::v1::SealedReply& reply,
                     const std::string& tenant = "acme",
                     absl::Duration timeout = absl::InfiniteDuration());

  // The files of `tenant`'s stored models, sorted.
  std::vector<std::string> ModelFiles(const std::string& tenant);

  std::filesystem::path root_;
  std::unique_ptr<TenantRegistry> registry_;
  std::vector<EnclaveClient*> service_workers_;  // what the service is in front of
  std::unique_ptr<FileBlobStore> blobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<CloisterService> service_;
  RunningServer server_;
  std::unique_ptr<api::v1::Cloister::Stub> stub_;

 private:
  void Serve(InterceptorFactories interceptors);
};

// The service in front of one FakeEnclave; 1 MiB models at most, batches after 1 ms.
class CloisterServiceTest : public ServiceTest {
 protected:
  void SetUp() override;

  // Replaces the service with one built from `options`, in front of `worker` (nullptr: the
  // fixture's enclave).
  void RestartService(ServiceOptions options, EnclaveClient* worker = nullptr);
  // Once the service is idle: acme has no stored model and the enclave was never asked to load
  // one.
  void ExpectNothingStoredOrLoaded();

  std::unique_ptr<FakeEnclaveClient> enclave_;
  std::unique_ptr<EnclaveClient> wrapped_enclave_;  // in front of enclave_, for some tests
};

}  // namespace cloister::host::testing

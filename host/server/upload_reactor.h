// UploadReactor: the reactor of one UploadModel stream (host/server/cloister_service.h): start
// (quota reservation, staging in the BlobStore), data, finish (LoadModelCall on the session's
// worker, ReloadModelCall on the others, commit). UploadWatchdog: the service's thread that ends
// uploads that wait too long for their client (options upload_idle_timeout and upload_timeout).
//
// Threading: an upload's handlers run one at a time (gRPC reads, then the service's file
// worker), so its state needs no lock; only `mu_` guards what the watchdog also touches (whether
// the upload waits for its client, since when, and whether it is finished). The watchdog's
// methods are thread-safe.
// Ownership: an UploadReactor deletes itself once gRPC is done with it and the watchdog has let
// go of it; it counts as in flight until then. Both borrow the service, which outlives them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "host/enclave_client/enclave_client.h"
#include "host/server/rpc_in_flight.h"
#include "host/storage/blob_store.h"

namespace cloister::host {

class CloisterService;

class UploadReactor final : public grpc::ServerReadReactor<api::v1::UploadModelRequest> {
 public:
  // Registers with the service's watchdog, authenticates and starts reading.
  UploadReactor(RpcInFlight in_flight, CloisterService* service,
                grpc::CallbackServerContext* context, api::v1::UploadModelResponse* response);

  // The watchdog holds a reference while it looks at the upload.
  void Ref() { references_.fetch_add(1); }
  void Unref();

  // Called by the watchdog: ends the upload with DEADLINE_EXCEEDED when it has waited longer
  // than the idle timeout for the client's next message, or is still waiting for its client
  // after the overall upload timeout.
  void EndIfOverdue(absl::Time now);

  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  enum class State { kExpectStart, kReceiving, kLoading, kFinished };

  // Waits for the client's next message (unless the watchdog already ended the upload).
  void ReadNext();
  void HandleStart();
  void HandleData();
  void HandleFinish();
  // On the file worker: reads the staged ciphertext back and hands the model to the enclave.
  void SendToEnclave(boundary::v1::ForwardedRequest item);
  // On the file worker: stores the model if the enclave loaded it, then answers.
  void Complete(EnclaveClient::Reply reply);
  // On the file worker: commits the staged model with its wrapped key and answers.
  void Store(const std::string& wrapped_key);
  void Fail(const absl::Status& status);
  // Finishes the RPC unless it is finished already (from any thread: the handlers or the
  // watchdog).
  void FinishOnce(const absl::Status& status);
  void MarkFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RpcInFlight in_flight_;  // first: let go of last
  CloisterService* const service_;
  api::v1::UploadModelResponse* const response_;
  api::v1::UploadModelRequest request_;
  State state_ = State::kExpectStart;
  std::string tenant_id_;  // set in the constructor, then only read
  std::string session_id_;
  std::string handle_;
  std::string request_id_;
  uint64_t declared_size_ = 0;
  uint64_t memory_budget_ = 0;  // of the tenant's quota, for the enclave (set at the start)
  uint64_t memory_size_ = 0;    // the loaded model's, as the enclave reported it (0: not counted)
  int worker_ = 0;              // the worker holding the upload's session
  std::shared_ptr<std::string> ciphertext_;  // kept for the other workers
  std::unique_ptr<BlobUpload> upload_;

  std::atomic<int> references_{1};  // gRPC's until OnDone, plus the watchdog's while it looks
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_client_ ABSL_GUARDED_BY(mu_) = false;  // a read of the client's next message
  absl::Time awaiting_since_ ABSL_GUARDED_BY(mu_);
  const absl::Time started_;
  // Of the tenant's model-memory quota; released when the RPC finishes.
  uint64_t reserved_size_ ABSL_GUARDED_BY(mu_) = 0;
};

class UploadWatchdog {
 public:
  // Starts the thread; it checks the uploads every quarter of the shorter timeout (between
  // 10 ms and a second), so an upload ends at most 25% late.
  UploadWatchdog(Clock* clock, absl::Duration idle_timeout, absl::Duration overall_timeout);
  ~UploadWatchdog();  // stops and joins the thread
  UploadWatchdog(const UploadWatchdog&) = delete;
  UploadWatchdog& operator=(const UploadWatchdog&) = delete;

  // An upload in progress, from its reactor's start until gRPC is done with it.
  void Add(UploadReactor* upload);
  void Remove(UploadReactor* upload);

 private:
  void Loop(absl::Duration period);
  void EndOverdueUploads();

  Clock* const clock_;
  absl::Mutex mu_;
  absl::flat_hash_set<UploadReactor*> uploads_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace cloister::host

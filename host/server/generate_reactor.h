// GenerateReactor: the reactor of one Generate RPC (host/server/cloister_service.h). It sends the
// GenerateCall to the session's worker as a stream (EnclaveClient::CallStream) and relays each
// GenerateResult as one SealedChunk, in the enclave's order, with one gRPC write in flight at a
// time (the others wait in a queue); after the final chunk is written the RPC ends OK. A stream
// that ends in an error (a boundary status, the worker's death) ends the RPC with that error;
// chunks not yet written are dropped, since a stream without its final chunk is useless to the
// client anyway. When the client goes away or the RPC's deadline passes (OnCancel), or a write
// fails, the enclave gets a CancelCall and the RPC ends at once.
//
// Threading: Start or Refuse runs once on the gRPC thread that took the call; frames arrive on
// the enclave client's thread; OnWriteDone, OnCancel and OnDone on gRPC's threads, in any order.
// `mu_` guards the write queue and the stream's state.
// Ownership: deletes itself once gRPC is done with it (OnDone), the enclave's stream has ended
// (its `done`), and Start or Refuse has returned, so that no callback lands in a deleted reactor;
// it counts as in flight until then. It borrows the worker, which must outlive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cloister/api/v1/api.grpc.pb.h"
#include "host/enclave_client/enclave_client.h"
#include "host/server/rpc_in_flight.h"

namespace cloister::host {

class GenerateReactor final : public grpc::ServerWriteReactor<api::v1::SealedChunk> {
 public:
  // Runs once, on the enclave client's thread, when the enclave's stream has ended: with its
  // final frame or its error, before the final chunk is written (or after the RPC has ended,
  // for a stream that was cancelled).
  // `chunk_times` holds when each frame of the stream arrived (the final one included), and
  // `started` when the call went to the enclave: what the host can time (no content).
  struct Timing {
    absl::Time started;
    std::vector<absl::Time> chunk_times;
  };
  using OnStreamEnd =
      std::function<void(const EnclaveClient::Reply& last, const Timing& timing)>;

  explicit GenerateReactor(RpcInFlight in_flight);

  // Sends `call` (a GenerateCall for `request_id`) to `worker`. Call Start or Refuse, once.
  void Start(EnclaveClient* worker, boundary::v1::HostToEnclave call, std::string request_id,
             OnStreamEnd on_stream_end) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the RPC with `status` before anything was sent.
  void Refuse(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone() override;

 private:
  void OnFrame(boundary::v1::EnclaveToHost frame) ABSL_LOCKS_EXCLUDED(mu_);
  void OnStreamDone(EnclaveClient::Reply last) ABSL_LOCKS_EXCLUDED(mu_);
  // The chunk for a frame of this stream, or INTERNAL when the enclave sent another request's.
  absl::StatusOr<api::v1::SealedChunk> ToChunk(boundary::v1::EnclaveToHost& frame) const;
  // Ends the RPC early with `status` (chunks not yet written are dropped; an earlier error
  // stays) and, while the enclave's stream is open, asks for it to be cancelled.
  void EndEarlyLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next write, or Finish once the queue is empty and the end is known.
  void Next() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends the CancelCall once, if one is wanted and the stream's id is known.
  void CancelStream() ABSL_LOCKS_EXCLUDED(mu_);
  void Unref();

  RpcInFlight in_flight_;            // first: let go of last
  EnclaveClient* worker_ = nullptr;  // set by Start
  std::string request_id_;           // set by Start, then only read
  OnStreamEnd on_stream_end_;        // set by Start, run once by OnStreamDone
  // gRPC's (until OnDone) and Start's or Refuse's (until it returns); Start adds the stream's.
  std::atomic<int> references_{2};

  absl::Mutex mu_;
  std::deque<api::v1::SealedChunk> queue_ ABSL_GUARDED_BY(mu_);  // not yet written, in order
  api::v1::SealedChunk writing_chunk_;  // the write in flight's; untouched until OnWriteDone
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // How the RPC ends once the queue is written: OK after the final chunk, or an error.
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish has been called
  uint64_t stream_id_ ABSL_GUARDED_BY(mu_) = 0;  // 0 until CallStream returns it
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;
  Timing timing_ ABSL_GUARDED_BY(mu_);
  bool cancel_wanted_ ABSL_GUARDED_BY(mu_) = false;  // the enclave is to stop the stream
  bool cancel_sent_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cloister::host

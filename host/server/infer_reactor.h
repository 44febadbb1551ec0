// InferReactor: the reactor of one Infer RPC (host/server/cloister_service.h). A client
// cancellation (or an expired RPC deadline) takes the request out of the scheduler's queue.
//
// Threading: SetTicket runs on the gRPC thread that took the call, OnCancel and OnDone on gRPC's
// threads, in any order. Ownership: deletes itself once both gRPC is done with it (OnDone) and
// Infer() has handed it the request's ticket (SetTicket), so the ticket never lands in a deleted
// reactor; it borrows the scheduler, which must outlive it. It counts as in flight until then.
#pragma once

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "host/scheduler/scheduler.h"
#include "host/server/rpc_in_flight.h"

namespace cloister::host {

class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  InferReactor(RpcInFlight in_flight, Scheduler* scheduler);

  // Called once by Infer() after Submit (ticket 0: answered at once).
  void SetTicket(Scheduler::Ticket ticket);

  void OnCancel() override;
  void OnDone() override;

 private:
  void Unref();

  RpcInFlight in_flight_;  // first: let go of last
  Scheduler* const scheduler_;
  std::atomic<int> references_{2};  // gRPC's (until OnDone) and Infer()'s (until SetTicket)
  absl::Mutex mu_;
  Scheduler::Ticket ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cloister::host

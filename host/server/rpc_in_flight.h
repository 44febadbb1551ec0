// Counting the tenant API's RPCs in flight, for an orderly shutdown: InFlightRpcs is the count
// and the draining switch of one service; RpcInFlight is one RPC's share of it, held by the
// RPC's reactor for as long as the reactor lives (the constructor counts the RPC, the destructor
// lets it go), so every kind of reactor counts the same way.
//
// Threading: InFlightRpcs is thread-safe. An RpcInFlight is owned by one reactor.
// Ownership: an RpcInFlight borrows its InFlightRpcs, which must outlive it (WaitUntilIdle
// returning true says none is left).
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cloister::host {

class InFlightRpcs {
 public:
  InFlightRpcs() = default;
  InFlightRpcs(const InFlightRpcs&) = delete;
  InFlightRpcs& operator=(const InFlightRpcs&) = delete;

  // OK, or UNAVAILABLE "cloisterd is shutting down" once BeginDrain was called.
  absl::Status CheckAccepting() const;
  // From now on CheckAccepting refuses; RPCs already counted carry on.
  void BeginDrain();
  // Waits until no RPC is counted (true) or `timeout` passes (false).
  bool WaitUntilIdle(absl::Duration timeout);
  int count() const;

 private:
  friend class RpcInFlight;
  void Add(int delta);

  mutable absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

// One RPC counted in an InFlightRpcs until this is destroyed. Movable (the moved-from one counts
// nothing); a reactor declares it as its first member, so it lets go after everything else of
// the reactor is gone.
class RpcInFlight {
 public:
  explicit RpcInFlight(InFlightRpcs* rpcs);
  RpcInFlight(RpcInFlight&& other) noexcept;
  RpcInFlight& operator=(RpcInFlight&& other) noexcept;
  RpcInFlight(const RpcInFlight&) = delete;
  RpcInFlight& operator=(const RpcInFlight&) = delete;
  ~RpcInFlight();

 private:
  InFlightRpcs* rpcs_;  // nullptr once moved from
};

}  // namespace cloister::host

#include "host/server/infer_reactor.h"

#include <utility>

namespace cloister::host {

InferReactor::InferReactor(RpcInFlight in_flight, Scheduler* scheduler)
    : in_flight_(std::move(in_flight)), scheduler_(scheduler) {}

void InferReactor::SetTicket(Scheduler::Ticket ticket) {
  bool cancel_now = false;
  {
    absl::MutexLock lock(&mu_);
    ticket_ = ticket;
    cancel_now = cancelled_;
  }
  if (cancel_now && ticket != 0) scheduler_->Cancel(ticket);
  Unref();
}

void InferReactor::OnCancel() {
  Scheduler::Ticket ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    ticket = ticket_;
  }
  if (ticket != 0) scheduler_->Cancel(ticket);
}

void InferReactor::OnDone() { Unref(); }

void InferReactor::Unref() {
  if (references_.fetch_sub(1) == 1) delete this;
}

}  // namespace cloister::host

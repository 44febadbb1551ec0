#include "host/scheduler/scheduler.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"

namespace cloister::host {

using boundary::v1::HostToEnclave;
using boundary::v1::SealedReplyItem;

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(EnclaveClient* enclave,
                                                             SchedulerOptions options) {
  if (enclave == nullptr) return absl::InvalidArgumentError("scheduler needs an enclave client");
  if (options.max_batch_size < 1 || options.max_batch_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_size must be in 1..1024, got ", options.max_batch_size));
  }
  if (options.max_queue_delay < absl::ZeroDuration() ||
      options.max_queue_delay > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat("max_queue_delay must be in 0..10s, got ",
                                                   absl::FormatDuration(options.max_queue_delay)));
  }
  if (options.max_batches_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batches_in_flight must be at least 1, got ",
                                                   options.max_batches_in_flight));
  }
  if (options.max_queued_requests_per_tenant < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_requests_per_tenant must be at least 1, got ",
                     options.max_queued_requests_per_tenant));
  }
  return std::unique_ptr<Scheduler>(new Scheduler(enclave, options));
}

Scheduler::Scheduler(EnclaveClient* enclave, SchedulerOptions options)
    : enclave_(enclave),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {
  batcher_ = std::thread([this] { BatcherLoop(); });
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Submit(InferRequest request, Done done) {
  absl::Time now = clock_->Now();
  if (request.deadline <= now) {
    done(absl::DeadlineExceededError("request deadline passed before it was queued"));
    return;
  }
  absl::Status refusal;
  {
    absl::MutexLock lock(&mu_);
    auto tenant_it = queued_per_tenant_.find(request.tenant_id);
    if (stopping_) {
      refusal = absl::UnavailableError("cloisterd is shutting down");
    } else if (tenant_it != queued_per_tenant_.end() &&
               tenant_it->second >= options_.max_queued_requests_per_tenant) {
      refusal = absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", request.tenant_id, " already has ", options_.max_queued_requests_per_tenant,
          " inference requests queued (the limit); retry later"));
    } else {
      ++queued_per_tenant_[request.tenant_id];
      ++queued_count_;
      QueueKey key(request.tenant_id, request.item.model_handle());
      Queue& queue = queues_[key];
      if (queue.requests.empty()) queue.position = order_.insert(order_.end(), key);
      earliest_deadline_ = std::min(earliest_deadline_, request.deadline);
      queue.requests.push_back(
          Queued{std::move(request.item), now, request.deadline, std::move(done)});
      ++wake_generation_;
      return;
    }
  }
  done(std::move(refusal));
}

void Scheduler::ExpireLocked(absl::Time now, std::vector<Answer>& answers) {
  if (now < earliest_deadline_) return;
  earliest_deadline_ = absl::InfiniteFuture();
  for (auto it = queues_.begin(); it != queues_.end();) {
    std::deque<Queued>& requests = it->second.requests;
    std::deque<Queued> kept;
    for (Queued& queued : requests) {
      if (queued.deadline <= now) {
        answers.emplace_back(
            std::move(queued.done),
            absl::DeadlineExceededError("request waited in the queue past its deadline"));
        --queued_count_;
        --queued_per_tenant_[it->first.first];
      } else {
        earliest_deadline_ = std::min(earliest_deadline_, queued.deadline);
        kept.push_back(std::move(queued));
      }
    }
    requests.swap(kept);
    if (queued_per_tenant_[it->first.first] == 0) queued_per_tenant_.erase(it->first.first);
    if (requests.empty()) {
      order_.erase(it->second.position);
      it = queues_.erase(it);
    } else {
      ++it;
    }
  }
}

std::list<Scheduler::QueueKey>::iterator Scheduler::FindReadyLocked(absl::Time now) {
  for (auto it = order_.begin(); it != order_.end(); ++it) {
    const Queue& queue = queues_.at(*it);
    CLOISTER_CHECK(!queue.requests.empty());
    if (static_cast<int>(queue.requests.size()) >= options_.max_batch_size ||
        now - queue.requests.front().enqueued >= options_.max_queue_delay) {
      return it;
    }
  }
  return order_.end();
}

absl::Time Scheduler::NextWakeLocked() const {
  absl::Time wake = earliest_deadline_;
  if (in_flight_ < options_.max_batches_in_flight) {
    for (const QueueKey& key : order_) {
      wake = std::min(wake, queues_.at(key).requests.front().enqueued + options_.max_queue_delay);
    }
  }
  return wake;
}

void Scheduler::BatcherLoop() {
  while (true) {
    std::vector<Answer> answers;
    std::optional<std::pair<QueueKey, std::deque<Queued>>> batch;
    bool stopping = false;
    mu_.Lock();
    absl::Time now = clock_->Now();
    if (stopping_) {
      stopping = true;
      for (auto& [key, queue] : queues_) {
        for (Queued& queued : queue.requests) {
          answers.emplace_back(std::move(queued.done),
                               absl::UnavailableError("cloisterd is shutting down"));
        }
      }
      queues_.clear();
      order_.clear();
      queued_per_tenant_.clear();
      queued_count_ = 0;
    } else {
      ExpireLocked(now, answers);
      if (in_flight_ < options_.max_batches_in_flight) {
        auto ready = FindReadyLocked(now);
        if (ready != order_.end()) {
          QueueKey key = *ready;
          auto queue_it = queues_.find(key);
          std::deque<Queued>& requests = queue_it->second.requests;
          size_t count = std::min<size_t>(requests.size(), options_.max_batch_size);
          std::deque<Queued> taken(std::make_move_iterator(requests.begin()),
                                   std::make_move_iterator(requests.begin() + count));
          requests.erase(requests.begin(), requests.begin() + count);
          queued_count_ -= count;
          int& tenant_count = queued_per_tenant_[key.first];
          tenant_count -= count;
          if (tenant_count == 0) queued_per_tenant_.erase(key.first);
          if (requests.empty()) {
            order_.erase(ready);
            queues_.erase(queue_it);
          } else {
            // Round robin: the queue just served goes behind the others.
            order_.splice(order_.end(), order_, ready);
          }
          ++in_flight_;
          batch.emplace(std::move(key), std::move(taken));
        }
      }
      if (!batch && answers.empty()) {
        uint64_t generation = wake_generation_;
        auto changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || wake_generation_ != generation;
        };
        absl::Time wake = NextWakeLocked();
        if (wake == absl::InfiniteFuture()) {
          mu_.Await(absl::Condition(&changed));
        } else {
          mu_.AwaitWithTimeout(absl::Condition(&changed),
                               std::max(wake - now, absl::Microseconds(50)));
        }
        mu_.Unlock();
        continue;
      }
    }
    mu_.Unlock();

    for (auto& [done, outcome] : answers) done(std::move(outcome));
    if (batch) Dispatch(batch->first, std::move(batch->second));
    if (stopping) {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
      mu_.Await(absl::Condition(&idle));
      return;
    }
  }
}

void Scheduler::Dispatch(const QueueKey& key, std::deque<Queued> batch) {
  HostToEnclave call;
  boundary::v1::InferBatchCall* infer = call.mutable_infer_batch();
  infer->set_tenant_id(key.first);
  infer->set_model_handle(key.second);
  auto request_ids = std::make_shared<std::vector<std::string>>();
  auto dones = std::make_shared<std::vector<Done>>();
  request_ids->reserve(batch.size());
  dones->reserve(batch.size());
  for (Queued& queued : batch) {
    request_ids->push_back(queued.item.request_id());
    dones->push_back(std::move(queued.done));
    *infer->add_items() = std::move(queued.item);
  }
  Log(LogLevel::kDebug, "batch_dispatched",
      {{"tenant", key.first},
       {"handle", key.second},
       {"count", static_cast<long long>(request_ids->size())}});
  enclave_->Call(std::move(call), [this, request_ids, dones](EnclaveClient::Reply reply) {
    // Answer first, then release the slot: once Stop() sees no batch in flight, every answer
    // has been delivered.
    CompleteBatch(*request_ids, *dones, std::move(reply));
    absl::MutexLock lock(&mu_);
    --in_flight_;
    ++wake_generation_;
  });
}

void Scheduler::CompleteBatch(const std::vector<std::string>& request_ids, std::vector<Done>& dones,
                              EnclaveClient::Reply reply) {
  CLOISTER_CHECK(request_ids.size() == dones.size());
  absl::Status batch_error;
  if (!reply.ok()) {
    batch_error = reply.status();
  } else if (reply->infer_batch().replies_size() != static_cast<int>(dones.size())) {
    batch_error = absl::InternalError(
        absl::StrCat("enclave answered a batch of ", dones.size(), " requests with ",
                     reply->infer_batch().replies_size(), " replies"));
  }
  if (!batch_error.ok()) {
    Log(LogLevel::kWarning, "batch_failed",
        {{"count", static_cast<long long>(dones.size())}, {"error", batch_error.ToString()}});
    for (Done& done : dones) done(batch_error);
    return;
  }
  auto* replies = reply->mutable_infer_batch()->mutable_replies();
  for (size_t i = 0; i < dones.size(); ++i) {
    SealedReplyItem& item = (*replies)[static_cast<int>(i)];
    if (item.request_id() != request_ids[i]) {
      dones[i](absl::InternalError("enclave reply does not match the request order of the batch"));
    } else if (item.has_status() && item.status().code() != 0) {
      dones[i](FromBoundaryStatus(item.status()));
    } else {
      dones[i](std::move(item));
    }
  }
}

void Scheduler::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  batcher_.join();
}

int Scheduler::queued_count() const {
  absl::MutexLock lock(&mu_);
  return queued_count_;
}

int Scheduler::batches_in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

void Scheduler::WakeForTest() {
  absl::MutexLock lock(&mu_);
  ++wake_generation_;
}

}  // namespace cloister::host

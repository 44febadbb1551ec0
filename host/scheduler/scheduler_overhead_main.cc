// scheduler-overhead: how much host time the Scheduler spends per request (admission, queueing,
// batch forming, dispatch and answer) with a no-op executor behind FunctionEnclaveClient, so no
// enclave, cryptography or I/O is measured. Prints one JSON line per case. A development aid;
// the comparative benchmarks live in bench/.
//
//   scheduler-overhead [--requests N] [--producers P] [--tenants T] [--workers W]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "host/enclave_client/function_enclave_client.h"
#include "host/scheduler/scheduler.h"

namespace cloister::host {
namespace {

struct Settings {
  int requests = 500000;
  int producers = 1;
  int tenants = 4;
  int workers = 1;
};

std::unique_ptr<Scheduler> MakeScheduler(
    const Settings& settings, std::vector<std::unique_ptr<FunctionEnclaveClient>>& clients) {
  std::vector<EnclaveClient*> workers;
  for (int i = 0; i < settings.workers; ++i) {
    clients.push_back(std::make_unique<FunctionEnclaveClient>(NoOpInferHandler(), 0));
    workers.push_back(clients.back().get());
  }
  SchedulerOptions options;
  options.max_batch_size = 8;
  options.max_queue_delay = absl::ZeroDuration();
  options.default_limits.max_queued_requests = 1 << 24;
  options.default_limits.max_queued_size = uint64_t{1} << 40;
  auto scheduler = Scheduler::Create(workers, options);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "scheduler-overhead: %s\n", scheduler.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(scheduler);
}

InferRequest MakeRequest(const Settings& settings, int producer, int index) {
  InferRequest request;
  request.tenant_id = absl::StrCat("tenant", (producer + index) % settings.tenants);
  request.item.set_request_id(absl::StrCat(producer, "-", index));
  request.item.set_model_handle("0123456789abcdef0123456789abcdef");
  request.item.set_ciphertext("x");
  return request;
}

// Open loop: producers submit as fast as they can; time per request over the whole run.
void Throughput(const Settings& settings) {
  std::vector<std::unique_ptr<FunctionEnclaveClient>> clients;
  std::unique_ptr<Scheduler> scheduler = MakeScheduler(settings, clients);
  std::atomic<int64_t> answered{0};
  std::atomic<int64_t> failed{0};
  int per_producer = settings.requests / settings.producers;
  absl::Time start = absl::Now();
  std::vector<std::thread> producers;
  for (int p = 0; p < settings.producers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < per_producer; ++i) {
        scheduler->Submit(MakeRequest(settings, p, i),
                          [&](absl::StatusOr<boundary::v1::EnclaveReply> reply) {
                            if (!reply.ok()) failed.fetch_add(1);
                            answered.fetch_add(1, std::memory_order_release);
                          });
      }
    });
  }
  for (std::thread& producer : producers) producer.join();
  int64_t total = int64_t{per_producer} * settings.producers;
  while (answered.load(std::memory_order_acquire) < total) std::this_thread::yield();
  absl::Duration elapsed = absl::Now() - start;
  scheduler->Stop();
  std::printf(
      "{\"case\":\"throughput\",\"requests\":%lld,\"producers\":%d,\"tenants\":%d,\"workers\":%d,"
      "\"failed\":%lld,\"ns_per_request\":%.1f}\n",
      static_cast<long long>(total), settings.producers, settings.tenants, settings.workers,
      static_cast<long long>(failed.load()), absl::ToDoubleNanoseconds(elapsed) / total);
}

// Closed loop, one request at a time: Submit to answer, including the batcher's wake-up.
void Latency(const Settings& settings) {
  std::vector<std::unique_ptr<FunctionEnclaveClient>> clients;
  std::unique_ptr<Scheduler> scheduler = MakeScheduler(settings, clients);
  int count = std::min(settings.requests, 20000);
  std::vector<double> micros;
  micros.reserve(count);
  absl::Mutex mu;
  for (int i = 0; i < count; ++i) {
    bool done = false;
    absl::Time start = absl::Now();
    scheduler->Submit(MakeRequest(settings, 0, i),
                      [&](absl::StatusOr<boundary::v1::EnclaveReply>) {
                        absl::MutexLock lock(&mu);
                        done = true;
                      });
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  scheduler->Stop();
  std::sort(micros.begin(), micros.end());
  std::printf("{\"case\":\"latency\",\"requests\":%d,\"p50_us\":%.2f,\"p99_us\":%.2f}\n", count,
              micros[count / 2], micros[count * 99 / 100]);
}

}  // namespace
}  // namespace cloister::host

int main(int argc, char** argv) {
  cloister::host::Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    int value = 0;
    if (!absl::SimpleAtoi(argv[i + 1], &value) || value < 1) {
      std::fprintf(stderr, "scheduler-overhead: %s needs a positive integer\n", flag.c_str());
      return 2;
    }
    if (flag == "--requests") {
      settings.requests = value;
    } else if (flag == "--producers") {
      settings.producers = value;
    } else if (flag == "--tenants") {
      settings.tenants = value;
    } else if (flag == "--workers") {
      settings.workers = value;
    } else {
      std::fprintf(stderr, "scheduler-overhead: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  cloister::host::Throughput(settings);
  cloister::host::Latency(settings);
  return 0;
}

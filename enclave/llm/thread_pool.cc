#include "enclave/llm/thread_pool.h"

#include <chrono>

#include <immintrin.h>

namespace cloister::llm {
namespace {

// How long a worker spins for the next section before it sleeps: sections of one step follow
// each other within a few microseconds; a sleeping worker costs a futex wake-up (5-50 us in a VM).
constexpr auto kSpin = std::chrono::microseconds(100);
// Past this, a spinning thread yields its core between checks: on a machine with more runnable
// threads than cores the thread it waits for may be the one that needs the core.
constexpr auto kSpinBeforeYield = std::chrono::microseconds(20);

}  // namespace

ThreadPool::ThreadPool(int threads) : size_(threads < 1 ? 1 : threads) {
  threads_.reserve(size_ - 1);
  for (int t = 1; t < size_; ++t) threads_.emplace_back([this, t] { Loop(t); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::RunErased(Erased invoke, void* fn) {
  invoke_ = invoke;
  fn_ = fn;
  pending_.store(size_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  invoke(fn, 0);
  int spins = 0;
  std::chrono::steady_clock::time_point start;
  while (pending_.load(std::memory_order_acquire) != 0) {
    _mm_pause();
    if (++spins % 64 == 0) {
      if (spins == 64) start = std::chrono::steady_clock::now();
      if (std::chrono::steady_clock::now() - start > kSpinBeforeYield) std::this_thread::yield();
    }
  }
}

void ThreadPool::Loop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = generation_.load(std::memory_order_acquire);
    if (now == seen) {
      const auto start = std::chrono::steady_clock::now();
      int spins = 0;
      while ((now = generation_.load(std::memory_order_acquire)) == seen) {
        _mm_pause();
        if (++spins % 64 != 0) continue;
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited > kSpin) {
          generation_.wait(seen, std::memory_order_acquire);
        } else if (waited > kSpinBeforeYield) {
          std::this_thread::yield();
        }
      }
    }
    seen = now;
    if (stopping_.load(std::memory_order_acquire)) return;
    invoke_(fn_, thread);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace cloister::llm

// ThreadPool: the LLM engine's own fork-join pool. Run(fn) calls fn(thread) on every thread of
// the pool (thread 0 is the caller) and returns when all have returned; the kernels split their
// work by thread index, so one step's parallel sections cost a few hundred nanoseconds each, not
// a lock and a wake-up per task. Between sections the pool's threads spin for a short while
// (sections of one step follow each other within microseconds), then sleep on a futex until the
// next section, so an idle engine leaves no core spinning.
//
// Threading: Run must be called from one thread at a time (the engine's step thread).
// Ownership: `fn` is borrowed for the call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace cloister::llm {

class ThreadPool {
 public:
  // `threads` counts the calling thread; at least 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  template <typename Fn>
  void Run(Fn&& fn) {
    if (size_ == 1) {
      fn(0);
      return;
    }
    RunErased(&Invoke<Fn>, &fn);
  }

  // Splits [0, count) into size() contiguous ranges whose bounds are multiples of `align`
  // (except the end) and calls fn(begin, end) for each non-empty one on its own thread.
  // `work` (any unit; multiply-adds in the engine) sizes the split: a range gets at least
  // kMinWorkPerThread of it, so small sections run on the caller alone, where a hand-off to
  // another thread would cost more than it saves. 0: split over every thread.
  static constexpr int64_t kMinWorkPerThread = 1 << 16;
  template <typename Fn>
  void For(int64_t count, int64_t align, Fn&& fn, int64_t work = 0) {
    const int64_t units = (count + align - 1) / align;
    int64_t limit = size_;
    if (work > 0) limit = std::clamp<int64_t>(work / kMinWorkPerThread, 1, size_);
    const int parts = static_cast<int>(std::min<int64_t>(limit, units));
    if (parts <= 1) {
      if (count > 0) fn(int64_t{0}, count);
      return;
    }
    Run([&](int thread) {
      if (thread >= parts) return;
      int64_t begin = units * thread / parts * align;
      int64_t end = std::min(count, units * (thread + 1) / parts * align);
      if (begin < end) fn(begin, end);
    });
  }

 private:
  using Erased = void (*)(void* fn, int thread);
  template <typename Fn>
  static void Invoke(void* fn, int thread) {
    (*static_cast<std::remove_reference_t<Fn>*>(fn))(thread);
  }

  void RunErased(Erased invoke, void* fn);
  void Loop(int thread);

  int size_;
  std::vector<std::thread> threads_;
  // A section: generation_ moves on once per Run; workers run the section, then count down.
  Erased invoke_ = nullptr;
  void* fn_ = nullptr;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<bool> stopping_{false};
};

}  // namespace cloister::llm

#include "bench/read_bandwidth.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cloister::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Sums [begin, end) as kStreams interleaved sequential streams (one accumulator each), so that
// the loop is bound by memory rather than by one chain of additions, and keeps as many reads in
// flight as a matrix-vector product over several weight rows does: with one stream a core of
// the 2-vCPU Xeon of bench/results/2026-12-01-llm-vs-llamacpp-idle.md reads 11-14 GB/s, with 8 about 18.5. The widest vector
// loads the CPU has, for the same reason (the bench library is built for baseline x86-64; its
// 16-byte loads reach about 30 % less).
constexpr int kStreams = 8;

// The words of each stream (a multiple of 8), and the sum of the tail no stream covers.
size_t StreamWords(const uint64_t* begin, const uint64_t* end, uint64_t* tail_sum) {
  const size_t words = static_cast<size_t>(end - begin);
  const size_t per_stream = words / kStreams / 8 * 8;
  uint64_t tail = 0;
  for (const uint64_t* p = begin + per_stream * kStreams; p < end; ++p) tail += *p;
  *tail_sum = tail;
  return per_stream;
}

uint64_t SumWordsPortable(const uint64_t* begin, const uint64_t* end) {
  uint64_t total = 0;
  const size_t per_stream = StreamWords(begin, end, &total);
  uint64_t sums[kStreams] = {};
  for (size_t i = 0; i < per_stream; ++i) {
    for (int s = 0; s < kStreams; ++s) sums[s] += begin[s * per_stream + i];
  }
  for (uint64_t sum : sums) total += sum;
  return total;
}

__attribute__((target("avx2"))) uint64_t SumWordsAvx2(const uint64_t* begin, const uint64_t* end) {
  uint64_t total = 0;
  const size_t per_stream = StreamWords(begin, end, &total);
  __m256i sums[kStreams];
  for (__m256i& sum : sums) sum = _mm256_setzero_si256();
  for (size_t i = 0; i < per_stream; i += 4) {
    for (int s = 0; s < kStreams; ++s) {
      sums[s] = _mm256_add_epi64(
          sums[s],
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(begin + s * per_stream + i)));
    }
  }
  __m256i all = sums[0];
  for (int s = 1; s < kStreams; ++s) all = _mm256_add_epi64(all, sums[s]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), all);
  return total + lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

__attribute__((target("avx512f"))) uint64_t SumWordsAvx512(const uint64_t* begin,
                                                           const uint64_t* end) {
  uint64_t total = 0;
  const size_t per_stream = StreamWords(begin, end, &total);
  __m512i sums[kStreams];
  for (__m512i& sum : sums) sum = _mm512_setzero_si512();
  for (size_t i = 0; i < per_stream; i += 8) {
    for (int s = 0; s < kStreams; ++s) {
      sums[s] = _mm512_add_epi64(sums[s], _mm512_loadu_si512(begin + s * per_stream + i));
    }
  }
  __m512i all = sums[0];
  for (int s = 1; s < kStreams; ++s) all = _mm512_add_epi64(all, sums[s]);
  return total + _mm512_reduce_add_epi64(all);
}

uint64_t SumWords(const uint64_t* begin, const uint64_t* end) {
  using SumFunction = uint64_t (*)(const uint64_t*, const uint64_t*);
  static const SumFunction sum = __builtin_cpu_supports("avx512f") ? &SumWordsAvx512
                                 : __builtin_cpu_supports("avx2")  ? &SumWordsAvx2
                                                                   : &SumWordsPortable;
  return sum(begin, end);
}

}  // namespace

absl::StatusOr<double> MeasureReadBandwidth(size_t size, int threads, int passes) {
  if (size < (size_t{1} << 20) || threads < 1 || passes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bandwidth probe: needs at least 1 MiB, a thread and a pass (got ", size,
                     " bytes, ", threads, " threads, ", passes, " passes)"));
  }
  const size_t words = size / sizeof(uint64_t);
  // 2 MiB aligned and, where the kernel allows, on transparent huge pages, as large weight
  // buffers usually are: with 4 KiB pages the prefetchers stop at every page boundary.
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t allocated = (words * sizeof(uint64_t) + kHugePage - 1) / kHugePage * kHugePage;
  std::unique_ptr<uint64_t[], decltype(&std::free)> buffer(
      static_cast<uint64_t*>(std::aligned_alloc(kHugePage, allocated)), &std::free);
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("bandwidth probe: cannot allocate ", size, " bytes"));
  }
  ::madvise(buffer.get(), allocated, MADV_HUGEPAGE);
  auto share = [&](int thread) {
    const size_t begin = words * thread / threads;
    return std::pair<size_t, size_t>(begin, words * (thread + 1) / threads);
  };
  // Each thread writes its own share first, so its pages are resident (and, on a NUMA machine,
  // local to it) before any timing.
  {
    std::vector<std::thread> fillers;
    for (int t = 0; t < threads; ++t) {
      fillers.emplace_back([&, t] {
        auto [begin, end] = share(t);
        for (size_t i = begin; i < end; ++i) buffer[i] = i;
      });
    }
    for (std::thread& filler : fillers) filler.join();
  }
  // Wraps like the sums do: 0 + 1 + ... + (words - 1) modulo 2^64.
  const unsigned __int128 n = words;
  const uint64_t expected = static_cast<uint64_t>(n * (n - 1) / 2);
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    std::vector<uint64_t> sums(threads, 0);
    std::vector<std::thread> readers;
    const auto start = Clock::now();
    for (int t = 0; t < threads; ++t) {
      readers.emplace_back([&, t] {
        auto [begin, end] = share(t);
        sums[t] = SumWords(buffer.get() + begin, buffer.get() + end);
      });
    }
    for (std::thread& reader : readers) reader.join();
    const double seconds = Seconds(start, Clock::now());
    uint64_t total = 0;
    for (uint64_t sum : sums) total += sum;
    if (total != expected) {
      return absl::InternalError("bandwidth probe: the buffer's sum came out wrong");
    }
    if (seconds > 0) best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds);
  }
  return best;
}

}  // namespace cloister::bench

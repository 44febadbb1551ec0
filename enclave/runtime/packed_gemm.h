// Matrix products against constant weights packed once, at load: C = A * B (+ bias), with A
// the activations (row-major, read in place) and B a model's weight matrix [k, n] rearranged
// into panels of 32 columns, so that the inner loop reads it contiguously and a prefetch can
// run ahead of it. BLAS repacks B on every call; for short products (one sentence's 128 tokens
// against BERT-sized weights) that repacking, a cold read of the weights, is an eighth of the
// run; with the rows split over threads, each part repacks all of B again.
//
// The inner loop is AVX-512 (a 12-row by 32-column tile of sums in registers) in a file of its
// own, compiled for AVX-512 and called only when the CPU has it (PackedGemmSupported);
// elsewhere the kernels keep calling Gemm. Threading: a PackedWeights is immutable once built
// and may be read by many products at once; PackedGemm is reentrant.
#pragma once

#include <cstdint>
#include <vector>

namespace cloister::runtime {

class PackedWeights {
 public:
  static constexpr int64_t kPanel = 32;  // columns per panel

  // Packs the row-major matrix `b` [k, n] (leading dimension ldb): panel p holds columns
  // [p * kPanel, (p + 1) * kPanel) as k rows of kPanel floats, the last panel zero-padded.
  PackedWeights(const float* b, int64_t k, int64_t n, int64_t ldb);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t panels() const { return (n_ + kPanel - 1) / kPanel; }
  const float* panel(int64_t p) const { return data_.data() + p * k_ * kPanel; }

 private:
  int64_t k_, n_;
  std::vector<float> data_;
};

// What PackedGemm applies to the sums in registers before it stores them.
enum class PackedEpilogue { kNone, kGelu };

// Whether this CPU runs PackedGemm (it has AVX-512F); when not, callers use Gemm.
bool PackedGemmSupported();

// C [m, n] (leading dimension ldc) = epilogue(A [m, k] (leading dimension lda) * B + bias),
// the bias (n floats, bias[j] in every row's j-th column) only when not null; kGelu is
// simd::Gelu, 16 lanes at a time. C is overwritten. Requires PackedGemmSupported().
void PackedGemm(int64_t m, const float* a, int64_t lda, const PackedWeights& b, const float* bias,
                float* c, int64_t ldc, PackedEpilogue epilogue = PackedEpilogue::kNone);

namespace internal {
// The AVX-512 loop (packed_gemm_avx512.cc). With `scratch` (PackedGemmScratchFloats(m, k)
// floats) each chunk of A's rows is first copied there, its rows a cache line further apart.
void PackedGemmAvx512(int64_t m, const float* a, int64_t lda, const PackedWeights& b,
                      const float* bias, float* c, int64_t ldc, PackedEpilogue epilogue,
                      float* scratch);
int64_t PackedGemmScratchFloats(int64_t m, int64_t k);
}  // namespace internal

}  // namespace cloister::runtime

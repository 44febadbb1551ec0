// PackedGemm against a double-precision reference, over the tile's row and column tails, with
// and without a bias and Gelu, and with leading dimensions wider than the matrices.
#include "enclave/runtime/packed_gemm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "enclave/runtime/graph_builder_for_test.h"
#include "gtest/gtest.h"

namespace cloister::runtime {
namespace {

struct Shape {
  int64_t m, k, n;
};

TEST(PackedGemmTest, MatchesReferenceOverTails) {
  if (!PackedGemmSupported()) GTEST_SKIP() << "this CPU has no AVX-512F";
  const std::vector<Shape> shapes = {{1, 1, 1},     {12, 3, 32},     {13, 7, 33},
                                     {11, 64, 16},  {25, 256, 64},   {130, 65, 100},
                                     {24, 1024, 47}, {3, 5, 200},     {500, 40, 70}};
  uint32_t seed = 11;
  for (const Shape& s : shapes) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool with_bias = variant >= 1, gelu = variant == 2;
      SCOPED_TRACE(testing::Message() << s.m << "x" << s.k << "x" << s.n << " bias " << with_bias
                                      << " gelu " << gelu);
      const int64_t lda = s.k + 3, ldb = s.n + 5, ldc = s.n + 2;
      std::vector<float> a = RandomFloats(s.m * lda, seed++), b = RandomFloats(s.k * ldb, seed++),
                         bias = RandomFloats(s.n, seed++);
      std::vector<float> c(s.m * ldc, 42.0f);
      PackedWeights packed(b.data(), s.k, s.n, ldb);
      PackedGemm(s.m, a.data(), lda, packed, with_bias ? bias.data() : nullptr, c.data(), ldc,
                 gelu ? PackedEpilogue::kGelu : PackedEpilogue::kNone);
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= s.n) {
            ASSERT_EQ(c[i * ldc + j], 42.0f) << "wrote past the row at " << i << "," << j;
            continue;
          }
          double want = with_bias ? bias[j] : 0.0;
          for (int64_t p = 0; p < s.k; ++p) {
            want += static_cast<double>(a[i * lda + p]) * b[p * ldb + j];
          }
          if (gelu) want = 0.5 * want * (1.0 + std::erf(want / std::sqrt(2.0)));
          ASSERT_NEAR(c[i * ldc + j], want, 1e-5 * (1.0 + std::sqrt(s.k))) << i << "," << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cloister::runtime

// PackedGemm against a double-precision reference, over the tile's row and column tails, with
// and without a bias and Gelu, and with leading dimensions wider than the matrices.
#include "enclave/runtime/packed_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "enclave/runtime/graph_builder_for_test.h"
#include "enclave/runtime/model.h"
#include "enclave/runtime/runtime_test_helpers.h"
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

// Rows whose leading dimension is a multiple of 2 KiB (BERT's 1024-wide FFN output, read
// as the next product's A) alias in L1, so PackedGemm multiplies a copy of them, a cache line
// further apart: the same sums, bit for bit, as from rows that lie apart already, over more
// than one chunk of rows (240) and with k short of the leading dimension.
TEST(PackedGemmTest, RowsThatAliasInL1GiveTheSameSumsAsRowsApart) {
  if (!PackedGemmSupported()) GTEST_SKIP() << "this CPU has no AVX-512F";
  struct Case {
    int64_t m, k, n, lda;
  };
  const std::vector<Case> cases = {
      {251, 512, 40, 512}, {30, 1024, 70, 1024}, {13, 100, 33, 512}, {485, 1024, 32, 2048},
      {40, 496, 48, 512}};
  uint32_t seed = 51;
  for (const Case& t : cases) {
    SCOPED_TRACE(testing::Message() << t.m << "x" << t.k << "x" << t.n << " lda " << t.lda);
    const int64_t apart = t.lda + 3;
    std::vector<float> a = RandomFloats(t.m * t.lda, seed++), b = RandomFloats(t.k * t.n, seed++),
                       bias = RandomFloats(t.n, seed++);
    std::vector<float> a_apart(t.m * apart, 0.0f);
    for (int64_t i = 0; i < t.m; ++i) {
      std::copy(a.begin() + i * t.lda, a.begin() + i * t.lda + t.k, a_apart.begin() + i * apart);
    }
    PackedWeights packed(b.data(), t.k, t.n, t.n);
    std::vector<float> c(t.m * t.n), c_apart(t.m * t.n);
    PackedGemm(t.m, a.data(), t.lda, packed, bias.data(), c.data(), t.n, PackedEpilogue::kGelu);
    PackedGemm(t.m, a_apart.data(), apart, packed, bias.data(), c_apart.data(), t.n,
               PackedEpilogue::kGelu);
    ASSERT_EQ(c, c_apart);
    for (int64_t i = 0; i < t.m; i += 17) {
      for (int64_t j = 0; j < t.n; ++j) {
        double want = bias[j];
        for (int64_t p = 0; p < t.k; ++p) {
          want += static_cast<double>(a[i * t.lda + p]) * b[p * t.n + j];
        }
        want = 0.5 * want * (1.0 + std::erf(want / std::sqrt(2.0)));
        ASSERT_NEAR(c[i * t.n + j], want, 1e-5 * (1.0 + std::sqrt(t.k))) << i << "," << j;
      }
    }
  }
}

// A model's products against constant weights give the same with the packed product as with
// BLAS (which they use with LoadOptions::pack_weights false, or on CPUs without AVX-512): bias,
// a fused Gelu written out as exporters write it, a fused Relu, and rows that are not a
// multiple of the tile.
TEST(PackedGemmTest, ModelGivesWhatBlasGives) {
  if (!PackedGemmSupported()) GTEST_SKIP() << "this CPU has no AVX-512F";
  GraphBuilder builder;
  builder.Input("x", onnx::TensorProto::FLOAT, {3, 101, 96});
  builder.FloatInitializer("w1", {96, 200}, RandomFloats(96 * 200, 21));
  builder.FloatInitializer("b1", {200}, RandomFloats(200, 22));
  builder.FloatInitializer("w2", {200, 70}, RandomFloats(200 * 70, 23));
  builder.FloatInitializer("b2", {70}, RandomFloats(70, 24));
  builder.Node("MatMul", {"x", "w1"}, {"xw"});
  builder.Node("Add", {"xw", "b1"}, {"h"});
  AddWrittenOutGelu(builder, "h", "gelu");
  builder.Node("MatMul", {"gelu", "w2"}, {"gw"});
  builder.Node("Add", {"gw", "b2"}, {"g"});
  builder.Node("Relu", {"g"}, {"y"});
  builder.Output("y");
  builder.Output("gelu");
  auto packed = LoadOrDie(builder);
  const std::string bytes = builder.Bytes();
  LoadOptions one_copy;
  one_copy.pack_weights = false;
  auto blas = Model::Load(AsBytes(bytes), one_copy);
  ASSERT_TRUE(packed != nullptr && blas.ok()) << blas.status();
  std::vector<std::pair<std::string, Tensor>> inputs = {
      {"x", FloatTensor({3, 101, 96}, RandomFloats(3 * 101 * 96, 25))}};
  auto want = (*blas)->Run(inputs);
  auto got = packed->Run(inputs);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  ASSERT_EQ(want->size(), got->size());
  // Two different products ran: they add in different orders, so among some 20 000 outputs
  // some last bits differ (equal everywhere would mean both models took the same branch).
  EXPECT_NE(Values((*got)[0].second), Values((*want)[0].second));
  for (size_t o = 0; o < want->size(); ++o) {
    SCOPED_TRACE((*want)[o].first);
    // The two add their 96 or 200 terms in different orders; the second product's terms reach
    // about 10 before they cancel, so float rounding alone moves results by some 1e-5.
    ExpectNear(Values((*got)[o].second), Values((*want)[o].second), 1e-4f);
  }
}

}  // namespace
}  // namespace cloister::runtime

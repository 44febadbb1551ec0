// The CPU kernels on every instruction-set path this CPU has, against double-precision
// references: MatMul for each weight type on shapes that leave partial panels and token tiles,
// attention over a paged cache across block boundaries, and the vector helpers.
#include "enclave/llm/kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace cloister::llm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// 2^-24: the unit roundoff of float32.
constexpr double kUnitRoundoff = 5.9604644775390625e-8;

std::string BestIsa() { return HaveAvx512() ? "avx512" : HaveAvx2() ? "avx2" : "portable"; }

// Each test runs its kernels on the path named by the parameter, skipped where the CPU lacks it.
class KernelsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    saved_ = KernelIsa();
    ASSERT_TRUE(SetKernelIsaForTest(GetParam()).ok());
    if (KernelIsa() != std::string(GetParam())) {
      GTEST_SKIP() << GetParam() << " is not available on this CPU";
    }
  }
  void TearDown() override { ASSERT_TRUE(SetKernelIsaForTest(saved_).ok()); }

 private:
  std::string saved_;
};

INSTANTIATE_TEST_SUITE_P(Isas, KernelsTest, ::testing::Values("avx512", "avx2", "portable"),
                         [](const auto& info) { return std::string(info.param); });

// Row-major weights of one type and the exact value of each as double.
struct RowMajor {
  std::vector<uint8_t> bytes;
  std::vector<double> values;
};

RowMajor RandomWeights(DType dtype, int64_t count, std::mt19937& rng) {
  RowMajor out;
  out.bytes.resize(count * DTypeSize(dtype));
  out.values.resize(count);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* p = out.bytes.data() + i * DTypeSize(dtype);
    if (dtype == DType::kF32) {
      const float f = uniform(rng);
      std::memcpy(p, &f, 4);
      out.values[i] = f;
    } else if (dtype == DType::kBF16) {
      const float f = uniform(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t top = static_cast<uint16_t>(bits >> 16);
      std::memcpy(p, &top, 2);
      const uint32_t widened = static_cast<uint32_t>(top) << 16;
      float g;
      std::memcpy(&g, &widened, 4);
      out.values[i] = g;
    } else {
      // Exponents 0 (subnormal) to 16 (up to 4), any sign and mantissa.
      const uint16_t sign = rng() & 1;
      const uint16_t exponent = rng() % 17;
      const uint16_t mantissa = rng() & 0x3ff;
      const uint16_t bits = static_cast<uint16_t>(sign << 15 | exponent << 10 | mantissa);
      std::memcpy(p, &bits, 2);
      const double magnitude =
          exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
      out.values[i] = sign ? -magnitude : magnitude;
    }
  }
  return out;
}

std::vector<float> RandomFloats(int64_t count, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(count);
  for (float& f : out) f = normal(rng);
  return out;
}

TEST_P(KernelsTest, MatMulMatchesDoubleReference) {
  struct Shape {
    int64_t rows, cols;
  };
  // Partial panels, columns that are not a multiple of 8 or 16, and more than one column slice.
  const Shape shapes[] = {{1, 1}, {5, 7}, {16, 13}, {37, 100}, {50, 401}, {70, 777}};
  constexpr int64_t kMaxTokens = 17;
  std::mt19937 rng(20240611);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : shapes) {
      const int64_t rows = shape.rows, cols = shape.cols;
      SCOPED_TRACE(testing::Message() << DTypeName(dtype) << " " << rows << "x" << cols);
      const RowMajor source = RandomWeights(dtype, rows * cols, rng);
      std::vector<uint8_t> packed(WeightMatrix::PaddedRows(rows) * cols * DTypeSize(dtype), 0);
      WeightMatrix w{dtype, rows, cols, packed.data()};
      PackRows(source.bytes.data(), dtype, rows, 0, packed.data(), w);

      const int64_t x_stride = cols + 3, y_stride = rows + 5;
      const std::vector<float> x = RandomFloats(kMaxTokens * x_stride, 1.0f, rng);
      const std::vector<float> y0 = RandomFloats(kMaxTokens * y_stride, 1.0f, rng);
      std::vector<double> exact(kMaxTokens * rows), magnitude(kMaxTokens * rows);
      for (int64_t t = 0; t < kMaxTokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double sum = 0, abs_sum = 0;
          for (int64_t k = 0; k < cols; ++k) {
            const double term = source.values[r * cols + k] * x[t * x_stride + k];
            sum += term;
            abs_sum += std::abs(term);
          }
          exact[t * rows + r] = sum;
          magnitude[t * rows + r] = abs_sum;
        }
      }
      // Row ranges as the model's threads split them: starting on a panel, ending anywhere.
      std::vector<std::pair<int64_t, int64_t>> ranges = {{0, rows}};
      if (rows > 16) {
        ranges.push_back({16, rows});
        ranges.push_back({0, 16});
      }
      if (rows > 32) ranges.push_back({32, std::min<int64_t>(rows, 41)});
      for (auto [begin, end] : ranges) {
        for (int64_t tokens = 1; tokens <= kMaxTokens; ++tokens) {
          for (bool accumulate : {false, true}) {
            SCOPED_TRACE(testing::Message() << "rows [" << begin << ", " << end << ") tokens "
                                            << tokens << " accumulate " << accumulate);
            std::vector<float> y = y0;
            MatMul(x.data(), tokens, x_stride, w, begin, end, y.data(), y_stride, accumulate);
            int failures = 0;
            for (int64_t t = 0; t < kMaxTokens && failures < 5; ++t) {
              for (int64_t r = 0; r < y_stride && failures < 5; ++r) {
                const size_t i = t * y_stride + r;
                if (t >= tokens || r < begin || r >= end) {
                  if (std::memcmp(&y[i], &y0[i], sizeof(float)) != 0) {
                    ADD_FAILURE() << "wrote outside the range at token " << t << " row " << r;
                    ++failures;
                  }
                  continue;
                }
                const double base = accumulate ? y0[i] : 0.0;
                const double expected = base + exact[t * rows + r];
                // Any float32 summation order of cols + 1 terms stays within this bound.
                const double bound =
                    (cols + 2) * kUnitRoundoff * (magnitude[t * rows + r] + std::abs(base));
                if (!(std::abs(y[i] - expected) <= bound)) {
                  ADD_FAILURE() << "token " << t << " row " << r << ": got " << y[i]
                                << ", expected " << expected << " within " << bound;
                  ++failures;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelsTest, MatMulWithoutTokensOrRowsWritesNothing) {
  std::vector<uint16_t> packed(16 * 8, 0x3f80);  // BF16 ones
  WeightMatrix w{DType::kBF16, 16, 8, packed.data()};
  std::vector<float> x(8, 1.0f), y(16, -1.0f);
  MatMul(x.data(), 0, 8, w, 0, 16, y.data(), 16, false);
  MatMul(x.data(), 1, 8, w, 16, 16, y.data(), 16, false);
  EXPECT_EQ(y, std::vector<float>(16, -1.0f));
  MatMul(x.data(), 1, 8, w, 0, 16, y.data(), 16, false);
  EXPECT_EQ(y, std::vector<float>(16, 8.0f));
}

struct AttendCase {
  int64_t group, head_dim;
  int32_t block_size;
  int64_t first, last;
  float q_scale;
};

TEST_P(KernelsTest, AttendPagedMatchesDoubleReference) {
  const AttendCase cases[] = {
      {1, 32, 16, 0, 0, 0.5f},     // one position
      {4, 32, 16, 0, 40, 0.5f},    // the tiny model's shape, across blocks
      {4, 32, 5, 3, 37, 0.5f},     // small blocks, a window not starting at 0
      {2, 64, 16, 17, 100, 0.5f},  // first block skipped entirely
      {8, 128, 16, 0, 200, 0.3f},  // long head: output in two passes of registers
      {2, 64, 16, 0, 70, 4.0f},    // scores far from 0: needs the maximum subtracted
      {3, 24, 7, 2, 30, 0.5f},     // head_dim a multiple of 8 but not 16
      {17, 16, 4, 0, 9, 0.5f},     // more query heads than the AVX-512 path takes
      {2, 20, 8, 0, 19, 0.5f},     // head_dim not a multiple of 8
  };
  std::mt19937 rng(7);
  for (const AttendCase& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << "group " << c.group << " head_dim " << c.head_dim << " block " << c.block_size
                 << " [" << c.first << ", " << c.last << "]");
    const int64_t blocks = c.last / c.block_size + 1;
    std::vector<std::vector<float>> keys(blocks), values(blocks);
    std::vector<const float*> key_blocks(blocks, nullptr), value_blocks(blocks, nullptr);
    // Blocks wholly before `first` stay null: the kernel must not read them.
    for (int64_t b = c.first / c.block_size; b < blocks; ++b) {
      keys[b] = RandomFloats(c.block_size * c.head_dim, 1.0f, rng);
      values[b] = RandomFloats(c.block_size * c.head_dim, 1.0f, rng);
      key_blocks[b] = keys[b].data();
      value_blocks[b] = values[b].data();
    }
    auto at = [&](const std::vector<std::vector<float>>& cache, int64_t pos, int64_t i) {
      return static_cast<double>(cache[pos / c.block_size][(pos % c.block_size) * c.head_dim + i]);
    };
    const std::vector<float> q = RandomFloats(c.group * c.head_dim, c.q_scale, rng);
    const int64_t span = c.last - c.first + 1;
    std::vector<float> scores(c.group * span), out(c.group * c.head_dim, NAN);
    AttendPaged(q.data(), c.group, c.head_dim, key_blocks.data(), value_blocks.data(), c.block_size,
                c.first, c.last, scores.data(), out.data());
    int failures = 0;
    for (int64_t h = 0; h < c.group; ++h) {
      std::vector<double> s(span);
      double maximum = -INFINITY;
      for (int64_t pos = c.first; pos <= c.last; ++pos) {
        double dot = 0;
        for (int64_t i = 0; i < c.head_dim; ++i) dot += q[h * c.head_dim + i] * at(keys, pos, i);
        s[pos - c.first] = dot;
        maximum = std::max(maximum, dot);
      }
      double total = 0;
      for (double& v : s) total += (v = std::exp(v - maximum));
      for (int64_t i = 0; i < c.head_dim; ++i) {
        double expected = 0, magnitude = 0;
        for (int64_t pos = c.first; pos <= c.last; ++pos) {
          const double p = s[pos - c.first] / total;
          expected += p * at(values, pos, i);
          magnitude += p * std::abs(at(values, pos, i));
        }
        const float got = out[h * c.head_dim + i];
        const double bound = 6e-7 * (1 + c.q_scale * c.head_dim / 8.0) * magnitude;
        if (!(std::abs(got - expected) <= bound) && failures++ < 5) {
          ADD_FAILURE() << "head " << h << " dim " << i << ": got " << got << ", expected "
                        << expected << " within " << bound;
        }
      }
    }
  }
}

TEST_P(KernelsTest, VectorHelpersMatchDoubleReference) {
  std::mt19937 rng(99);
  for (int64_t size : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 70, 1000}) {
    SCOPED_TRACE(testing::Message() << "size " << size);
    const std::vector<float> a = RandomFloats(size, 1.0f, rng);
    const std::vector<float> b = RandomFloats(size, 1.0f, rng);
    double dot = 0, magnitude = 0;
    for (int64_t i = 0; i < size; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      magnitude += std::abs(static_cast<double>(a[i]) * b[i]);
    }
    EXPECT_NEAR(Dot(a.data(), b.data(), size), dot, (size + 1) * kUnitRoundoff * magnitude);

    std::vector<float> y = b;
    Axpy(0.75f, a.data(), y.data(), size);
    for (int64_t i = 0; i < size; ++i) {
      const double expected = 0.75 * a[i] + static_cast<double>(b[i]);
      EXPECT_NEAR(y[i], expected, 2 * kUnitRoundoff * (std::abs(0.75 * a[i]) + std::abs(b[i])));
    }

    // Gates from -90 to 90 reach the ends of the exponential's range.
    std::vector<float> gate = RandomFloats(size, 4.0f, rng);
    if (size > 2) {
      gate[0] = -90.0f;
      gate[1] = 90.0f;
    }
    std::vector<float> silu(size);
    SiluMul(gate.data(), b.data(), size, silu.data());
    for (int64_t i = 0; i < size; ++i) {
      const double expected = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * b[i];
      EXPECT_NEAR(silu[i], expected, 1e-6 * std::abs(expected) + 1e-30) << "gate " << gate[i];
    }

    if (size > 0) {
      std::vector<float> normed(size);
      RmsNorm(a.data(), b.data(), size, 1e-5f, normed.data());
      double squares = 0;
      for (float v : a) squares += static_cast<double>(v) * v;
      const double scale = 1.0 / std::sqrt(squares / size + 1e-5);
      for (int64_t i = 0; i < size; ++i) {
        const double expected = b[i] * (a[i] * scale);
        EXPECT_NEAR(normed[i], expected, (size + 8) * kUnitRoundoff * std::abs(expected));
      }
    }
  }
}

TEST(KernelIsaTest, AskingForAPathGivesItOrTheBestAvailable) {
  const std::string saved = KernelIsa();
  ASSERT_TRUE(SetKernelIsaForTest("portable").ok());
  EXPECT_STREQ(KernelIsa(), "portable");
  ASSERT_TRUE(SetKernelIsaForTest("avx2").ok());
  EXPECT_STREQ(KernelIsa(), HaveAvx2() ? "avx2" : "portable");
  ASSERT_TRUE(SetKernelIsaForTest("avx512").ok());
  EXPECT_EQ(KernelIsa(), BestIsa());
  ASSERT_TRUE(SetKernelIsaForTest(saved).ok());
}

TEST(KernelIsaTest, UnknownNameIsRefused) {
  const std::string saved = KernelIsa();
  const absl::Status status = SetKernelIsaForTest("avx3");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("unknown kernel ISA 'avx3'"));
  EXPECT_EQ(KernelIsa(), saved);
}

// CLOISTER_LLM_ISA is read once per process, so each case runs in a fresh one.
TEST(KernelIsaTest, EnvironmentChoosesThePath) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto print_isa = [] {
    std::fprintf(stderr, "isa=%s\n", KernelIsa());
    std::exit(0);
  };
  ASSERT_EQ(setenv("CLOISTER_LLM_ISA", "portable", 1), 0);
  EXPECT_EXIT(print_isa(), ::testing::ExitedWithCode(0), HasSubstr("isa=portable\n"));
  ASSERT_EQ(setenv("CLOISTER_LLM_ISA", "", 1), 0);
  EXPECT_EXIT(print_isa(), ::testing::ExitedWithCode(0), HasSubstr("isa=" + BestIsa() + "\n"));
  ASSERT_EQ(setenv("CLOISTER_LLM_ISA", "avx3", 1), 0);
  EXPECT_EXIT(print_isa(), ::testing::ExitedWithCode(0),
              AllOf(HasSubstr("llm_kernel_isa_unknown"), HasSubstr("avx3"),
                    HasSubstr("isa=" + BestIsa() + "\n")));
  ASSERT_EQ(unsetenv("CLOISTER_LLM_ISA"), 0);
}

}  // namespace
}  // namespace cloister::llm

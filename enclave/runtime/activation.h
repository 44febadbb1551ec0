// Activations that kernels apply to their own output (load-time fusion of Conv/MatMul with the
// activation node after them), vectorised with simd.h. Threading: plain values.
#pragma once

#include <cstdint>
#include <optional>

#include "enclave/runtime/kernel.h"
#include "enclave/runtime/simd.h"

namespace cloister::runtime {

struct Activation {
  enum class Kind {
    kNone,
    kRelu,
    kClip,
    kHardSigmoid,
    kHardSwish,
    kLeakyRelu,
    kSigmoid,
    kTanh,
    kGelu
  };
  Kind kind = Kind::kNone;
  float alpha = 0;  // Clip: min; HardSigmoid, LeakyRelu: alpha
  float beta = 0;   // Clip: max; HardSigmoid: beta

  // The activation a float node computes, or nullopt when the node is not one (or its
  // parameters are not constants).
  static std::optional<Activation> FromNode(const NodeContext& node);

  simd::Vec Vector(simd::Vec x) const {
    switch (kind) {
      case Kind::kNone:
        return x;
      case Kind::kRelu:
        return simd::Max(x, simd::Splat(0.0f));
      case Kind::kClip:
        return simd::Min(simd::Max(x, simd::Splat(alpha)), simd::Splat(beta));
      case Kind::kHardSigmoid:
        return simd::Min(simd::Max(x * alpha + beta, simd::Splat(0.0f)), simd::Splat(1.0f));
      case Kind::kHardSwish:
        return x *
               simd::Min(simd::Max(x * (1.0f / 6.0f) + 0.5f, simd::Splat(0.0f)), simd::Splat(1.0f));
      case Kind::kLeakyRelu:
        return simd::Select(x >= 0.0f, x, x * alpha);
      case Kind::kSigmoid:
        return simd::Sigmoid(x);
      case Kind::kTanh:
        return simd::Tanh(x);
      case Kind::kGelu:
        return 0.5f * x * (1.0f + simd::Erf(x * 0.70710678118654752f));
    }
    return x;
  }
  void Apply(float* data, int64_t count) const {
    if (kind == Kind::kNone) return;
    simd::Map(data, data, count, [this](simd::Vec v) { return Vector(v); });
  }
};

}  // namespace cloister::runtime

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

  // The activation of kind K on one vector (alpha and beta as above).
  template <Kind K>
  static simd::Vec VectorOf(simd::Vec x, float alpha, float beta) {
    if constexpr (K == Kind::kRelu) {
      return simd::Max(x, simd::Splat(0.0f));
    } else if constexpr (K == Kind::kClip) {
      return simd::Min(simd::Max(x, simd::Splat(alpha)), simd::Splat(beta));
    } else if constexpr (K == Kind::kHardSigmoid) {
      return simd::Min(simd::Max(x * alpha + beta, simd::Splat(0.0f)), simd::Splat(1.0f));
    } else if constexpr (K == Kind::kHardSwish) {
      return x * simd::Min(simd::Max(x * (1.0f / 6.0f) + 0.5f, simd::Splat(0.0f)), simd::Splat(1.0f));
    } else if constexpr (K == Kind::kLeakyRelu) {
      return simd::Select(x >= 0.0f, x, x * alpha);
    } else if constexpr (K == Kind::kSigmoid) {
      return simd::Sigmoid(x);
    } else if constexpr (K == Kind::kTanh) {
      return simd::Tanh(x);
    } else if constexpr (K == Kind::kGelu) {
      return simd::Gelu(x);
    } else {
      return x;
    }
  }

  // Applies the activation to `count` floats in place, then (when `affine`) x * scale + shift,
  // in one pass; the kind is chosen once per call, not per vector.
  void Apply(float* data, int64_t count, bool affine = false, float scale = 1.0f,
             float shift = 0.0f) const {
    switch (kind) {
      case Kind::kNone:
        return affine ? Run<Kind::kNone, true>(data, count, scale, shift) : void();
      case Kind::kRelu:
        return Dispatch<Kind::kRelu>(data, count, affine, scale, shift);
      case Kind::kClip:
        return Dispatch<Kind::kClip>(data, count, affine, scale, shift);
      case Kind::kHardSigmoid:
        return Dispatch<Kind::kHardSigmoid>(data, count, affine, scale, shift);
      case Kind::kHardSwish:
        return Dispatch<Kind::kHardSwish>(data, count, affine, scale, shift);
      case Kind::kLeakyRelu:
        return Dispatch<Kind::kLeakyRelu>(data, count, affine, scale, shift);
      case Kind::kSigmoid:
        return Dispatch<Kind::kSigmoid>(data, count, affine, scale, shift);
      case Kind::kTanh:
        return Dispatch<Kind::kTanh>(data, count, affine, scale, shift);
      case Kind::kGelu:
        return Dispatch<Kind::kGelu>(data, count, affine, scale, shift);
    }
  }

 private:
  template <Kind K>
  void Dispatch(float* data, int64_t count, bool affine, float scale, float shift) const {
    if (affine) {
      Run<K, true>(data, count, scale, shift);
    } else {
      Run<K, false>(data, count, scale, shift);
    }
  }
  template <Kind K, bool kAffine>
  void Run(float* data, int64_t count, float scale, float shift) const {
    const float a = alpha, b = beta;
    simd::Map(data, data, count, [a, b, scale, shift](simd::Vec v) {
      v = VectorOf<K>(v, a, b);
      if constexpr (kAffine) v = v * scale + shift;
      return v;
    });
  }
};

}  // namespace cloister::runtime

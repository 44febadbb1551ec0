// Launchers for the CUDA executor's own kernels, one file per family:
// cuda_kernels_{elementwise,movement,reduce,conv}.cu. Each takes device pointers, element counts
// and the run's stream, queues one kernel (or none for zero elements) and returns the launch's
// cudaError_t; the caller converts it into a Status (CudaStatus, cuda_device.h). Index arithmetic
// is 64-bit throughout; every kernel is a bounds-checked grid-stride loop.
//
// This header is plain C++ (no absl) so that nvcc compiles the kernels without the rest of the
// runtime. Threading: launchers are stateless; a run's kernels are ordered by its stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cloister::gpu {

// Element types, in the order of runtime::DataType (checked in cuda_ops.cc).
enum class DeviceType : int {
  kFloat,
  kDouble,
  kHalf,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kBool,
};

inline constexpr int kMaxRank = 8;

// An iteration space of `rank` dims and, per operand, the element stride of each dim (0 where
// the operand is broadcast) and a starting element offset.
struct StridedIndex {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[3][kMaxRank] = {};
  int64_t offsets[3] = {};
};

enum class UnaryOp : int {
  kRelu,
  kNeg,
  kAbs,
  kSign,
  kSigmoid,
  kTanh,
  kErf,
  kSqrt,
  kExp,
  kLog,
  kSin,
  kCos,
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kFloor,
  kCeil,
  kRound,
  kReciprocal,
  kSoftsign,
  kSoftplus,
  kHardSwish,
  kHardSigmoid,
  kLeakyRelu,
  kElu,
  kCelu,
  kSelu,
  kThresholdedRelu,
  kGelu,
  kGeluTanh,
  kClip,
  kIdentity,
};
// out[i] = op(in[i]) on floats; alpha/beta are the op's attributes (Clip: min, max).
cudaError_t LaunchUnary(UnaryOp op, float alpha, float beta, const float* in, float* out,
                        int64_t count, cudaStream_t stream);

enum class BinaryOp : int {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kPRelu,
  kMax,
  kMin,
  kEqual,
  kLess,
  kGreater,
  kLessOrEqual,
  kGreaterOrEqual,
  kAnd,
  kOr,
  kXor,
};
// out[index] = a[index] op b[index] over `index` (operands 0 = a, 1 = b, 2 = out). Arithmetic
// ops write `type`; comparisons and logic write bool. Types: float, double, int32, int64 (and
// bool for And/Or/Xor/Equal). Returns cudaErrorInvalidValue for a combination it lacks.
cudaError_t LaunchBinary(BinaryOp op, DeviceType type, const void* a, const void* b, void* out,
                         const StridedIndex& index, cudaStream_t stream);

// out = cond ? x : y over `index` (operands: 0 = cond, 1 = x, 2 = y; out is dense).
cudaError_t LaunchWhere(const bool* cond, const void* x, const void* y, void* out, int element_size,
                        const StridedIndex& index, cudaStream_t stream);

// Copies `index`'s space: out[offset 2 + strides 2] = in[offset 0 + strides 0] (operand 1
// unused). Covers Transpose, Expand, Slice, Split and Concat.
cudaError_t LaunchStridedCopy(const void* in, void* out, int element_size,
                              const StridedIndex& index, cudaStream_t stream);

// Element type conversion with ONNX Cast semantics for the numeric types (float to integer
// truncates toward zero; anything non-zero becomes true).
cudaError_t LaunchCast(DeviceType from, DeviceType to, const void* in, void* out, int64_t count,
                       cudaStream_t stream);

// Gather along one axis: data viewed as [outer, axis_count, inner], indices (int32 or int64,
// negative counts from the end) of `index_count` elements; out is [outer, index_count, inner].
// An index out of range writes zeros and sets *error_flag to 1.
cudaError_t LaunchGather(const void* data, int element_size, const void* indices,
                         bool indices_int64, int64_t outer, int64_t axis_count, int64_t inner,
                         int64_t index_count, void* out, int* error_flag, cudaStream_t stream);

enum class ReduceOp : int {
  kSum,
  kMean,
  kMax,
  kMin,
  kProd,
  kL1,
  kL2,
  kSumSquare,
  kLogSum,
  kLogSumExp,
};
// Reduces floats: `kept` iterates the output (operand 0 strides into the input), `reduced`
// iterates the reduced dims for one output (operand 0 strides into the input).
cudaError_t LaunchReduce(ReduceOp op, const float* in, float* out, const StridedIndex& kept,
                         const StridedIndex& reduced, cudaStream_t stream);

// Softmax over the middle dim of in viewed as [outer, axis_count, inner].
cudaError_t LaunchSoftmax(const float* in, float* out, int64_t outer, int64_t axis_count,
                          int64_t inner, bool log, cudaStream_t stream);

// Normalises rows of `row_size` floats: out = (x - mean) / sqrt(var + epsilon) * scale + bias,
// scale and bias of row_size elements (bias may be null).
cudaError_t LaunchLayerNorm(const float* in, const float* scale, const float* bias, float* out,
                            int64_t rows, int64_t row_size, float epsilon, cudaStream_t stream);

// Inference batch norm on [n, channels, inner].
cudaError_t LaunchBatchNorm(const float* in, const float* scale, const float* bias,
                            const float* mean, const float* variance, float* out, int64_t n,
                            int64_t channels, int64_t inner, float epsilon, cudaStream_t stream);

// Geometry of a convolution or pooling window over up to 3 spatial dims.
struct WindowGeometry {
  int spatial_rank = 0;
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t groups = 1;
  int64_t in_dims[3] = {1, 1, 1};
  int64_t out_dims[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1};
  int64_t strides[3] = {1, 1, 1};
  int64_t dilations[3] = {1, 1, 1};
  int64_t pads_begin[3] = {0, 0, 0};
  int64_t pads_end[3] = {0, 0, 0};
};
// Direct convolution, one thread per output: in [N, C, spatial], weight [M, C/groups, kernel],
// bias [M] or null, out [N, M, out spatial].
cudaError_t LaunchConvDirect(const float* in, const float* weight, const float* bias, float* out,
                             const WindowGeometry& geometry, cudaStream_t stream);
// im2col for one image and group 0..: col is [C/groups * kernel_size, out_spatial] for the
// channels [channel_begin, channel_begin + C/groups) of image `image`.
cudaError_t LaunchIm2Col(const float* in, float* col, const WindowGeometry& geometry, int64_t image,
                         int64_t channel_begin, cudaStream_t stream);
// out[n, m, p] += bias[m] on [n, channels, inner].
cudaError_t LaunchAddChannelBias(float* out, const float* bias, int64_t n, int64_t channels,
                                 int64_t inner, cudaStream_t stream);

// Max or average pooling (geometry's in/out channels equal), one thread per output. Average
// divides by the window size including padding when count_include_pad, else by the count of
// in-range elements.
cudaError_t LaunchPool(const float* in, float* out, const WindowGeometry& geometry, bool max_pool,
                       bool count_include_pad, cudaStream_t stream);

enum class PadMode : int { kConstant, kReflect, kEdge };
// Pads `rank`-dim in (dims in index.dims are the output's; pads_begin per dim may be negative
// to crop). Operand 0 strides are the input's dense strides; in_dims the input's dims.
cudaError_t LaunchPad(const void* in, void* out, int element_size, PadMode mode,
                      const void* constant_value, const StridedIndex& index, const int64_t* in_dims,
                      const int64_t* pads_begin, cudaStream_t stream);

// Fills `count` elements of `element_size` bytes with the value at host `value`.
cudaError_t LaunchFill(void* out, int element_size, const void* value, int64_t count,
                       cudaStream_t stream);

}  // namespace cloister::gpu

#include "enclave/gpu/llm/cuda_llm_engine.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "enclave/gpu/cuda_device.h"
#include "enclave/gpu/cuda_executor.h"
#include "enclave/gpu/llm/llm_kernels.h"

namespace cloister::gpu::llm {
namespace {

namespace core = cloister::llm;

// A device allocation, zeroed before it is freed (weights and caches are tenants' secrets).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  absl::Status Allocate(size_t size, std::string_view what) {
    Reset();
    if (size == 0) return absl::OkStatus();
    const cudaError_t error = cudaMalloc(&data_, size);
    if (error != cudaSuccess) {
      data_ = nullptr;
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size,
                                                       " bytes of device memory for ", std::string(what), ": ",
                                                       cudaGetErrorName(error)));
    }
    size_ = size;
    return CudaStatus(cudaMemset(data_, 0, size), "cudaMemset");
  }
  // Grows (contents lost) to at least `size` bytes.
  absl::Status Reserve(size_t size, std::string_view what) {
    if (size <= size_) return absl::OkStatus();
    return Allocate(std::max(size, size_ + size_ / 2), what);
  }
  void Reset() {
    if (data_ == nullptr) return;
    // Unscrubbed memory is never handed back: a failed scrub keeps it (a leak, not a leak of
    // plaintext to the next owner).
    if (cudaMemset(data_, 0, size_) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess) {
      (void)cudaFree(data_);
    }
    data_ = nullptr;
    size_ = 0;
  }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Pinned host memory for the step's one upload and one download.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  absl::Status Reserve(size_t size) {
    if (size <= size_) return absl::OkStatus();
    Reset();
    size = std::max<size_t>(size, 4096);
    RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&data_, size), "cudaMallocHost"));
    size_ = size;
    return absl::OkStatus();
  }
  void Reset() {
    if (data_ == nullptr) return;
    std::memset(data_, 0, size_);
    (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

ElementType ToElementType(core::DType dtype) {
  switch (dtype) {
    case core::DType::kF32:
      return ElementType::kF32;
    case core::DType::kF16:
      return ElementType::kF16;
    case core::DType::kBF16:
      return ElementType::kBf16;
  }
  return ElementType::kF32;
}

size_t ElementSize(ElementType type) { return type == ElementType::kF32 ? 4 : 2; }

// A [rows, cols] weight matrix in Hugging Face's row-major [out, in] layout.
struct DeviceMatrix {
  ElementType type = ElementType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  DeviceBuffer data;
};

struct DeviceLayer {
  DeviceBuffer input_norm;
  DeviceBuffer post_norm;
  DeviceBuffer qkv_bias;  // empty without bias
  DeviceMatrix qkv;
  DeviceMatrix o;
  DeviceMatrix gate_up;
  DeviceMatrix down;
};

absl::Status UploadFloats(const std::vector<float>& values, DeviceBuffer& out, std::string_view what) {
  RETURN_IF_ERROR(out.Allocate(values.size() * sizeof(float), what));
  return CudaStatus(cudaMemcpy(out.get(), values.data(), values.size() * sizeof(float),
                               cudaMemcpyHostToDevice),
                    "cudaMemcpy");
}

class CudaLlmEngine : public core::StepEngine {
 public:
  explicit CudaLlmEngine(const core::Model& model) : config_(model.config()) {}

  ~CudaLlmEngine() override {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    if (blas_ != nullptr) (void)cublasDestroy(blas_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  absl::Status Init(const core::CheckpointFiles& files, const core::EngineOptions& options) {
    const core::ModelConfig& c = config_;
    if (c.head_dim > 256 || c.head_dim % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the CUDA engine supports an even head_dim up to 256, the model has ", c.head_dim));
    }
    if (options.num_blocks < 1 || options.block_size < 1) {
      return absl::InvalidArgumentError("num_blocks and block_size must be at least 1");
    }
    precision_ = options.precision;
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
    RETURN_IF_ERROR(CublasStatus(cublasCreate(&blas_), "cublasCreate"));
    RETURN_IF_ERROR(CublasStatus(cublasSetStream(blas_, stream_), "cublasSetStream"));
    // No TF32: float32 products stay float32 (the references' precision).
    RETURN_IF_ERROR(
        CublasStatus(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));

    ASSIGN_OR_RETURN(core::Checkpoint checkpoint, core::Checkpoint::Open(files));
    ASSIGN_OR_RETURN(core::CheckpointTensors tensors, core::PlanCheckpointTensors(checkpoint, c));
    RETURN_IF_ERROR(UploadMatrix({tensors.embed}, embed_, "embeddings"));
    if (!c.tie_word_embeddings) RETURN_IF_ERROR(UploadMatrix({tensors.lm_head}, lm_head_, "lm_head"));
    RETURN_IF_ERROR(UploadFloats(core::TensorToFloat(*tensors.final_norm), final_norm_, "norm"));
    layers_.resize(c.num_layers);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const core::CheckpointTensors::Layer& t = tensors.layers[l];
      DeviceLayer& layer = layers_[l];
      RETURN_IF_ERROR(UploadFloats(core::TensorToFloat(*t.input_norm), layer.input_norm, "norm"));
      RETURN_IF_ERROR(UploadFloats(core::TensorToFloat(*t.post_norm), layer.post_norm, "norm"));
      if (t.q_bias != nullptr) {
        std::vector<float> bias;
        for (const core::TensorView* part : {t.q_bias, t.k_bias, t.v_bias}) {
          std::vector<float> values = core::TensorToFloat(*part);
          bias.insert(bias.end(), values.begin(), values.end());
        }
        RETURN_IF_ERROR(UploadFloats(bias, layer.qkv_bias, "bias"));
      }
      RETURN_IF_ERROR(UploadMatrix({t.q, t.k, t.v}, layer.qkv, "weights"));
      RETURN_IF_ERROR(UploadMatrix({t.o}, layer.o, "weights"));
      RETURN_IF_ERROR(UploadMatrix({t.gate, t.up}, layer.gate_up, "weights"));
      RETURN_IF_ERROR(UploadMatrix({t.down}, layer.down, "weights"));
    }
    RETURN_IF_ERROR(UploadFloats(core::RopeFrequencies(c), inv_freq_, "RoPE frequencies"));

    cache_.num_blocks = options.num_blocks;
    cache_.block_size = options.block_size;
    cache_.kv_heads = static_cast<int32_t>(c.num_kv_heads);
    cache_.head_dim = static_cast<int32_t>(c.head_dim);
    cache_.block_floats = c.num_kv_heads * options.block_size * c.head_dim;
    const size_t cache_bytes = static_cast<size_t>(c.num_layers) * 2 * options.num_blocks *
                               cache_.block_floats * sizeof(float);
    RETURN_IF_ERROR(cache_buffer_.Allocate(cache_bytes, "the KV cache"));
    cache_.base = cache_buffer_.get<float>();
    return absl::OkStatus();
  }

  std::string_view name() const override { return "cuda"; }
  int32_t num_blocks() const override { return static_cast<int32_t>(cache_.num_blocks); }
  int32_t block_size() const override { return cache_.block_size; }
  size_t kv_bytes_per_token() const override {
    return static_cast<size_t>(config_.num_layers) * 2 * config_.num_kv_heads * config_.head_dim *
           sizeof(float);
  }
  size_t kv_bytes() const override { return cache_buffer_.size(); }
  size_t weight_bytes() const override { return weight_bytes_; }

  void ScrubBlock(int32_t block) override {
    // Ordered before any later step by the stream; a failure is reported by the next Step.
    if (block < 0 || block >= cache_.num_blocks) return;
    const cudaError_t error = ScrubCacheBlock(cache_, config_.num_layers, block, stream_);
    if (error != cudaSuccess && scrub_error_.ok()) scrub_error_ = CudaStatus(error, "scrub");
  }

  absl::Status Step(std::span<const core::StepSequence> parts, core::StepResult& result) override {
    RETURN_IF_ERROR(scrub_error_);
    RETURN_IF_ERROR(core::CheckStep(parts, config_, num_blocks(), block_size()));
    StepUpload upload;
    RETURN_IF_ERROR(Upload(parts, upload));
    RETURN_IF_ERROR(RunLayers(upload));
    RETURN_IF_ERROR(ProjectOutputs(upload));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    const int64_t vocab = config_.vocab_size;
    const int64_t outputs = upload.outputs;
    const int64_t samples = upload.samples;
    result.ids.assign(pinned_out_.get<int32_t>(), pinned_out_.get<int32_t>() + outputs);
    result.logits.resize(samples * vocab);
    if (samples > 0) {
      std::memcpy(result.logits.data(), pinned_out_.get<float>() + outputs,
                  samples * vocab * sizeof(float));
    }
    return absl::OkStatus();
  }

 private:
  // A step's sizes and where each of its inputs lies in the uploaded buffer (device_in).
  struct StepUpload {
    int64_t n = 0;        // tokens
    int64_t outputs = 0;  // rows with logits
    int64_t samples = 0;  // of those, the rows the host samples
    int32_t* device_in = nullptr;
    size_t ids_at = 0, positions_at = 0, offsets_at = 0, rows_at = 0, argmax_at = 0,
           sampled_at = 0, tables_at = 0;
  };

  // The one upload: ids, positions, table offsets (one each per token), logit rows, argmax
  // flags (one each per output), the rows the host samples, then the block tables. Grows the
  // step buffers to fit.
  absl::Status Upload(std::span<const core::StepSequence> parts, StepUpload& step) {
    std::vector<int32_t> tables;
    std::vector<int32_t> ids, positions, offsets, logit_rows, argmax, sampled;
    for (const core::StepSequence& part : parts) {
      const int32_t offset = static_cast<int32_t>(tables.size());
      tables.insert(tables.end(), part.block_table.begin(), part.block_table.end());
      for (size_t i = 0; i < part.tokens.size(); ++i) {
        ids.push_back(part.tokens[i]);
        positions.push_back(static_cast<int32_t>(part.start_position + static_cast<int64_t>(i)));
        offsets.push_back(offset);
      }
      if (part.want_logits) {
        if (!part.argmax) sampled.push_back(static_cast<int32_t>(logit_rows.size()));
        logit_rows.push_back(static_cast<int32_t>(ids.size() - 1));
        argmax.push_back(part.argmax ? 1 : 0);
      }
    }
    step.n = static_cast<int64_t>(ids.size());
    step.outputs = static_cast<int64_t>(logit_rows.size());
    step.samples = static_cast<int64_t>(sampled.size());
    RETURN_IF_ERROR(
        Reserve(step.n, step.outputs, static_cast<int64_t>(tables.size()), step.samples));

    int32_t* upload = pinned_in_.get<int32_t>();
    size_t at = 0;
    auto put = [&](const std::vector<int32_t>& values) {
      std::memcpy(upload + at, values.data(), values.size() * sizeof(int32_t));
      const size_t start = at;
      at += values.size();
      return start;
    };
    step.ids_at = put(ids);
    step.positions_at = put(positions);
    step.offsets_at = put(offsets);
    step.rows_at = put(logit_rows);
    step.argmax_at = put(argmax);
    step.sampled_at = put(sampled);
    step.tables_at = put(tables);
    step.device_in = step_in_.get<int32_t>();
    return CudaStatus(cudaMemcpyAsync(step.device_in, upload, at * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync (step upload)");
  }

  // The embeddings and every decoder layer, leaving the residual stream in x_.
  absl::Status RunLayers(const StepUpload& step) {
    const core::ModelConfig& c = config_;
    const int64_t n = step.n;
    int32_t* device_in = step.device_in;
    StepIndex index{device_in + step.positions_at, device_in + step.offsets_at,
                    device_in + step.tables_at};
    const int64_t hidden = c.hidden_size;
    const int64_t ffn = c.intermediate_size;
    const int32_t heads = static_cast<int32_t>(c.num_heads);
    const float eps = static_cast<float>(c.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const int32_t window = static_cast<int32_t>(c.sliding_window.value_or(0));
    float* x = x_.get<float>();
    float* xn = xn_.get<float>();
    float* qkv = qkv_.get<float>();
    float* attn = attn_.get<float>();
    float* gate_up = gate_up_.get<float>();
    float* act = act_.get<float>();
    RETURN_IF_ERROR(Launch(EmbedRows(embed_.data.get(), embed_.type, device_in + step.ids_at, n,
                                     hidden, x, stream_),
                           "EmbedRows"));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const DeviceLayer& layer = layers_[l];
      RETURN_IF_ERROR(Launch(RmsNormRows(x, nullptr, n, hidden, layer.input_norm.get<float>(),
                                         eps, xn, stream_),
                             "RmsNormRows"));
      RETURN_IF_ERROR(Gemm(layer.qkv, xn, n, qkv, false));
      RETURN_IF_ERROR(Launch(BiasRopeStore(qkv, n, heads, layer.qkv_bias.get<float>(),
                                           inv_freq_.get<float>(), index, cache_, l, stream_),
                             "BiasRopeStore"));
      RETURN_IF_ERROR(Launch(
          PagedAttention(qkv, n, heads, scale, window, index, cache_, l, attn, stream_),
          "PagedAttention"));
      RETURN_IF_ERROR(Gemm(layer.o, attn, n, x, true));
      RETURN_IF_ERROR(Launch(RmsNormRows(x, nullptr, n, hidden, layer.post_norm.get<float>(), eps,
                                         xn, stream_),
                             "RmsNormRows"));
      RETURN_IF_ERROR(Gemm(layer.gate_up, xn, n, gate_up, false));
      RETURN_IF_ERROR(Launch(SiluMul(gate_up, n, ffn, act, stream_), "SiluMul"));
      RETURN_IF_ERROR(Gemm(layer.down, act, n, x, true));
    }
    return absl::OkStatus();
  }

  // Final norm and vocabulary projection for the output rows only, argmax on the device, and
  // the download of the ids and sampled rows into pinned_out_ (complete after a sync).
  absl::Status ProjectOutputs(const StepUpload& step) {
    const core::ModelConfig& c = config_;
    const int64_t outputs = step.outputs;
    if (outputs == 0) return absl::OkStatus();
    const int64_t samples = step.samples;
    const int64_t vocab = c.vocab_size;
    const size_t out_bytes = (outputs + samples * vocab) * sizeof(float);
    const float eps = static_cast<float>(c.rms_norm_eps);
    int32_t* device_in = step.device_in;
    float* x = x_.get<float>();
    float* final_rows = final_.get<float>();
    float* logits = logits_.get<float>();
    int32_t* out_ids = step_out_.get<int32_t>();
    float* out_logits = step_out_.get<float>() + outputs;
    RETURN_IF_ERROR(Launch(RmsNormRows(x, device_in + step.rows_at, outputs, c.hidden_size,
                                       final_norm_.get<float>(), eps, final_rows, stream_),
                           "RmsNormRows"));
    RETURN_IF_ERROR(Gemm(c.tie_word_embeddings ? embed_ : lm_head_, final_rows, outputs, logits,
                         false));
    RETURN_IF_ERROR(Launch(ArgmaxRows(logits, outputs, vocab, device_in + step.argmax_at, out_ids,
                                      stream_),
                           "ArgmaxRows"));
    RETURN_IF_ERROR(Launch(GatherRows(logits, device_in + step.sampled_at, samples, vocab,
                                      out_logits, stream_),
                           "GatherRows"));
    return CudaStatus(cudaMemcpyAsync(pinned_out_.get<void>(), step_out_.get(), out_bytes,
                                      cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync (step download)");
  }

  absl::Status Launch(cudaError_t error, std::string_view kernel) {
    return CudaStatus(error, kernel);
  }

  // Stacks `parts` by rows into `out`: as stored when the precision allows and they share a
  // 16-bit type, else float32 (converted on the device).
  absl::Status UploadMatrix(std::vector<const core::TensorView*> parts, DeviceMatrix& out,
                            std::string_view what) {
    out.cols = parts[0]->shape[1];
    out.rows = 0;
    for (const core::TensorView* part : parts) out.rows += part->shape[0];
    out.type = ToElementType(parts[0]->dtype);
    for (const core::TensorView* part : parts) {
      if (ToElementType(part->dtype) != out.type) out.type = ElementType::kF32;
    }
    if (precision_ == core::Precision::kF32) out.type = ElementType::kF32;
    const size_t element = ElementSize(out.type);
    RETURN_IF_ERROR(out.data.Allocate(static_cast<size_t>(out.rows) * out.cols * element, what));
    weight_bytes_ += out.data.size();
    size_t offset = 0;
    for (const core::TensorView* part : parts) {
      const ElementType from = ToElementType(part->dtype);
      uint8_t* target = out.data.get<uint8_t>() + offset;
      if (from == out.type) {
        RETURN_IF_ERROR(CudaStatus(cudaMemcpy(target, part->data.data(), part->data.size(),
                                              cudaMemcpyHostToDevice),
                                   "cudaMemcpy"));
      } else {
        DeviceBuffer staging;
        RETURN_IF_ERROR(staging.Allocate(part->data.size(), what));
        RETURN_IF_ERROR(CudaStatus(cudaMemcpy(staging.get(), part->data.data(), part->data.size(),
                                              cudaMemcpyHostToDevice),
                                   "cudaMemcpy"));
        RETURN_IF_ERROR(Launch(ConvertToFloat(staging.get(), from, part->count(),
                                              reinterpret_cast<float*>(target), stream_),
                               "ConvertToFloat"));
        RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
      }
      offset += static_cast<size_t>(part->count()) * element;
    }
    max_cols_ = std::max(max_cols_, out.cols);
    return absl::OkStatus();
  }

  // y[n, w.rows] (=|+=) x[n, w.cols] w^T, in cuBLAS's column-major terms y^T = w x^T.
  absl::Status Gemm(const DeviceMatrix& w, const float* x, int64_t n, float* y, bool accumulate) {
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    const int m = static_cast<int>(w.rows);
    const int k = static_cast<int>(w.cols);
    if (w.type == ElementType::kF32) {
      return CublasStatus(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, static_cast<int>(n), k,
                                      &alpha, w.data.get<float>(), k, x, k, &beta, y, m),
                          "cublasSgemm");
    }
    RETURN_IF_ERROR(Launch(ConvertFromFloat(x, n * w.cols, w.type, half_.get(), stream_),
                           "ConvertFromFloat"));
    const cudaDataType type = w.type == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
    return CublasStatus(
        cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, static_cast<int>(n), k, &alpha,
                     w.data.get(), type, k, half_.get(), type, k, &beta, y, CUDA_R_32F, m,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }

  // Grows the step buffers for n tokens, `outputs` logits rows and `table` block-table entries.
  absl::Status Reserve(int64_t n, int64_t outputs, int64_t table, int64_t samples) {
    const core::ModelConfig& c = config_;
    const int64_t q_dim = c.num_heads * c.head_dim;
    const int64_t qkv_rows = q_dim + 2 * c.num_kv_heads * c.head_dim;
    const size_t f = sizeof(float);
    const size_t in_words = 3 * n + 3 * outputs + table;
    RETURN_IF_ERROR(pinned_in_.Reserve(in_words * sizeof(int32_t)));
    RETURN_IF_ERROR(step_in_.Reserve(in_words * sizeof(int32_t), "step indices"));
    RETURN_IF_ERROR(x_.Reserve(n * c.hidden_size * f, "activations"));
    RETURN_IF_ERROR(xn_.Reserve(n * c.hidden_size * f, "activations"));
    RETURN_IF_ERROR(qkv_.Reserve(n * qkv_rows * f, "activations"));
    RETURN_IF_ERROR(attn_.Reserve(n * q_dim * f, "activations"));
    RETURN_IF_ERROR(gate_up_.Reserve(n * 2 * c.intermediate_size * f, "activations"));
    RETURN_IF_ERROR(act_.Reserve(n * c.intermediate_size * f, "activations"));
    RETURN_IF_ERROR(half_.Reserve(std::max(n, outputs) * max_cols_ * 2, "activations"));
    RETURN_IF_ERROR(final_.Reserve(outputs * c.hidden_size * f, "activations"));
    RETURN_IF_ERROR(logits_.Reserve(outputs * c.vocab_size * f, "logits"));
    const size_t out_bytes = (outputs + samples * c.vocab_size) * f;
    RETURN_IF_ERROR(step_out_.Reserve(out_bytes, "step output"));
    RETURN_IF_ERROR(pinned_out_.Reserve(out_bytes));
    return absl::OkStatus();
  }

  const core::ModelConfig& config_;
  core::Precision precision_ = core::Precision::kF32;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceMatrix embed_;
  DeviceMatrix lm_head_;
  DeviceBuffer final_norm_;
  DeviceBuffer inv_freq_;
  std::vector<DeviceLayer> layers_;
  size_t weight_bytes_ = 0;
  int64_t max_cols_ = 0;
  DeviceBuffer cache_buffer_;
  CacheGeometry cache_;
  absl::Status scrub_error_;
  // Step buffers.
  PinnedBuffer pinned_in_, pinned_out_;
  DeviceBuffer step_in_, step_out_, x_, xn_, qkv_, attn_, gate_up_, act_, half_, final_, logits_;
};

}  // namespace

absl::Status CudaLlmAvailable() {
  ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (count == 0) {
    return absl::FailedPreconditionError("no CUDA device: the driver reports 0 devices");
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MeasureDeviceReadBandwidth(size_t bytes, int passes) {
  RETURN_IF_ERROR(CudaLlmAvailable());
  int device = 0;
  int processors = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device),
      "cudaDeviceGetAttribute"));
  const int blocks = std::max(1, processors) * 8;
  DeviceBuffer data, partials;
  RETURN_IF_ERROR(data.Allocate(bytes, "the bandwidth probe"));
  RETURN_IF_ERROR(partials.Allocate(blocks * sizeof(uint32_t), "the bandwidth probe"));
  cudaEvent_t start = nullptr, stop = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&stop), "cudaEventCreate"));
  double best = 0;
  absl::Status status;
  for (int pass = 0; pass <= passes && status.ok(); ++pass) {  // pass 0 warms up
    status.Update(CudaStatus(cudaEventRecord(start, nullptr), "cudaEventRecord"));
    status.Update(CudaStatus(ReadAll(data.get(), static_cast<int64_t>(bytes / 16), blocks,
                                     partials.get<uint32_t>(), nullptr),
                             "ReadAll"));
    status.Update(CudaStatus(cudaEventRecord(stop, nullptr), "cudaEventRecord"));
    status.Update(CudaStatus(cudaEventSynchronize(stop), "cudaEventSynchronize"));
    float milliseconds = 0;
    status.Update(CudaStatus(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime"));
    if (pass > 0 && milliseconds > 0) best = std::max(best, bytes / (milliseconds * 1e-3));
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  RETURN_IF_ERROR(status);
  return best;
}

absl::StatusOr<std::unique_ptr<core::StepEngine>> CreateCudaLlmEngine(
    const core::Model& model, const core::CheckpointFiles& files,
    const core::EngineOptions& options) {
  RETURN_IF_ERROR(CudaLlmAvailable());
  auto engine = std::make_unique<CudaLlmEngine>(model);
  RETURN_IF_ERROR(engine->Init(files, options));
  return std::unique_ptr<core::StepEngine>(std::move(engine));
}

}  // namespace cloister::gpu::llm

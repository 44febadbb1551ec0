// Functional checks of two shared models (see the models README): the PP-OCRv4 recogniser must
// read its reference crop as the right text, and Silero VAD run as a stream over the whole
// speech sample must find the speech where it is. These check what a user sees, on top of the
// element-wise comparisons with the reference outputs that onnx-conformance does.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "base/file.h"
#include "enclave/runtime/model.h"
#include "enclave/runtime/onnx_tensor.h"
#include "enclave/runtime/runtime_test_helpers.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"

namespace cloister::runtime {
namespace {

const std::string kModels = CLOISTER_MODELS_DIR;

std::unique_ptr<Model> LoadModel(const std::string& relative_path) {
  auto bytes = ReadFile(kModels + "/" + relative_path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return nullptr;
  auto model = Model::Load(AsBytes(*bytes));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

Tensor ReadTensorFile(const std::string& relative_path) {
  auto bytes = ReadFile(kModels + "/" + relative_path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  onnx::TensorProto proto;
  EXPECT_TRUE(bytes.ok() && proto.ParseFromString(*bytes)) << relative_path;
  auto tensor = TensorFromProto(proto);
  EXPECT_TRUE(tensor.ok()) << tensor.status();
  return tensor.ok() ? std::move(tensor).value() : Tensor();
}

// ---------------------------------------------------------------------------------------------
// OCR: greedy CTC decoding of the recogniser's posteriors.

// Lines of the PaddleOCR dictionary; class i in 1..lines is line i, lines + 1 is a space, 0 the
// CTC blank.
std::vector<std::string> ReadDictionary() {
  std::ifstream file(kModels + "/ocr/ppocr_keys_v1.txt");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(file, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

// Argmax per time step, repeats collapsed, blanks dropped.
std::string GreedyCtcDecode(const Tensor& posteriors, const std::vector<std::string>& dictionary) {
  const int64_t steps = posteriors.dim(1);
  const int64_t classes = posteriors.dim(2);
  const float* data = posteriors.data<float>();
  std::string text;
  int64_t previous = -1;
  for (int64_t t = 0; t < steps; ++t) {
    const float* row = data + t * classes;
    const int64_t best = std::max_element(row, row + classes) - row;
    if (best != previous && best != 0) {
      if (best <= static_cast<int64_t>(dictionary.size())) {
        text += dictionary[best - 1];
      } else {
        text += ' ';
      }
    }
    previous = best;
  }
  return text;
}

TEST(OcrTest, RecogniserReadsHelloWorld2026) {
  const std::vector<std::string> dictionary = ReadDictionary();
  ASSERT_EQ(dictionary.size(), 6623u);
  std::unique_ptr<Model> model = LoadModel("ocr/ch_PP-OCRv4_rec_infer.onnx");
  ASSERT_NE(model, nullptr);
  Tensor crop = ReadTensorFile("testdata/ch_PP-OCRv4_rec/test_data_set_0/input_0.pb");
  ASSERT_EQ(crop.shape(), (std::vector<int64_t>{1, 3, 48, 320}));
  auto outputs = model->Run({{model->inputs()[0].name, crop}});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const Tensor& posteriors = (*outputs)[0].second;
  ASSERT_EQ(posteriors.rank(), 3);
  ASSERT_EQ(posteriors.dim(2), 6625);
  EXPECT_EQ(GreedyCtcDecode(posteriors, dictionary), "Hello World 2026");
}

// ---------------------------------------------------------------------------------------------
// VAD: the whole speech sample as a stream of 32 ms chunks.

// Mono 16-bit PCM samples of a RIFF/WAVE file, scaled to [-1, 1), and its sample rate.
struct Audio {
  std::vector<float> samples;
  int sample_rate = 0;
};

Audio ReadWave(const std::string& path) {
  Audio audio;
  auto bytes = ReadFile(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return audio;
  const std::string& data = *bytes;
  auto u16 = [&](size_t at) {
    return static_cast<uint32_t>(static_cast<uint8_t>(data[at])) |
           static_cast<uint32_t>(static_cast<uint8_t>(data[at + 1])) << 8;
  };
  auto u32 = [&](size_t at) { return u16(at) | u16(at + 2) << 16; };
  EXPECT_TRUE(data.size() >= 12 && data.compare(0, 4, "RIFF") == 0 &&
              data.compare(8, 4, "WAVE") == 0);
  int channels = 0, bits = 0;
  for (size_t at = 12; at + 8 <= data.size();) {
    const std::string id = data.substr(at, 4);
    const size_t length = u32(at + 4);
    const size_t body = at + 8;
    if (body + length > data.size()) break;
    if (id == "fmt ") {
      channels = static_cast<int>(u16(body + 2));
      audio.sample_rate = static_cast<int>(u32(body + 4));
      bits = static_cast<int>(u16(body + 14));
    } else if (id == "data") {
      for (size_t i = body; i + 1 < body + length; i += 2) {
        audio.samples.push_back(static_cast<float>(static_cast<int16_t>(u16(i))) / 32768.0f);
      }
    }
    at = body + length + (length & 1);
  }
  EXPECT_EQ(channels, 1);
  EXPECT_EQ(bits, 16);
  return audio;
}

// Linear interpolation onto a 16 kHz grid, as the samples were made (numpy.interp over
// numpy.arange(0, duration, 1/16000)): points past the last input sample take its value.
std::vector<float> ResampleTo16k(const Audio& audio) {
  const double rate = audio.sample_rate;
  const size_t n = audio.samples.size();
  const double step = 1.0 / 16000.0;
  const size_t count = static_cast<size_t>(std::ceil((n / rate) / step));
  std::vector<float> out(count);
  for (size_t k = 0; k < count; ++k) {
    const double position = k * step * rate;
    const size_t i = static_cast<size_t>(position);
    if (i + 1 >= n) {
      out[k] = audio.samples[n - 1];
      continue;
    }
    const double fraction = position - i;
    out[k] =
        static_cast<float>(audio.samples[i] + (audio.samples[i + 1] - audio.samples[i]) * fraction);
  }
  return out;
}

TEST(VadTest, FindsSpeechFromAbout1_06To6_82Seconds) {
  constexpr int kChunk = 512;   // new samples per call: 32 ms at 16 kHz
  constexpr int kContext = 64;  // samples carried over from the previous chunk
  constexpr float kThreshold = 0.5f;
  constexpr double kChunkSeconds = kChunk / 16000.0;

  Audio audio = ReadWave(kModels + "/samples/speech22k.wav");
  ASSERT_EQ(audio.sample_rate, 22050);
  ASSERT_GT(audio.samples.size(), 22050u);
  // 1 s of silence on each side, as in the reference sets.
  std::vector<float> stream(16000, 0.0f);
  const std::vector<float> speech = ResampleTo16k(audio);
  stream.insert(stream.end(), speech.begin(), speech.end());
  stream.insert(stream.end(), 16000, 0.0f);

  std::unique_ptr<Model> model = LoadModel("vad/silero_vad_op18_ifless.onnx");
  ASSERT_NE(model, nullptr);
  auto sample_rate = Tensor::FromVector<int64_t>({}, {16000});
  auto state = Tensor::Create(DataType::kFloat, {2, 1, 128});
  ASSERT_TRUE(sample_rate.ok() && state.ok());
  Tensor carried_state = *state;

  std::vector<float> window(kContext + kChunk, 0.0f);
  std::vector<float> probabilities;
  for (size_t start = 0; start + kChunk <= stream.size(); start += kChunk) {
    // The last kContext samples of the previous window become this one's context.
    std::copy(window.end() - kContext, window.end(), window.begin());
    std::copy(stream.begin() + start, stream.begin() + start + kChunk, window.begin() + kContext);
    auto input = Tensor::FromVector<float>({1, kContext + kChunk}, window);
    ASSERT_TRUE(input.ok());
    auto outputs = model->Run({{"input", *input}, {"sr", *sample_rate}, {"state", carried_state}},
                              {"output", "stateN"});
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    probabilities.push_back((*outputs)[0].second.data<float>()[0]);
    carried_state = (*outputs)[1].second;
  }
  ASSERT_GT(probabilities.size(), 200u);
  // The reference sets: the first chunk is silence, chunk 62 (about 2 s) is speech.
  EXPECT_LT(probabilities[0], 0.1f);
  EXPECT_GT(probabilities[62], 0.9f);

  const auto first = std::find_if(probabilities.begin(), probabilities.end(),
                                  [&](float p) { return p >= kThreshold; });
  ASSERT_NE(first, probabilities.end()) << "no speech found";
  const auto last = std::find_if(probabilities.rbegin(), probabilities.rend(),
                                 [&](float p) { return p >= kThreshold; });
  const double speech_start = (first - probabilities.begin()) * kChunkSeconds;
  const double speech_end = (probabilities.rend() - last) * kChunkSeconds;
  std::printf("speech from %.3f s to %.3f s (p >= %.2f, %zu chunks)\n", speech_start, speech_end,
              kThreshold, probabilities.size());
  // Within two chunks of the times the README gives.
  EXPECT_NEAR(speech_start, 1.06, 2 * kChunkSeconds);
  EXPECT_NEAR(speech_end, 6.82, 2 * kChunkSeconds);
}

// ---------------------------------------------------------------------------------------------
// Intra-op threads: a model loaded with two threads splits its convolutions and matrix products
// over them (LoadOptions::threads) and must give what one thread gives.

void ExpectSameWithTwoThreads(const std::string& relative_path,
                              const std::vector<std::pair<std::string, Tensor>>& inputs) {
  auto bytes = ReadFile(kModels + "/" + relative_path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  SCOPED_TRACE(relative_path);
  ExpectSameWithOneAndTwoThreads(*bytes, inputs, 1e-5f);
}

// An image model's one float input `x`, filled with a fixed pattern in [-1, 1).
void ExpectSameWithTwoThreads(const std::string& relative_path, std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>((i * 7919) % 1000) / 500 - 1;
  auto x = Tensor::FromVector(shape, values);
  ASSERT_TRUE(x.ok()) << x.status();
  ExpectSameWithTwoThreads(relative_path, {{"x", *x}});
}

TEST(IntraOpThreadsTest, TwoThreadsGiveWhatOneGives) {
  ExpectSameWithTwoThreads("ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx", {4, 3, 48, 192});
  ExpectSameWithTwoThreads("ocr/ch_PP-OCRv4_rec_infer.onnx", {2, 3, 48, 320});
  ExpectSameWithTwoThreads("ocr/ch_PP-OCRv4_rec_infer.onnx", {1, 3, 48, 320});  // one image
  // A text encoder: products with fused bias and Gelu, batched attention products, the mask's
  // Where, Softmax and LayerNormalization, all split over the two threads. The second sentence
  // ends in padding.
  constexpr int64_t kBatch = 2, kTokens = 128;
  std::vector<int64_t> ids(kBatch * kTokens), mask(kBatch * kTokens, 1), types(kBatch * kTokens);
  for (int64_t i = 0; i < kBatch * kTokens; ++i) ids[i] = 1 + (i * 7919) % 1000;
  for (int64_t t = 100; t < kTokens; ++t) mask[kTokens + t] = 0;
  auto as_tensor = [](const std::vector<int64_t>& values) {
    return *Tensor::FromVector<int64_t>({kBatch, kTokens}, values);
  };
  ExpectSameWithTwoThreads("bert_mini/bert_mini_l4_h256.onnx", {{"input_ids", as_tensor(ids)},
                                                                {"attention_mask", as_tensor(mask)},
                                                                {"token_type_ids", as_tensor(types)}});
}

}  // namespace
}  // namespace cloister::runtime

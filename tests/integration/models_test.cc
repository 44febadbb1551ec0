// End-to-end runs of every shared model (models/README.md) through the whole appliance as a
// user runs it: cloisterd (with the real cloister-enclave) on a loopback port, the `cloister`
// CLI to create a key, attest, upload the model and infer, and the tensor-to-npy tool to turn
// the reference inputs (ONNX TensorProto files) into .npy files. Every reference set must come
// back within the suite's tolerance |a-b| <= 1e-3 + 1e-3*|b|. The device runs PCIe mode
// emulated, so every batch crosses to the executor sealed: on a machine with a GPU (executor
// auto takes CUDA) it is decrypted by the device's GCM kernels, on the CPU by the executor side.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sdk/npy.h"
#include "tests/support/appliance.h"
#include "tests/support/process.h"
#include "tests/support/tensor_files.h"

namespace cloister::testing {
namespace {

namespace fs = std::filesystem;

const std::string kModels = std::string(CLOISTER_SHARED_DIR) + "/models";

struct SharedModel {
  std::string name;        // testdata folder and the name it is uploaded under
  std::string model_file;  // relative to kModels
};

std::ostream& operator<<(std::ostream& out, const SharedModel& model) { return out << model.name; }

// Files PREFIX_0.pb, PREFIX_1.pb, ... of a reference set, in order.
std::vector<std::string> NumberedFiles(const std::string& set_dir, const std::string& prefix) {
  std::vector<std::string> files;
  for (int k = 0;; ++k) {
    std::string path = absl::StrCat(set_dir, "/", prefix, "_", k, ".pb");
    if (!fs::exists(path)) break;
    files.push_back(path);
  }
  return files;
}

class ModelsTest : public ::testing::TestWithParam<SharedModel> {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("cloister-models");
    const std::string config = work_ + "/cloisterd.yaml";
    std::ofstream(config) << "operator:\n  listen: 127.0.0.1:0\n"
                          << "devices:\n  - name: dev0\n    pcie_mode: emulated\n";
    appliance_ = std::make_unique<Appliance>(CLOISTERD_BINARY, work_ + "/data",
                                             std::vector<std::string>{"--config", config});
    ASSERT_TRUE(appliance_->Start().ok()) << appliance_->Logs();
    EXPECT_NE(appliance_->Logs().find(R"("event":"pcie_path","mode":"emulated")"),
              std::string::npos)
        << appliance_->Logs();
    key_ = work_ + "/tenant.key";
    RunResult keygen = Cli({"keygen", "--key", key_});
    ASSERT_EQ(keygen.exit_code, 0) << keygen.err;
  }
  void TearDown() override {
    if (appliance_) appliance_->Stop();
  }

  RunResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), CLOISTER_CLI_BINARY);
    std::map<std::string, std::string> env = {
        {"CLOISTER_SERVER", appliance_->address()},
        {"CLOISTER_POLICY", appliance_->data_dir() + "/dev-policy.yaml"},
        {"CLOISTER_TENANT", "demo"},
        {"CLOISTER_TOKEN_FILE", appliance_->data_dir() + "/demo.token"},
        {"CLOISTER_KEY", key_}};
    return testing::Run(args, env, absl::Seconds(120));
  }

  std::string work_, key_;
  std::unique_ptr<Appliance> appliance_;
};

TEST_P(ModelsTest, EveryReferenceSetMatchesThroughTheAppliance) {
  const SharedModel& model = GetParam();
  RunResult attest = Cli({"attest"});
  ASSERT_EQ(attest.exit_code, 0) << attest.out << attest.err;
  RunResult upload =
      Cli({"upload", "--model", kModels + "/" + model.model_file, "--name", model.name});
  ASSERT_EQ(upload.exit_code, 0) << upload.out << upload.err;

  const std::string data_dir = kModels + "/testdata/" + model.name;
  std::vector<std::string> sets;
  for (const auto& entry : fs::directory_iterator(data_dir)) {
    if (entry.is_directory()) sets.push_back(entry.path().string());
  }
  std::sort(sets.begin(), sets.end());
  ASSERT_FALSE(sets.empty()) << data_dir;

  for (const std::string& set : sets) {
    SCOPED_TRACE(set);
    const std::string set_name = fs::path(set).filename().string();
    std::vector<std::string> infer = {"infer", "--model", model.name};
    const std::vector<std::string> inputs = NumberedFiles(set, "input");
    ASSERT_FALSE(inputs.empty());
    for (size_t k = 0; k < inputs.size(); ++k) {
      // The reference files name the graph input they feed.
      std::string input_name;
      ASSERT_TRUE(ReadTensorProtoFile(inputs[k], &input_name).ok()) << inputs[k];
      ASSERT_FALSE(input_name.empty()) << inputs[k];
      const std::string npy = absl::StrCat(work_, "/", set_name, "_input_", k, ".npy");
      RunResult convert = testing::Run({TENSOR_TO_NPY_BINARY, inputs[k], npy});
      ASSERT_EQ(convert.exit_code, 0) << convert.err;
      infer.push_back("--input");
      infer.push_back(input_name + "=" + npy);
    }
    const std::string out_dir = absl::StrCat(work_, "/", set_name, "_out");
    infer.push_back("--output-dir");
    infer.push_back(out_dir);
    RunResult result = Cli(infer);
    ASSERT_EQ(result.exit_code, 0) << result.out << result.err;

    const std::vector<std::string> outputs = NumberedFiles(set, "output");
    ASSERT_FALSE(outputs.empty());
    for (const std::string& output : outputs) {
      std::string output_name;
      auto expected = ReadTensorProtoFile(output, &output_name);
      ASSERT_TRUE(expected.ok()) << expected.status();
      auto actual = sdk::ReadNpyFile(out_dir + "/" + output_name + ".npy");
      ASSERT_TRUE(actual.ok()) << actual.status();
      EXPECT_EQ(CompareArrays(*actual, *expected, 1e-3, 1e-3), "") << "output " << output_name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    SharedModels, ModelsTest,
    ::testing::Values(SharedModel{"ch_ppocr_mobile_v2.0_cls",
                                  "ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx"},
                      SharedModel{"ch_PP-OCRv4_rec", "ocr/ch_PP-OCRv4_rec_infer.onnx"},
                      SharedModel{"silero_vad_op18_ifless", "vad/silero_vad_op18_ifless.onnx"},
                      SharedModel{"bert_mini_l4_h256", "bert_mini/bert_mini_l4_h256.onnx"}),
    [](const ::testing::TestParamInfo<SharedModel>& info) {
      std::string name;
      for (char c : info.param.name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

}  // namespace
}  // namespace cloister::testing

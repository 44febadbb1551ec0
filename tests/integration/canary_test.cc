// The canary scan (THREAT_MODEL.md section 2): markers planted in a tenant's model, its inputs
// and the outputs the model computes are searched for, after a full session through the real
// cloisterd and cloister-enclave, in everything the host side holds: every file of the data
// dir (stored models, audit log, receipts, keys), the logs of cloisterd and its workers, the
// /metrics page, and a core dump of the running cloisterd taken with gcore. None may be found:
// the host only ever sees ciphertext. As a control that the dump and the scan can find a
// marker at all, the same scan over a core dump of the enclave worker, which holds the loaded
// model in the clear, must find the model's weights.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/bytes.h"
#include "host/tenants/tenant_registry.h"
#include "onnx/onnx_pb.h"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "sdk/npy.h"
#include "tests/support/appliance.h"
#include "tests/support/neg_add_model.h"
#include "tests/support/http.h"
#include "tests/support/process.h"

namespace cloister {
namespace {

constexpr int kWidth = 16;  // floats per marker: 64 bytes, far beyond any chance match

// kWidth floats in [1, 2) from a seeded generator: values no other part of the system makes.
std::vector<float> MarkerFloats(uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(1.0f, 2.0f);
  std::vector<float> values(kWidth);
  for (float& value : values) value = distribution(generator);
  return values;
}

std::string BytesOf(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// Y = Neg(X), Z = Add(X, W) (tests/support/neg_add_model.h) over float[n, kWidth], with W the
// model's marker weights and the model's text marker in its doc string, metadata and the name
// of its graph.
std::string WriteCanaryModel(const std::string& path, const std::vector<float>& weights,
                             const std::string& text_marker) {
  onnx::ModelProto model = testing::NegAndAddModel(weights);
  model.set_doc_string(absl::StrCat("confidential: ", text_marker));
  auto* property = model.add_metadata_props();
  property->set_key("owner-note");
  property->set_value(text_marker);
  model.mutable_graph()->set_name(text_marker);
  std::ofstream out(path, std::ios::binary);
  EXPECT_TRUE(model.SerializeToOstream(&out));
  return path;
}

// The names of the markers in `haystack_path` (read in pieces, so a core dump of any size
// works), or an error line when the file cannot be read.
std::vector<std::string> MarkersInFile(const std::string& haystack_path,
                                       const std::map<std::string, std::string>& markers) {
  std::vector<std::string> found;
  std::ifstream in(haystack_path, std::ios::binary);
  if (!in) return {"(cannot read " + haystack_path + ")"};
  size_t longest = 0;
  for (const auto& [name, bytes] : markers) longest = std::max(longest, bytes.size());
  constexpr size_t kPiece = 8 << 20;
  std::string window;
  std::vector<char> piece(kPiece);
  std::map<std::string, bool> seen;
  while (in) {
    in.read(piece.data(), piece.size());
    window.append(piece.data(), static_cast<size_t>(in.gcount()));
    for (const auto& [name, bytes] : markers) {
      if (!seen[name] && window.find(bytes) != std::string::npos) seen[name] = true;
    }
    // Keep a tail shorter than any marker, so a marker across two pieces is still seen.
    if (window.size() > longest) window.erase(0, window.size() - (longest - 1));
  }
  for (const auto& [name, was_seen] : seen) {
    if (was_seen) found.push_back(name);
  }
  return found;
}

std::vector<std::string> MarkersInText(const std::string& text,
                                       const std::map<std::string, std::string>& markers) {
  std::vector<std::string> found;
  for (const auto& [name, bytes] : markers) {
    if (text.find(bytes) != std::string::npos) found.push_back(name);
  }
  return found;
}

// Why the core dump scans cannot run in this build, or "" when they can. A process built with
// AddressSanitizer maps terabytes of shadow memory, and gcore writes tens of gigabytes of it.
std::string WhyNoCoreDumps() {
#if defined(CLOISTER_SANITIZED)
  return "this is a sanitizer build: a core dump of an ASan process is tens of GB of shadow "
         "memory (run the canary scan in the default build)";
#else
  return "";
#endif
}

// gcore's path, or "" when gdb is not installed.
std::string GcorePath() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    const std::string path = std::string(dir) + "/gcore";
    if (std::filesystem::exists(path)) return path;
  }
  return "";
}

// Core dumps are large: removed, unless CLOISTER_TEST_KEEP_CORE is set (to look into a
// finding: the dump opens in gdb beside the binary it came from).
void KeepOrRemove(const std::string& core) {
  if (std::getenv("CLOISTER_TEST_KEEP_CORE") != nullptr) {
    std::cout << "core dump kept: " << core << "\n";
  } else {
    std::filesystem::remove(core);
  }
}

// gcore's dump of process `pid`, or "" (with the reason in `why`).
std::string CoreDumpOf(pid_t pid, const std::string& prefix, std::string* why) {
  testing::RunResult result =
      testing::Run({GcorePath(), "-o", prefix, std::to_string(pid)}, {}, absl::Seconds(120));
  const std::string path = absl::StrCat(prefix, ".", pid);
  if (result.exit_code != 0 || !std::filesystem::exists(path)) {
    *why = absl::StrCat("gcore ", pid, " failed (exit ", result.exit_code, "): ", result.err);
    return "";
  }
  return path;
}

// One tenant's planted data: the model's text and weights, an input, the two outputs the
// model computes from it, and the model's name; each marker unique to `seed`.
struct Canary {
  explicit Canary(uint32_t seed)
      : name(absl::StrCat("canary-name-", seed)),
        text(absl::StrCat("CANARY-TEXT-", seed, "-tenant-secret")),
        weights(MarkerFloats(seed * 3 + 1)),
        input(MarkerFloats(seed * 3 + 2)),
        negated(kWidth),
        summed(kWidth) {
    for (int i = 0; i < kWidth; ++i) {
      negated[i] = -input[i];
      summed[i] = input[i] + weights[i];
    }
  }
  std::map<std::string, std::string> Markers() const {
    return {{"model text", text},        {"model weights", BytesOf(weights)},
            {"input", BytesOf(input)},   {"output y", BytesOf(negated)},
            {"output z", BytesOf(summed)}, {"model name", name}};
  }
  std::string name, text;
  std::vector<float> weights, input, negated, summed;
};

std::unique_ptr<sdk::Client> Connect(const testing::Appliance& appliance,
                                     const std::string& tenant, const std::string& token) {
  auto client = sdk::Client::Connect(appliance.TenantOptions(tenant, token));
  EXPECT_TRUE(client.ok()) << tenant << ": " << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Uploads the canary's model and runs it `calls` times, checking that the outputs really carry
// the output markers (so that their absence elsewhere means something).
void RunCanarySession(sdk::Client& client, const Canary& canary, const std::string& work,
                      int calls) {
  const std::string model_path =
      WriteCanaryModel(absl::StrCat(work, "/", canary.name, ".onnx"), canary.weights, canary.text);
  auto uploaded = client.UploadModel(model_path, canary.name);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  sdk::NpyArray array;
  array.datatype = "FP32";
  array.shape = {1, kWidth};
  const std::string input = BytesOf(canary.input);
  array.data.assign(input.begin(), input.end());
  for (int call = 0; call < calls; ++call) {
    auto outputs = client.Infer(canary.name, {sdk::ToTensor("x", array)});
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    ASSERT_EQ(outputs->size(), 2u);
    for (const auto& tensor : *outputs) {
      auto decoded = sdk::FromTensor(tensor);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      const std::string bytes(decoded->data.begin(), decoded->data.end());
      EXPECT_EQ(bytes, BytesOf(tensor.name() == "y" ? canary.negated : canary.summed))
          << tensor.name();
    }
  }
  ASSERT_TRUE(client.ListModels().ok());
}

TEST(CanaryTest, NoPlantedMarkerReachesTheHostDiskLogsMetricsOrMemory) {
  if (GcorePath().empty()) {
    GTEST_SKIP() << "gcore (Debian package gdb) is not installed: the core dump scan cannot run";
  }
  if (!WhyNoCoreDumps().empty()) GTEST_SKIP() << WhyNoCoreDumps();
  const std::string work = testing::MakeTempDir("cloister-canary");
  const std::string config = work + "/cloisterd.yaml";
  std::ofstream(config) << "operator:\n  listen: 127.0.0.1:0\n";
  testing::Appliance appliance(CLOISTERD_BINARY, work + "/data", {"--config", config});
  const absl::Status started = appliance.Start();
  ASSERT_TRUE(started.ok()) << started;

  // A full session: attest, upload, infer several times, list, and keep the model loaded.
  const Canary canary(7411);
  const std::map<std::string, std::string> markers = canary.Markers();
  std::string token = testing::ReadWholeFile(appliance.data_dir() + "/demo.token");
  while (!token.empty() && token.back() == '\n') token.pop_back();
  std::unique_ptr<sdk::Client> client = Connect(appliance, "demo", token);
  ASSERT_NE(client, nullptr);
  RunCanarySession(*client, canary, work, 5);
  if (HasFatalFailure()) return;

  // Everything the host side holds.
  std::map<std::string, std::vector<std::string>> findings;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(appliance.data_dir())) {
    if (!entry.is_regular_file()) continue;
    for (const std::string& name : MarkersInFile(entry.path().string(), markers)) {
      findings[entry.path().string()].push_back(name);
    }
  }
  int data_files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(appliance.data_dir())) {
    data_files += entry.is_regular_file();
  }
  EXPECT_GE(data_files, 3) << "the data dir should hold at least the model, keys and logs";
  for (const std::string& name : MarkersInText(appliance.Logs(), markers)) {
    findings["cloisterd and worker logs"].push_back(name);
  }
  const std::string metrics = testing::HttpGet(appliance.metrics_address(), "/metrics");
  EXPECT_NE(metrics.find("cloister_requests_total"), std::string::npos) << metrics;
  for (const std::string& name : MarkersInText(metrics, markers)) {
    findings["/metrics"].push_back(name);
  }
  std::string why;
  const std::string host_core = CoreDumpOf(appliance.pid(), work + "/cloisterd.core", &why);
  ASSERT_FALSE(host_core.empty()) << why;
  EXPECT_GT(std::filesystem::file_size(host_core), 1u << 20) << "a core dump of a live process";
  for (const std::string& name : MarkersInFile(host_core, markers)) {
    findings["core dump of cloisterd"].push_back(name);
  }
  std::string report;
  for (const auto& [where, names] : findings) {
    absl::StrAppend(&report, "\n  ", where, ": ", absl::StrJoin(names, ", "));
  }
  EXPECT_TRUE(findings.empty()) << "tenant plaintext found on the host side:" << report;

  // Control: the enclave worker holds the loaded model in the clear, and the same dump and
  // scan find its weights there.
  const std::vector<pid_t> workers = appliance.WorkerPids();
  ASSERT_EQ(workers.size(), 1u);
  const std::string worker_core = CoreDumpOf(workers[0], work + "/enclave.core", &why);
  ASSERT_FALSE(worker_core.empty()) << why;
  const std::vector<std::string> in_worker = MarkersInFile(worker_core, markers);
  std::cout << "markers in the enclave worker's core dump (expected there): "
            << absl::StrJoin(in_worker, ", ") << "\n";
  EXPECT_NE(std::find(in_worker.begin(), in_worker.end(), "model weights"), in_worker.end())
      << "the scan did not find the model's weights in the enclave worker's memory: "
      << absl::StrJoin(in_worker, ", ");
  KeepOrRemove(host_core);
  KeepOrRemove(worker_core);
}

// Remanence across tenants inside the enclave: tenant acme runs a session and deletes its
// model, tenant globex then runs its own (reusing whatever memory the worker frees and
// reallocates). A core dump of the worker taken then may hold none of acme's plaintext: not
// its model, not its inputs, not the outputs computed from them. globex's loaded model is
// found in the same dump (the control).
TEST(CanaryTest, AnotherTenantsPlaintextIsGoneFromTheEnclaveWorker) {
  if (GcorePath().empty()) {
    GTEST_SKIP() << "gcore (Debian package gdb) is not installed: the core dump scan cannot run";
  }
  if (!WhyNoCoreDumps().empty()) GTEST_SKIP() << WhyNoCoreDumps();
  const std::string work = testing::MakeTempDir("cloister-remanence");
  const std::string config = work + "/cloisterd.yaml";
  const std::string acme_token = "acme-token-0123456789abcdef";
  const std::string globex_token = "globex-token-0123456789abcdef";
  std::ofstream(config) << "tenants:\n"
                        << "  - id: acme\n    token_sha256: "
                        << HexEncode(host::TokenHash(acme_token)) << "\n"
                        << "  - id: globex\n    token_sha256: "
                        << HexEncode(host::TokenHash(globex_token)) << "\n";
  testing::Appliance appliance(CLOISTERD_BINARY, work + "/data", {"--config", config});
  const absl::Status started = appliance.Start();
  ASSERT_TRUE(started.ok()) << started;

  const Canary acme_canary(9001), globex_canary(9002);
  {
    std::unique_ptr<sdk::Client> acme = Connect(appliance, "acme", acme_token);
    ASSERT_NE(acme, nullptr);
    RunCanarySession(*acme, acme_canary, work, 8);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(acme->DeleteModel(acme_canary.name).ok());
  }
  std::unique_ptr<sdk::Client> globex = Connect(appliance, "globex", globex_token);
  ASSERT_NE(globex, nullptr);
  RunCanarySession(*globex, globex_canary, work, 8);
  if (HasFatalFailure()) return;

  const std::vector<pid_t> workers = appliance.WorkerPids();
  ASSERT_EQ(workers.size(), 1u);
  std::string why;
  const std::string core = CoreDumpOf(workers[0], work + "/enclave.core", &why);
  ASSERT_FALSE(core.empty()) << why;
  const std::vector<std::string> acme_left = MarkersInFile(core, acme_canary.Markers());
  EXPECT_TRUE(acme_left.empty()) << "acme's plaintext is still in the enclave worker's memory: "
                                 << absl::StrJoin(acme_left, ", ");
  const std::vector<std::string> globex_found = MarkersInFile(core, globex_canary.Markers());
  EXPECT_NE(std::find(globex_found.begin(), globex_found.end(), "model weights"),
            globex_found.end())
      << "control: globex's loaded model is not in the dump: " << absl::StrJoin(globex_found, ", ");
  KeepOrRemove(core);
}

}  // namespace
}  // namespace cloister

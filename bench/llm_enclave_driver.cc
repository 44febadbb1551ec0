#include "bench/llm_enclave_driver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attest/policy.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "nlohmann/json.hpp"
#include "sdk/model_dir.h"
#include "tests/support/temp_dir.h"

namespace cloister::bench {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

api::v1::GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  api::v1::GenerateRequest request;
  request.mutable_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  request.mutable_sampling()->set_temperature(0);
  request.set_max_tokens(max_tokens);
  request.set_ignore_eos(true);
  return request;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * (values.size() - 1) + 0.5))];
}

// The frames the enclave streams, with their arrival times, for the benchmark's thread.
class LlmEnclaveDriver::Sink : public enclave::FrameSink {
 public:
  void Write(const EnclaveToHost& frame) override {
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    frames_.emplace_back(frame, now);
  }
  std::deque<std::pair<EnclaveToHost, absl::Time>> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !frames_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&any), timeout);
    std::deque<std::pair<EnclaveToHost, absl::Time>> out;
    out.swap(frames_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::deque<std::pair<EnclaveToHost, absl::Time>> frames_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<LlmEnclaveDriver>> LlmEnclaveDriver::Create(
    const std::string& models_dir, enclave::EnclaveOptions options,
    const std::vector<std::string>& tenants, const std::string& model_dir) {
  const std::string tiny_dir = models_dir + "/llm/tiny-llama";
  const std::string dir = testing::MakeTempDir("cloister-llm-bench");
  options.sim_dir = dir + "/sim";
  options.dev_policy_out = dir + "/dev-policy.yaml";
  options.measurement = crypto::Sha384(AsBytes("llm bench"));
  std::unique_ptr<LlmEnclaveDriver> driver(new LlmEnclaveDriver());
  driver->sink_ = std::make_shared<Sink>();
  ASSIGN_OR_RETURN(driver->enclave_, enclave::Enclave::Create(std::move(options)));
  ASSIGN_OR_RETURN(attest::v1::Policy policy, attest::LoadPolicyFile(dir + "/dev-policy.yaml"));
  ASSIGN_OR_RETURN(Bytes package,
                   sdk::PackModelDir(model_dir.empty() ? tiny_dir : model_dir, uint64_t{1} << 30));
  ASSIGN_OR_RETURN(std::string references, ReadFile(tiny_dir + "/reference.json", 16 << 20));
  const nlohmann::json parsed = nlohmann::json::parse(references, nullptr, false);
  if (parsed.is_discarded() || !parsed.contains("prompts")) {
    return absl::InvalidArgumentError(absl::StrCat(tiny_dir, "/reference.json has no prompts"));
  }
  for (const auto& prompt : parsed["prompts"]) {
    driver->prompts_.push_back(prompt["prompt_ids"].get<std::vector<int32_t>>());
  }
  for (const std::string& name : tenants) {
    auto tenant = std::make_unique<testing::EnclaveTenant>(driver->enclave_.get(), name, policy);
    RETURN_IF_ERROR(tenant->attestation());
    RETURN_IF_ERROR(tenant->Open());
    HostToEnclave load = tenant->LoadCall("tiny", ToString(package));
    EnclaveToHost loaded = driver->enclave_->Handle(load);
    if (loaded.status().code() != 0) {
      return absl::InternalError(absl::StrCat("upload: ", loaded.status().message()));
    }
    RETURN_IF_ERROR(tenant->OpenReply(crypto::MessageKind::kLoadModel,
                                      load.load_model().request(), loaded.load_model().reply()));
    driver->names_.push_back(name);
    driver->tenants_.push_back(std::move(tenant));
  }
  return driver;
}

// The enclave goes first: it ends the streams still open into the sink.
LlmEnclaveDriver::~LlmEnclaveDriver() { enclave_.reset(); }

absl::StatusOr<uint64_t> LlmEnclaveDriver::Send(int tenant,
                                                const api::v1::GenerateRequest& request,
                                                const boundary::v1::GenerateLimits& limits) {
  testing::EnclaveTenant& t = *tenants_.at(tenant);
  HostToEnclave call;
  const uint64_t call_id = next_call_++;
  call.set_call_id(call_id);
  call.mutable_generate()->set_tenant_id(names_[tenant]);
  *call.mutable_generate()->mutable_request() =
      t.Seal(crypto::MessageKind::kGenerate, t.Handle("tiny"), request);
  *call.mutable_generate()->mutable_limits() = limits;
  open_[call_id] = Open{tenant, call.generate().request()};
  std::optional<EnclaveToHost> refused = enclave_->Handle(call, sink_);
  if (refused) {
    open_.erase(call_id);
    return absl::InternalError(absl::StrCat("generate refused: ", refused->status().message()));
  }
  return call_id;
}

absl::StatusOr<std::vector<LlmEnclaveDriver::Chunk>> LlmEnclaveDriver::Take(
    absl::Duration timeout) {
  std::vector<Chunk> out;
  for (auto& [frame, arrived] : sink_->Take(timeout)) {
    auto it = open_.find(frame.call_id());
    if (it == open_.end()) continue;
    if (frame.status().code() != 0) {
      return absl::InternalError(absl::StrCat("stream refused: ", frame.status().message()));
    }
    Chunk chunk;
    chunk.call_id = frame.call_id();
    chunk.tenant = it->second.tenant;
    chunk.final = frame.generate().final();
    chunk.arrived = arrived;
    ASSIGN_OR_RETURN(chunk.chunk,
                     tenants_[it->second.tenant]->OpenChunk(it->second.item, frame.generate()));
    if (chunk.final) open_.erase(it);
    out.push_back(std::move(chunk));
  }
  return out;
}

}  // namespace cloister::bench

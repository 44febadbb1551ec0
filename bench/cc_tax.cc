#include "base/flags.h"
#include "bench/cc_tax.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status.h"
#include "enclave/batch_runner.h"
#include "enclave/pcie/batch_path.h"
#include "enclave/pcie/transfer_path.h"
#include "enclave/runtime/executor.h"
#include "enclave/runtime/model.h"
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

using enclave::pcie::BatchPath;
using enclave::pcie::PcieMode;
using Clock = std::chrono::steady_clock;
using NamedTensors = std::vector<std::pair<std::string, runtime::Tensor>>;

// Runs one batch; returns its wall time in ms and the time in transfers (ns) via the outcome.
absl::StatusOr<double> TimedBatch(const runtime::Model& model, BatchPath& path,
                                  const std::vector<enclave::BatchRequest>& requests,
                                  enclave::BatchOutcome* outcome_out) {
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(enclave::BatchOutcome outcome, enclave::RunBatch(model, path, requests));
  const double elapsed = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  for (const auto& reply : outcome.replies) RETURN_IF_ERROR(reply.status());
  if (requests.size() > 1 && !outcome.coalesced) {
    return absl::InternalError("the batch path did not run the requests as one batch");
  }
  if (outcome_out != nullptr) *outcome_out = std::move(outcome);
  return elapsed;
}

// Both modes must give the same outputs (FP32 within 1e-4, other types bit for bit).
absl::Status CompareOutcomes(const enclave::BatchOutcome& off,
                             const enclave::BatchOutcome& emulated) {
  for (size_t r = 0; r < off.replies.size(); ++r) {
    const auto& a = off.replies[r]->outputs();
    const auto& b = emulated.replies[r]->outputs();
    if (a.size() != b.size()) return absl::InternalError("the modes gave different outputs");
    for (int k = 0; k < a.size(); ++k) {
      if (a[k].raw().size() != b[k].raw().size()) {
        return absl::InternalError("the modes gave outputs of different sizes");
      }
      if (a[k].datatype() == "FP32") {
        const size_t count = a[k].raw().size() / sizeof(float);
        for (size_t i = 0; i < count; ++i) {
          float x, y;
          std::memcpy(&x, a[k].raw().data() + i * sizeof(float), sizeof(float));
          std::memcpy(&y, b[k].raw().data() + i * sizeof(float), sizeof(float));
          if (!(std::fabs(x - y) <= 1e-4f)) {
            return absl::InternalError(absl::StrCat("output ", a[k].name(), " differs between ",
                                                    "modes off and emulated"));
          }
        }
      } else if (a[k].raw() != b[k].raw()) {
        return absl::InternalError(
            absl::StrCat("output ", a[k].name(), " differs between modes off and emulated"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CcTaxResult> RunCase(const CcTaxOptions& options, const runtime::Model& model,
                                    const std::string& model_name, int batch, BatchPath& off,
                                    BatchPath& emulated) {
  // One request per row, each with its own inputs; the tensors own the bytes the requests view.
  std::vector<NamedTensors> rows;
  std::vector<enclave::BatchRequest> requests;
  rows.reserve(batch);
  for (int r = 0; r < batch; ++r) {
    ASSIGN_OR_RETURN(NamedTensors inputs, MakeInputs(model_name, 1, options.seed + r));
    rows.push_back(std::move(inputs));
    enclave::BatchRequest request;
    for (const auto& [name, tensor] : rows.back()) {
      request.inputs.push_back(
          {name, tensor.dtype(), tensor.shape(),
           ByteSpan(static_cast<const uint8_t*>(tensor.raw_data()), tensor.size())});
    }
    requests.push_back(std::move(request));
  }
  enclave::BatchOutcome off_outcome, emulated_outcome;
  RETURN_IF_ERROR(TimedBatch(model, off, requests, &off_outcome).status());
  RETURN_IF_ERROR(TimedBatch(model, emulated, requests, &emulated_outcome).status());
  RETURN_IF_ERROR(CompareOutcomes(off_outcome, emulated_outcome));
  for (int i = 0; i < options.warmup; ++i) {
    RETURN_IF_ERROR(TimedBatch(model, off, requests, nullptr).status());
    RETURN_IF_ERROR(TimedBatch(model, emulated, requests, nullptr).status());
  }
  std::vector<double> off_ms, emulated_ms, off_transfer_ms, emulated_transfer_ms;
  for (int i = 0; i < options.iterations; ++i) {
    for (int side = 0; side < 2; ++side) {
      const bool use_off = (side + i) % 2 == 0;
      enclave::BatchOutcome outcome;
      ASSIGN_OR_RETURN(double elapsed,
                       TimedBatch(model, use_off ? off : emulated, requests, &outcome));
      (use_off ? off_ms : emulated_ms).push_back(elapsed);
      (use_off ? off_transfer_ms : emulated_transfer_ms).push_back(outcome.transfer_ns / 1e6);
    }
  }
  CcTaxResult result;
  result.model = model_name;
  result.batch = batch;
  result.off = Summarize(std::move(off_ms));
  result.emulated = Summarize(std::move(emulated_ms));
  result.emulated_transfer_ms = Summarize(std::move(emulated_transfer_ms)).median_ms;
  result.off_transfer_ms = Summarize(std::move(off_transfer_ms)).median_ms;
  result.transfer_size = emulated_outcome.input_size + emulated_outcome.output_size;
  return result;
}

}  // namespace

absl::StatusOr<CcTaxOptions> ParseCcTaxFlags(const std::vector<std::string>& args,
                                             CcTaxOptions options) {
  std::string models = absl::StrJoin(options.models, ",");
  RETURN_IF_ERROR(
      ParseFlags(args, {{"--json", SwitchFlag{&options.json}},
                            {"--models", StringFlag{&models, {}}},
                            {"--models-dir", StringFlag{&options.models_dir, {}}},
                            {"--batches", IntListFlag{&options.batches, 1}},
                            {"--iterations", IntFlag{&options.iterations, 1}},
                            {"--warmup", IntFlag{&options.warmup, 0}},
                            {"--threads", IntFlag{&options.threads, 1}},
                            {"--transfer-threads", IntFlag{&options.transfer_threads, 0}},
                            {"--executor", StringFlag{&options.executor, {}}}}));
  if (absl::Status found = runtime::FindExecutor(options.executor).status(); !found.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--executor: ", found.message()));
  }
  options.models = absl::StrSplit(models, ',');
  for (const std::string& name : options.models) {
    const auto& known = BenchModels();
    if (std::none_of(known.begin(), known.end(),
                     [&](const BenchModel& model) { return model.name == name; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("--models: no model named \"", name, "\" (cls, rec, vad, bert_mini)"));
    }
  }
  return options;
}

std::string CcTaxUsage() {
  return "serving throughput with PCIe mode emulated over off, through the batch path\n"
         "                   [--json] [--models cls,bert_mini] [--batches 1,4,16,64]\n"
         "                   [--iterations N (10)] [--warmup N (1)] [--threads N (BLAS; the "
         "cores)]\n"
         "                   [--transfer-threads N (0: the path's default)] [--models-dir DIR]\n"
         "                   [--executor cpu|cuda|auto (cpu)]\n";
}

std::string CcTaxJsonLine(const CcTaxResult& result) {
  nlohmann::ordered_json line;
  line["model"] = result.model;
  line["executor"] = result.executor;
  line["executor_memory"] = result.executor_memory_on_device ? "device" : "host";
  line["batch"] = result.batch;
  line["rps_off"] = result.rps_off();
  line["rps_emulated"] = result.rps_emulated();
  line["ratio"] = result.ratio();
  line["off_ms"] = result.off.median_ms;
  line["emulated_ms"] = result.emulated.median_ms;
  line["off_transfer_ms"] = result.off_transfer_ms;
  line["emulated_transfer_ms"] = result.emulated_transfer_ms;
  line["transfer_ratio"] = result.transfer_ratio();
  line["transfer_size"] = result.transfer_size;
  line["iterations"] = result.off.count;
  return line.dump();
}

std::string CcTaxTable(const std::vector<CcTaxResult>& results) {
  std::string table = absl::StrFormat("%-10s %5s %10s %10s %11s %12s %10s %10s %7s %9s\n", "model",
                                      "batch", "off ms", "emul ms", "off xfer ms", "emul xfer ms",
                                      "rps off", "rps emul", "ratio", "xfer rat.");
  int checked = 0, met = 0, met_by_transfers = 0;
  std::vector<std::string> missed;
  for (const CcTaxResult& result : results) {
    absl::StrAppendFormat(
        &table, "%-10s %5d %10.3f %10.3f %11.3f %12.3f %10.1f %10.1f %7.3f %9.3f\n", result.model,
        result.batch, result.off.median_ms, result.emulated.median_ms, result.off_transfer_ms,
        result.emulated_transfer_ms, result.rps_off(), result.rps_emulated(), result.ratio(),
        result.transfer_ratio());
    if (result.batch >= kCcTaxTargetBatch) {
      ++checked;
      if (result.transfer_ratio() >= kCcTaxTargetRatio) ++met_by_transfers;
      if (result.ratio() >= kCcTaxTargetRatio) {
        ++met;
      } else {
        missed.push_back(
            absl::StrFormat("%s b%d (%.3f)", result.model, result.batch, result.ratio()));
      }
    }
  }
  absl::StrAppendFormat(&table, "%d of %d lines at batch >= %d with ratio >= %.2f", met, checked,
                        kCcTaxTargetBatch, kCcTaxTargetRatio);
  if (!missed.empty()) absl::StrAppend(&table, "; below: ", absl::StrJoin(missed, ", "));
  absl::StrAppendFormat(&table, "\n%d of %d with transfer_ratio >= %.2f\n", met_by_transfers,
                        checked, kCcTaxTargetRatio);
  return table;
}

absl::StatusOr<std::vector<CcTaxResult>> RunCcTax(const CcTaxOptions& options, std::FILE* out,
                                                  std::FILE* log) {
  enclave::pcie::TransferOptions transfer_options;
  transfer_options.threads = options.transfer_threads;
  // The enclave's choice: the executor's own path into device memory when it has one, else the
  // host path.
  ASSIGN_OR_RETURN(const runtime::Executor* executor, runtime::FindExecutor(options.executor));
  ASSIGN_OR_RETURN(std::unique_ptr<BatchPath> off,
                   enclave::pcie::NewBatchPath(executor->name(), PcieMode::kOff, transfer_options));
  ASSIGN_OR_RETURN(
      std::unique_ptr<BatchPath> emulated,
      enclave::pcie::NewBatchPath(executor->name(), PcieMode::kEmulated, transfer_options));
  std::vector<CcTaxResult> results;
  for (const std::string& model_name : options.models) {
    const auto& known = BenchModels();
    const auto bench_model = std::find_if(known.begin(), known.end(), [&](const BenchModel& model) {
      return model.name == model_name;
    });
    if (bench_model == known.end()) {
      return absl::NotFoundError(absl::StrCat("no model named \"", model_name, "\""));
    }
    const std::string path =
        (std::filesystem::path(options.models_dir) / bench_model->file).string();
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    runtime::LoadOptions load_options;
    load_options.threads = options.threads;
    load_options.executor = executor;
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::Model> model,
                     runtime::Model::Load(AsBytes(bytes), load_options));
    for (const int batch : options.batches) {
      auto result = RunCase(options, *model, model_name, batch, *off, *emulated);
      if (result.ok()) {
        result->executor = std::string(executor->name());
        result->executor_memory_on_device = off->executor_memory_on_device();
      }
      if (!result.ok()) {
        return absl::Status(result.status().code(), absl::StrCat(model_name, " batch ", batch, ": ",
                                                                 result.status().message()));
      }
      if (options.json) {
        absl::FPrintF(out, "%s\n", CcTaxJsonLine(*result));
        std::fflush(out);
      } else {
        absl::FPrintF(log, "%s batch %d: off %.3f ms, emulated %.3f ms, ratio %.3f\n", model_name,
                      batch, result->off.median_ms, result->emulated.median_ms, result->ratio());
      }
      results.push_back(*std::move(result));
    }
  }
  if (!options.json) absl::FPrintF(out, "%s", CcTaxTable(results));
  return results;
}

}  // namespace cloister::bench

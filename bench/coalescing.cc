#include "base/flags.h"
#include "bench/coalescing.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "enclave/pcie/transfer_path.h"
#ifdef CLOISTER_BENCH_HAVE_GPU
#include "enclave/gpu/cuda_transfer.h"
#endif
#include "nlohmann/json.hpp"

namespace cloister::bench {
namespace {

using enclave::pcie::TransferPath;
using Clock = std::chrono::steady_clock;

double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The bytes a transfer delivered, read back on the host: directly for the CPU path, through
// the path's own way back for the GPU path (so that check covers both directions).
absl::StatusOr<Bytes> Delivered(TransferPath&, const enclave::pcie::StagingBuffer& device) {
  return Bytes(device.data(), device.data() + device.size());
}
#ifdef CLOISTER_BENCH_HAVE_GPU
absl::StatusOr<Bytes> Delivered(gpu::CudaTransferPath& path, const gpu::CudaBuffer& device) {
  ASSIGN_OR_RETURN(gpu::CudaBuffer back, path.ToHost(device.data(), device.size()));
  return Bytes(back.data(), back.data() + back.size());
}
#endif

// Each request separately: moved in its own transfer, sealed straight from its bytes.
template <typename Path>
absl::Status MoveSeparately(Path& path, const std::vector<Bytes>& requests) {
  for (const Bytes& request : requests) {
    const enclave::pcie::GatherPiece piece{0, request.data(), request.size()};
    ASSIGN_OR_RETURN(auto device, path.GatherToDevice(request.size(), {&piece, 1}));
    if (device.size() != request.size()) {
      return absl::InternalError("a separate transfer delivered the wrong number of bytes");
    }
  }
  return absl::OkStatus();
}

// All requests in one transfer, back to back, sealed straight from their bytes (the batch
// runner's way: no staging buffer to gather them into first).
template <typename Path>
absl::Status MoveCoalesced(Path& path, const std::vector<Bytes>& requests, size_t total_size) {
  std::vector<enclave::pcie::GatherPiece> pieces;
  pieces.reserve(requests.size());
  size_t offset = 0;
  for (const Bytes& request : requests) {
    pieces.push_back({offset, request.data(), request.size()});
    offset += request.size();
  }
  ASSIGN_OR_RETURN(auto device, path.GatherToDevice(total_size, pieces));
  if (device.size() != total_size) {
    return absl::InternalError("the coalesced transfer delivered the wrong number of bytes");
  }
  return absl::OkStatus();
}

// One transfer of each kind must deliver exactly the bytes sent.
template <typename Path>
absl::Status CheckDelivery(Path& path, const std::vector<Bytes>& requests) {
  const enclave::pcie::GatherPiece first{0, requests[0].data(), requests[0].size()};
  ASSIGN_OR_RETURN(auto one, path.GatherToDevice(requests[0].size(), {&first, 1}));
  ASSIGN_OR_RETURN(Bytes one_bytes, Delivered(path, one));
  if (one_bytes != requests[0]) {
    return absl::InternalError("a separate transfer delivered other bytes than were sent");
  }
  Bytes all;
  std::vector<enclave::pcie::GatherPiece> pieces;
  for (const Bytes& request : requests) {
    pieces.push_back({all.size(), request.data(), request.size()});
    all.insert(all.end(), request.begin(), request.end());
  }
  ASSIGN_OR_RETURN(auto together, path.GatherToDevice(all.size(), pieces));
  ASSIGN_OR_RETURN(Bytes together_bytes, Delivered(path, together));
  if (together_bytes != all) {
    return absl::InternalError("the coalesced transfer delivered other bytes than were sent");
  }
  return absl::OkStatus();
}

std::string SizeName(int64_t size) {
  if (size >= (1 << 20) && size % (1 << 20) == 0) return absl::StrCat(size >> 20, " MiB");
  if (size >= 1024 && size % 1024 == 0) return absl::StrCat(size >> 10, " KiB");
  return absl::StrCat(size, " B");
}

}  // namespace

absl::StatusOr<CoalescingOptions> ParseCoalescingFlags(const std::vector<std::string>& args,
                                                       CoalescingOptions options) {
  RETURN_IF_ERROR(
      ParseFlags(args, {{"--json", SwitchFlag{&options.json}},
                            {"--requests", IntFlag{&options.requests, 1}},
                            {"--payloads", IntListFlag{&options.payload_sizes, 1}},
                            {"--iterations", IntFlag{&options.iterations, 1}},
                            {"--warmup", IntFlag{&options.warmup, 0}},
                            {"--threads", IntFlag{&options.threads, 0}},
                            {"--mode", StringFlag{&options.mode, {"off", "driver", "emulated"}}},
                            {"--device", StringFlag{&options.device, {"cpu", "gpu"}}}}));
  return options;
}

std::string CoalescingUsage() {
  return "N requests moved through the PCIe path as one transfer against N transfers\n"
         "                   [--json] [--requests N (64)] [--payloads BYTES,... "
         "(64,4096,65536,1048576)]\n"
         "                   [--iterations N (30)] [--warmup N (3)] [--threads N (0: the "
         "path's default)]\n"
         "                   [--mode off|driver|emulated (emulated)] [--device cpu|gpu (cpu)]\n";
}

std::string CoalescingJsonLine(const CoalescingResult& result) {
  nlohmann::ordered_json line;
  line["payload"] = result.payload_size;
  line["separate_us"] = result.separate.median_ms * 1e3;
  line["coalesced_us"] = result.coalesced.median_ms * 1e3;
  line["gain"] = result.gain();
  line["requests"] = result.requests;
  line["mode"] = result.mode;
  line["device"] = result.device;
  line["threads"] = result.threads;
  line["iterations"] = result.separate.count;
  line["separate_p90_us"] = result.separate.p90_ms * 1e3;
  line["coalesced_p90_us"] = result.coalesced.p90_ms * 1e3;
  return line.dump();
}

std::string CoalescingTable(const std::vector<CoalescingResult>& results) {
  std::string table =
      absl::StrFormat("%-9s %8s %-9s %13s %13s %13s %13s %8s\n", "payload", "requests", "mode",
                      "separate us", "sep p90", "coalesced us", "coal p90", "gain");
  std::string verdict = "no 64 B line";
  for (const CoalescingResult& result : results) {
    absl::StrAppendFormat(
        &table, "%-9s %8d %-9s %13.1f %13.1f %13.1f %13.1f %8.2f\n", SizeName(result.payload_size),
        result.requests, result.mode, result.separate.median_ms * 1e3, result.separate.p90_ms * 1e3,
        result.coalesced.median_ms * 1e3, result.coalesced.p90_ms * 1e3, result.gain());
    if (result.payload_size == 64) {
      verdict = absl::StrFormat("gain at 64 B: %.2f (target at least %.0f: %s)", result.gain(),
                                kCoalescingTargetGain,
                                result.gain() >= kCoalescingTargetGain ? "met" : "missed");
    }
  }
  return table + verdict + "\n";
}

namespace {

template <typename Path>
absl::StatusOr<std::vector<CoalescingResult>> RunWithPath(const CoalescingOptions& options,
                                                          Path& path, int threads, std::FILE* out,
                                                          std::FILE* log) {
  std::vector<CoalescingResult> results;
  uint64_t fill = 0x243f6a8885a308d3ULL;
  for (const int payload_size : options.payload_sizes) {
    std::vector<Bytes> requests(options.requests, Bytes(payload_size));
    for (Bytes& request : requests) {
      for (uint8_t& byte : request) {
        fill = fill * 6364136223846793005ULL + 1442695040888963407ULL;
        byte = static_cast<uint8_t>(fill >> 56);
      }
    }
    const size_t total_size = static_cast<size_t>(payload_size) * requests.size();
    if (auto checked = CheckDelivery(path, requests); !checked.ok()) {
      return absl::Status(checked.code(),
                          absl::StrCat("payload ", payload_size, ": ", checked.message()));
    }
    for (int i = 0; i < options.warmup; ++i) {
      RETURN_IF_ERROR(MoveSeparately(path, requests));
      RETURN_IF_ERROR(MoveCoalesced(path, requests, total_size));
    }
    std::vector<double> separate_ms, coalesced_ms;
    for (int i = 0; i < options.iterations; ++i) {
      for (int side = 0; side < 2; ++side) {
        const bool separate = (side + i) % 2 == 0;
        const auto start = Clock::now();
        RETURN_IF_ERROR(separate ? MoveSeparately(path, requests)
                                 : MoveCoalesced(path, requests, total_size));
        (separate ? separate_ms : coalesced_ms).push_back(MillisecondsSince(start));
      }
    }
    CoalescingResult result;
    result.payload_size = payload_size;
    result.requests = options.requests;
    result.mode = std::string(enclave::pcie::PcieModeName(path.mode()));
    result.device = options.device;
    result.threads = threads;
    result.separate = Summarize(std::move(separate_ms));
    result.coalesced = Summarize(std::move(coalesced_ms));
    if (options.json) {
      absl::FPrintF(out, "%s\n", CoalescingJsonLine(result));
      std::fflush(out);
    } else {
      absl::FPrintF(log, "%s x %d: separate %.1f us, coalesced %.1f us\n", SizeName(payload_size),
                    options.requests, result.separate.median_ms * 1e3,
                    result.coalesced.median_ms * 1e3);
    }
    results.push_back(std::move(result));
  }
  if (!options.json) absl::FPrintF(out, "%s", CoalescingTable(results));
  return results;
}

}  // namespace

absl::StatusOr<std::vector<CoalescingResult>> RunCoalescing(const CoalescingOptions& options,
                                                            std::FILE* out, std::FILE* log) {
  ASSIGN_OR_RETURN(enclave::pcie::PcieMode mode, enclave::pcie::ParsePcieMode(options.mode));
  if (options.device == "gpu") {
#ifdef CLOISTER_BENCH_HAVE_GPU
    gpu::CudaTransferOptions transfer_options;
    transfer_options.threads = options.threads;
    ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaTransferPath> path,
                     gpu::CudaTransferPath::Create(mode, transfer_options));
    return RunWithPath(options, *path, options.threads, out, log);
#else
    return absl::FailedPreconditionError("--device gpu: this build has no CUDA PCIe path");
#endif
  }
  enclave::pcie::TransferOptions transfer_options;
  transfer_options.threads = options.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<TransferPath> path,
                   TransferPath::Create(mode, transfer_options));
  return RunWithPath(options, *path, path->threads(), out, log);
}

}  // namespace cloister::bench

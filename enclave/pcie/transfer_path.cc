#include "enclave/pcie/transfer_path.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "crypto/random.h"
#include "enclave/pcie/chunk_cipher.h"

namespace cloister::enclave::pcie {

struct TransferPath::Counters {
  TransferCounters transfers;
  std::atomic<uint64_t> to_device_transfers{0}, to_host_transfers{0};
  std::atomic<uint64_t> to_device_size{0}, to_host_size{0};
  std::atomic<uint64_t> chunks_sealed{0}, authentication_failures{0};
};

absl::StatusOr<PcieMode> ParsePcieMode(std::string_view text) {
  if (text == "off") return PcieMode::kOff;
  if (text == "driver") return PcieMode::kDriver;
  if (text == "emulated") return PcieMode::kEmulated;
  return absl::InvalidArgumentError(
      absl::StrCat("PCIe mode must be driver, emulated or off, not '", std::string(text), "'"));
}

std::string_view PcieModeName(PcieMode mode) {
  switch (mode) {
    case PcieMode::kOff:
      return "off";
    case PcieMode::kDriver:
      return "driver";
    case PcieMode::kEmulated:
      return "emulated";
  }
  return "unknown";
}

TransferPath::TransferPath(PcieMode mode, TransferOptions options)
    : mode_(mode),
      options_(std::move(options)),
      host_pool_({options_.pin, options_.max_idle_buffers, options_.max_transfer_size}),
      device_pool_({options_.pin, options_.max_idle_buffers, options_.max_transfer_size}),
      // Ciphertext, which the host may read anyway: no locking, and no zeroing between transfers
      // (the next seal overwrites every byte; zeroing cost a pass over each transfer).
      bounce_pool_({.pin = false,
                    .max_idle_blocks = options_.max_idle_buffers,
                    .max_block_size = SIZE_MAX,
                    .wipe = false}),
      counters_(std::make_unique<Counters>()) {}

TransferPath::~TransferPath() = default;

absl::StatusOr<std::unique_ptr<TransferPath>> TransferPath::Create(PcieMode mode,
                                                                   TransferOptions options) {
  if (options.chunk_size < kMinChunkSize || options.chunk_size > kMaxChunkSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("PCIe chunk size ", options.chunk_size, " is outside 4 KiB..64 MiB"));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError("PCIe thread count must not be negative");
  }
  int threads = options.threads;
  if (threads == 0) {
    threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }
  std::unique_ptr<TransferPath> path(new TransferPath(mode, std::move(options)));
  if (mode == PcieMode::kEmulated) {
    // Stands in for the session key a CC GPU and its driver agree on; it never leaves the
    // enclave and dies with the path.
    SecretBytes key = crypto::RandomSecret(32);
    ASSIGN_OR_RETURN(path->cipher_,
                     ChunkCipher::Create(key.span(), path->options_.chunk_size, threads));
  }
  return path;
}

int TransferPath::threads() const { return cipher_ ? cipher_->threads() : 1; }

absl::StatusOr<StagingBuffer> TransferPath::AcquireHostStaging(size_t size) {
  return host_pool_.Acquire(size);
}

absl::StatusOr<StagingBuffer> TransferPath::AcquireDeviceStaging(size_t size) {
  return device_pool_.Acquire(size);
}

absl::StatusOr<StagingBuffer> TransferPath::ToDevice(ByteSpan host) {
  GatherPiece whole;
  return Move(Direction::kToDevice, host.size(), WholePiece(host, whole), device_pool_);
}

absl::StatusOr<StagingBuffer> TransferPath::GatherToDevice(size_t size,
                                                           std::span<const GatherPiece> pieces) {
  return Move(Direction::kToDevice, size, pieces, device_pool_);
}

absl::StatusOr<StagingBuffer> TransferPath::ToHost(ByteSpan device) {
  GatherPiece whole;
  return Move(Direction::kToHost, device.size(), WholePiece(device, whole), host_pool_);
}

absl::StatusOr<StagingBuffer> TransferPath::Move(Direction direction, size_t size,
                                                 std::span<const GatherPiece> pieces,
                                                 StagingPool& destination_pool) {
  const bool to_device = direction == Direction::kToDevice;
  if (size > options_.max_transfer_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PCIe transfer of ", size, " bytes exceeds the limit of ", options_.max_transfer_size));
  }
  RETURN_IF_ERROR(CheckGatherPieces(size, pieces));
  ASSIGN_OR_RETURN(StagingBuffer destination, destination_pool.Acquire(size));
  if (mode_ == PcieMode::kEmulated) {
    ASSIGN_OR_RETURN(const uint64_t counter,
                     counters_->transfers.Next(static_cast<uint8_t>(direction)));
    const size_t chunks = ChunkCount(size, options_.chunk_size);
    ASSIGN_OR_RETURN(StagingBuffer bounce,
                     bounce_pool_.Acquire(SealedSize(size, options_.chunk_size)));
    const uint8_t way = static_cast<uint8_t>(direction);
    const std::string_view what = to_device ? "to the device" : "to the host";
    absl::Status opened;
    if (options_.in_flight_hook_for_test) {
      // Two halves, so the test can play the host between them.
      RETURN_IF_ERROR(cipher_->Seal(way, counter, size, pieces, bounce.span()));
      options_.in_flight_hook_for_test(bounce.span());
      opened = cipher_->Open(way, counter, bounce.view(), destination.span(), what);
    } else {
      // Sealed straight from the pieces: a batch's inputs are not gathered into a buffer first.
      opened = cipher_->SealThenOpen(way, counter, size, pieces, bounce.span(), destination.span(),
                                     what);
    }
    counters_->chunks_sealed.fetch_add(chunks, std::memory_order_relaxed);
    if (!opened.ok()) {
      destination.Release();
      if (absl::IsDataLoss(opened)) {
        counters_->authentication_failures.fetch_add(1, std::memory_order_relaxed);
      }
      return opened;
    }
  } else {
    // off: plaintext. driver: the CC driver encrypts its bounce buffers underneath this copy.
    // The destination comes zeroed, so the gaps between pieces are zeros already.
    for (const GatherPiece& piece : pieces) {
      if (piece.size > 0) std::memcpy(destination.data() + piece.offset, piece.source, piece.size);
    }
  }
  if (to_device) {
    counters_->to_device_transfers.fetch_add(1, std::memory_order_relaxed);
    counters_->to_device_size.fetch_add(size, std::memory_order_relaxed);
  } else {
    counters_->to_host_transfers.fetch_add(1, std::memory_order_relaxed);
    counters_->to_host_size.fetch_add(size, std::memory_order_relaxed);
  }
  return destination;
}

TransferPath::Stats TransferPath::stats() const {
  Stats stats;
  stats.to_device_transfers = counters_->to_device_transfers.load();
  stats.to_host_transfers = counters_->to_host_transfers.load();
  stats.to_device_size = counters_->to_device_size.load();
  stats.to_host_size = counters_->to_host_size.load();
  stats.chunks_sealed = counters_->chunks_sealed.load();
  stats.authentication_failures = counters_->authentication_failures.load();
  stats.host_pool = host_pool_.stats();
  stats.device_pool = device_pool_.stats();
  stats.bounce_pool = bounce_pool_.stats();
  return stats;
}

}  // namespace cloister::enclave::pcie

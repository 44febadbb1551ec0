#include "enclave/pcie/transfer_path.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "crypto/aead.h"
#include "crypto/random.h"

namespace cloister::enclave::pcie {

namespace {

constexpr size_t kMinChunkSize = size_t{4} << 10;
constexpr size_t kMaxChunkSize = size_t{64} << 20;
constexpr uint64_t kMaxTransferCounter = (uint64_t{1} << 56) - 1;
constexpr std::string_view kAadLabel = "cloister/v1 pcie transfer";

size_t ChunkCount(size_t size, size_t chunk_size) {
  return std::max<size_t>(1, (size + chunk_size - 1) / chunk_size);
}

void PutBigEndian(uint8_t* out, uint64_t value, int width) {
  for (int i = width - 1; i >= 0; --i) {
    out[i] = static_cast<uint8_t>(value);
    value >>= 8;
  }
}

// direction (1 byte) || transfer counter (7 bytes) || chunk index (4 bytes), all big-endian.
std::array<uint8_t, crypto::kAeadNonceSize> ChunkNonce(uint8_t direction, uint64_t counter,
                                                       uint32_t chunk) {
  std::array<uint8_t, crypto::kAeadNonceSize> nonce;
  nonce[0] = direction;
  PutBigEndian(nonce.data() + 1, counter, 7);
  PutBigEndian(nonce.data() + 8, chunk, 4);
  return nonce;
}

// The label, the transfer's plaintext size and its chunk count: a chunk moved to a transfer of
// another length, or a transfer cut short, no longer authenticates.
Bytes TransferAad(size_t size, size_t chunks) {
  Bytes aad = ToBytes(kAadLabel);
  AppendBigEndian(aad, size, 8);
  AppendBigEndian(aad, chunks, 4);
  return aad;
}

}  // namespace

// A fixed pool of threads that seal or open the chunks of transfers. Each thread has its own
// keyed AES-GCM context; callers join in on their own transfer with a shared one (which falls
// back to a fresh context when busy, crypto/aead.h). Several transfers may be in progress at
// once: threads work on the oldest first.
class TransferPath::Workers {
 public:
  using ChunkFn = std::function<absl::Status(size_t chunk, const crypto::Aead& aead)>;

  static absl::StatusOr<std::unique_ptr<Workers>> Create(int threads, ByteSpan key) {
    std::unique_ptr<Workers> workers(new Workers());
    ASSIGN_OR_RETURN(workers->caller_aead_, crypto::Aead::Create(crypto::AeadAlg::kAes256Gcm, key));
    for (int i = 1; i < threads; ++i) {
      ASSIGN_OR_RETURN(auto aead, crypto::Aead::Create(crypto::AeadAlg::kAes256Gcm, key));
      workers->aeads_.push_back(std::move(aead));
    }
    for (size_t i = 0; i < workers->aeads_.size(); ++i) {
      workers->threads_.emplace_back([w = workers.get(), i] { w->Loop(*w->aeads_[i]); });
    }
    return workers;
  }

  ~Workers() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (auto& thread : threads_) thread.join();
  }

  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs fn(i) for every i in [0, count), on the calling thread and the pool. Returns the first
  // error (the other chunks still run; callers discard the output on error).
  absl::Status Run(size_t count, const ChunkFn& fn) {
    Job job{&fn, count};
    const bool share = count > 1 && !threads_.empty();
    if (share) {
      absl::MutexLock lock(&mu_);
      queue_.push_back(&job);
    }
    Work(job, *caller_aead_);
    absl::MutexLock lock(&mu_);
    // The job lives on this stack: wait until no thread can touch it any more.
    mu_.Await(absl::Condition(
        +[](Job* j) { return j->done == j->count && j->active == 0; }, &job));
    if (share) {
      auto it = std::find(queue_.begin(), queue_.end(), &job);
      if (it != queue_.end()) queue_.erase(it);
    }
    return job.error;
  }

 private:
  // One transfer's chunks. `next` hands out chunk indices; the rest is guarded by mu_.
  struct Job {
    const ChunkFn* fn;
    size_t count;
    std::atomic<size_t> next{0};
    size_t done = 0;
    int active = 0;  // pool threads inside Work() on this job
    absl::Status error;
  };

  Workers() = default;

  void Work(Job& job, const crypto::Aead& aead) {
    for (;;) {
      const size_t chunk = job.next.fetch_add(1);
      if (chunk >= job.count) return;
      absl::Status status = (*job.fn)(chunk, aead);
      absl::MutexLock lock(&mu_);
      if (!status.ok() && job.error.ok()) job.error = std::move(status);
      ++job.done;
    }
  }

  void Loop(const crypto::Aead& aead) {
    absl::MutexLock lock(&mu_);
    for (;;) {
      mu_.Await(absl::Condition(
          +[](Workers* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // Await holds mu_
            return w->stopping_ || !w->queue_.empty();
          },
          this));
      if (stopping_) return;
      Job* job = queue_.front();
      if (job->next.load() >= job->count) {
        queue_.pop_front();  // every chunk is handed out; its owner waits for the last ones
        continue;
      }
      ++job->active;
      mu_.Unlock();
      Work(*job, aead);
      mu_.Lock();
      --job->active;
    }
  }

  std::unique_ptr<crypto::Aead> caller_aead_;
  std::vector<std::unique_ptr<crypto::Aead>> aeads_;  // one per pool thread
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

struct TransferPath::Counters {
  std::atomic<uint64_t> next_counter[3] = {0, 0, 0};  // indexed by Direction
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
      // Ciphertext needs no locking, but the pool still zeroes it between transfers.
      bounce_pool_({false, options_.max_idle_buffers, SIZE_MAX}),
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
    ASSIGN_OR_RETURN(path->workers_, Workers::Create(threads, key.span()));
  }
  return path;
}

int TransferPath::threads() const { return workers_ ? workers_->size() : 1; }

absl::StatusOr<StagingBuffer> TransferPath::AcquireHostStaging(size_t size) {
  return host_pool_.Acquire(size);
}

absl::StatusOr<StagingBuffer> TransferPath::AcquireDeviceStaging(size_t size) {
  return device_pool_.Acquire(size);
}

absl::StatusOr<StagingBuffer> TransferPath::ToDevice(ByteSpan host) {
  return Move(Direction::kToDevice, host, device_pool_);
}

absl::StatusOr<StagingBuffer> TransferPath::ToHost(ByteSpan device) {
  return Move(Direction::kToHost, device, host_pool_);
}

absl::StatusOr<StagingBuffer> TransferPath::Move(Direction direction, ByteSpan source,
                                                 StagingPool& destination_pool) {
  const bool to_device = direction == Direction::kToDevice;
  if (source.size() > options_.max_transfer_size) {
    return absl::InvalidArgumentError(absl::StrCat("PCIe transfer of ", source.size(),
                                                   " bytes exceeds the limit of ",
                                                   options_.max_transfer_size));
  }
  ASSIGN_OR_RETURN(StagingBuffer destination, destination_pool.Acquire(source.size()));
  if (mode_ == PcieMode::kEmulated) {
    const uint64_t counter = counters_->next_counter[static_cast<int>(direction)].fetch_add(
        1, std::memory_order_relaxed);
    if (counter > kMaxTransferCounter) {
      return absl::ResourceExhaustedError("PCIe transfer counter exhausted; restart the enclave");
    }
    const size_t chunks = ChunkCount(source.size(), options_.chunk_size);
    ASSIGN_OR_RETURN(StagingBuffer bounce,
                     bounce_pool_.Acquire(source.size() + chunks * crypto::kAeadTagSize));
    RETURN_IF_ERROR(Seal(direction, counter, source, bounce.span()));
    counters_->chunks_sealed.fetch_add(chunks, std::memory_order_relaxed);
    if (options_.in_flight_hook_for_test) options_.in_flight_hook_for_test(bounce.span());
    absl::Status opened = Open(direction, counter, bounce.view(), destination.span());
    if (!opened.ok()) {
      destination.Release();
      counters_->authentication_failures.fetch_add(1, std::memory_order_relaxed);
      return opened;
    }
  } else if (!source.empty()) {
    // off: plaintext. driver: the CC driver encrypts its bounce buffers underneath this copy.
    std::memcpy(destination.data(), source.data(), source.size());
  }
  if (to_device) {
    counters_->to_device_transfers.fetch_add(1, std::memory_order_relaxed);
    counters_->to_device_size.fetch_add(source.size(), std::memory_order_relaxed);
  } else {
    counters_->to_host_transfers.fetch_add(1, std::memory_order_relaxed);
    counters_->to_host_size.fetch_add(source.size(), std::memory_order_relaxed);
  }
  return destination;
}

absl::Status TransferPath::Seal(Direction direction, uint64_t counter, ByteSpan source,
                                std::span<uint8_t> bounce) {
  const size_t chunk_size = options_.chunk_size;
  const size_t chunks = ChunkCount(source.size(), chunk_size);
  const Bytes aad = TransferAad(source.size(), chunks);
  return workers_->Run(chunks, [&](size_t i, const crypto::Aead& aead) {
    const size_t begin = i * chunk_size;
    const size_t length = std::min(chunk_size, source.size() - begin);
    auto nonce = ChunkNonce(static_cast<uint8_t>(direction), counter, static_cast<uint32_t>(i));
    return aead.SealInto(
        nonce, aad, source.subspan(begin, length),
        bounce.subspan(begin + i * crypto::kAeadTagSize, length + crypto::kAeadTagSize));
  });
}

absl::Status TransferPath::Open(Direction direction, uint64_t counter, ByteSpan bounce,
                                std::span<uint8_t> destination) {
  const size_t chunk_size = options_.chunk_size;
  const size_t chunks = ChunkCount(destination.size(), chunk_size);
  const Bytes aad = TransferAad(destination.size(), chunks);
  absl::Status status =
      workers_->Run(chunks, [&](size_t i, const crypto::Aead& aead) -> absl::Status {
        const size_t begin = i * chunk_size;
        const size_t length = std::min(chunk_size, destination.size() - begin);
        auto nonce = ChunkNonce(static_cast<uint8_t>(direction), counter, static_cast<uint32_t>(i));
        absl::Status opened = aead.OpenInto(
            nonce, aad,
            bounce.subspan(begin + i * crypto::kAeadTagSize, length + crypto::kAeadTagSize),
            destination.subspan(begin, length));
        if (!opened.ok()) {
          return absl::DataLossError(absl::StrCat(
              "PCIe transfer ", direction == Direction::kToDevice ? "to the device" : "to the host",
              " refused: chunk ", i + 1, " of ", chunks,
              " failed authentication (the bounce buffer was modified in flight)"));
        }
        return absl::OkStatus();
      });
  return status;
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

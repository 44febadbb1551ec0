#include "enclave/pcie/chunk_cipher.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/secret_bytes.h"
#include "base/status.h"
#include "base/task_pool.h"
#include "crypto/aead.h"

namespace cloister::enclave::pcie {

static_assert(kChunkTagSize == crypto::kAeadTagSize);
static_assert(kChunkNonceSize == crypto::kAeadNonceSize);

namespace {

void PutBigEndian(uint8_t* out, uint64_t value, int width) {
  for (int i = width - 1; i >= 0; --i) {
    out[i] = static_cast<uint8_t>(value);
    value >>= 8;
  }
}

// The refusal when chunk `index` (0-based) of `chunks` fails authentication.
absl::Status AuthenticationFailure(std::string_view what, size_t index, size_t chunks) {
  return absl::DataLossError(
      absl::StrCat("PCIe transfer ", std::string(what), " refused: chunk ", index + 1, " of ",
                   chunks, " failed authentication (the bounce buffer was modified in flight)"));
}

// Chunk i of a transfer laid out in `chunk_size` pieces: of the plaintext (`plain_size` bytes
// in all), and of its sealed form, where each chunk's ciphertext is followed by its tag.
template <typename Byte>
std::span<Byte> PlainChunk(std::span<Byte> plain, size_t i, size_t chunk_size) {
  const size_t begin = i * chunk_size;
  return plain.subspan(begin, std::min(chunk_size, plain.size() - begin));
}
template <typename Byte>
std::span<Byte> SealedChunk(std::span<Byte> sealed, size_t i, size_t chunk_size,
                            size_t plain_size) {
  const size_t begin = i * chunk_size;
  return sealed.subspan(begin + i * kChunkTagSize,
                        std::min(chunk_size, plain_size - begin) + kChunkTagSize);
}

// The plaintext of a transfer given as pieces where they lie (ChunkCipher::Seal's pieces
// form): the bytes of any range of it as a list of parts, the pieces' own bytes and zeros for
// the gaps between them.
class GatheredPlaintext {
 public:
  using Parts = absl::InlinedVector<ByteSpan, 8>;

  // CheckGatherPieces' errors.
  static absl::StatusOr<GatheredPlaintext> Create(size_t size,
                                                  std::span<const GatherPiece> pieces) {
    RETURN_IF_ERROR(CheckGatherPieces(size, pieces));
    return GatheredPlaintext(size, pieces);
  }

  // The parts of chunk i of `chunk_size` bytes (the last may be shorter).
  Parts ChunkParts(size_t i, size_t chunk_size) const {
    const size_t begin = i * chunk_size;
    return PartsOf(begin, std::min(size_, begin + chunk_size));
  }

 private:
  GatheredPlaintext(size_t size, std::span<const GatherPiece> pieces)
      : size_(size), pieces_(pieces) {}

  // The parts of bytes [begin, end), in order.
  Parts PartsOf(size_t begin, size_t end) const {
    Parts parts;
    // The first piece that ends after `begin`.
    auto piece =
        std::partition_point(pieces_.begin(), pieces_.end(),
                             [begin](const GatherPiece& p) { return p.offset + p.size <= begin; });
    // Each piece in range, a gap before each and one after: one allocation for a batch of many
    // small requests (zero runs past 4 KiB may add more).
    const auto last = std::partition_point(piece, pieces_.end(),
                                           [end](const GatherPiece& p) { return p.offset < end; });
    parts.reserve(2 * static_cast<size_t>(last - piece) + 1);
    size_t at = begin;
    while (at < end) {
      if (piece == pieces_.end() || piece->offset >= end) {
        AddZeros(end - at, parts);
        break;
      }
      if (piece->offset > at) {
        AddZeros(piece->offset - at, parts);
        at = piece->offset;
      }
      const size_t stop = std::min(end, piece->offset + piece->size);
      if (stop > at) {
        parts.push_back(
            ByteSpan(static_cast<const uint8_t*>(piece->source) + (at - piece->offset), stop - at));
        at = stop;
      }
      ++piece;
    }
    return parts;
  }

  static void AddZeros(size_t count, Parts& parts) {
    static constexpr std::array<uint8_t, 4096> kZeros{};
    for (; count > 0;) {
      const size_t step = std::min(count, kZeros.size());
      parts.push_back(ByteSpan(kZeros.data(), step));
      count -= step;
    }
  }

  size_t size_;
  std::span<const GatherPiece> pieces_;
};

}  // namespace

absl::Status CheckGatherPieces(size_t size, std::span<const GatherPiece> pieces) {
  size_t end = 0;
  for (const GatherPiece& piece : pieces) {
    if (piece.offset < end || piece.offset > size || piece.size > size - piece.offset) {
      return absl::InternalError(absl::StrCat("PCIe transfer of ", size, " bytes: a piece of ",
                                              piece.size, " bytes at ", piece.offset,
                                              " is out of order, overlaps another or overruns it"));
    }
    end = piece.offset + piece.size;
  }
  return absl::OkStatus();
}

size_t ChunkCount(size_t size, size_t chunk_size) {
  return std::max<size_t>(1, (size + chunk_size - 1) / chunk_size);
}

size_t SealedSize(size_t size, size_t chunk_size) {
  return size + ChunkCount(size, chunk_size) * kChunkTagSize;
}

absl::StatusOr<uint64_t> TransferCounters::Next(uint8_t direction) {
  CLOISTER_CHECK(direction == kToDeviceDirection || direction == kToHostDirection);
  const uint64_t counter = next_[direction].fetch_add(1, std::memory_order_relaxed);
  if (counter > (uint64_t{1} << 56) - 1) {
    return absl::ResourceExhaustedError("PCIe transfer counter exhausted; restart the enclave");
  }
  return counter;
}

std::array<uint8_t, kChunkNonceSize> ChunkNonce(uint8_t direction, uint64_t counter,
                                                uint32_t chunk) {
  std::array<uint8_t, kChunkNonceSize> nonce;
  nonce[0] = direction;
  PutBigEndian(nonce.data() + 1, counter, 7);
  PutBigEndian(nonce.data() + 8, chunk, 4);
  return nonce;
}

std::array<uint8_t, kTransferAadSize> TransferAad(size_t size, size_t chunks) {
  std::array<uint8_t, kTransferAadSize> aad;
  std::copy(kTransferAadLabel.begin(), kTransferAadLabel.end(), aad.begin());
  PutBigEndian(aad.data() + kTransferAadLabel.size(), size, 8);
  PutBigEndian(aad.data() + kTransferAadLabel.size() + 8, chunks, 4);
  return aad;
}

// The threads that seal or open the chunks of transfers (base/task_pool.h), each with its own
// keyed AES-GCM context; callers join in on their own transfer with a shared one (which falls
// back to a fresh context when busy, crypto/aead.h). Several transfers may be in progress at
// once: threads work on the oldest first.
class ChunkCipher::Workers {
 public:
  using ChunkFn = std::function<absl::Status(size_t chunk, const crypto::Aead& aead)>;

  static absl::StatusOr<std::unique_ptr<Workers>> Create(int threads, ByteSpan key) {
    std::vector<std::unique_ptr<crypto::Aead>> aeads;  // [0]: the callers' shared context
    for (int i = 0; i < threads; ++i) {
      ASSIGN_OR_RETURN(auto aead, crypto::Aead::Create(crypto::AeadAlg::kAes256Gcm, key));
      aeads.push_back(std::move(aead));
    }
    return std::unique_ptr<Workers>(new Workers(std::move(aeads)));
  }

  int size() const { return pool_.size(); }

  // Runs fn(i) for every i in [0, count), on the calling thread and the pool. Returns the first
  // error (the other chunks still run; callers discard the output on error).
  absl::Status Run(size_t count, const ChunkFn& fn) {
    return pool_.Run(count, [&](size_t chunk, int slot) { return fn(chunk, *aeads_[slot]); });
  }

 private:
  explicit Workers(std::vector<std::unique_ptr<crypto::Aead>> aeads)
      : aeads_(std::move(aeads)), pool_(static_cast<int>(aeads_.size())) {}

  const std::vector<std::unique_ptr<crypto::Aead>> aeads_;  // one per pool slot
  TaskPool pool_;  // declared last: its threads stop before the contexts go
};

ChunkCipher::ChunkCipher(size_t chunk_size, std::unique_ptr<Workers> workers)
    : chunk_size_(chunk_size), workers_(std::move(workers)) {}

ChunkCipher::~ChunkCipher() = default;

absl::StatusOr<std::unique_ptr<ChunkCipher>> ChunkCipher::Create(ByteSpan key, size_t chunk_size,
                                                                 int threads) {
  if (key.size() != 32) return absl::InvalidArgumentError("the chunk key must be 32 bytes");
  if (chunk_size == 0) return absl::InvalidArgumentError("the chunk size must not be 0");
  ASSIGN_OR_RETURN(std::unique_ptr<Workers> workers, Workers::Create(std::max(threads, 1), key));
  return std::unique_ptr<ChunkCipher>(new ChunkCipher(chunk_size, std::move(workers)));
}

int ChunkCipher::threads() const { return workers_->size(); }

absl::Status ChunkCipher::Seal(uint8_t direction, uint64_t counter, ByteSpan source,
                               std::span<uint8_t> sealed) const {
  GatherPiece whole;
  return Seal(direction, counter, source.size(), WholePiece(source, whole), sealed);
}

absl::Status ChunkCipher::Seal(uint8_t direction, uint64_t counter, size_t size,
                               std::span<const GatherPiece> pieces,
                               std::span<uint8_t> sealed) const {
  ASSIGN_OR_RETURN(const GatheredPlaintext source, GatheredPlaintext::Create(size, pieces));
  const size_t chunks = ChunkCount(size, chunk_size_);
  if (sealed.size() != size + chunks * kChunkTagSize) {
    return absl::InvalidArgumentError("sealed buffer size does not match the transfer");
  }
  const auto aad = TransferAad(size, chunks);
  return workers_->Run(chunks, [&](size_t i, const crypto::Aead& aead) {
    const auto nonce = ChunkNonce(direction, counter, static_cast<uint32_t>(i));
    return aead.SealPartsInto(nonce, aad, source.ChunkParts(i, chunk_size_),
                              SealedChunk(sealed, i, chunk_size_, size));
  });
}

absl::Status ChunkCipher::Open(uint8_t direction, uint64_t counter, ByteSpan sealed,
                               std::span<uint8_t> destination, std::string_view what) const {
  const size_t chunks = ChunkCount(destination.size(), chunk_size_);
  if (sealed.size() != destination.size() + chunks * kChunkTagSize) {
    return absl::InvalidArgumentError("sealed buffer size does not match the transfer");
  }
  const auto aad = TransferAad(destination.size(), chunks);
  return workers_->Run(chunks, [&](size_t i, const crypto::Aead& aead) -> absl::Status {
    const auto nonce = ChunkNonce(direction, counter, static_cast<uint32_t>(i));
    absl::Status opened =
        aead.OpenInto(nonce, aad, SealedChunk(sealed, i, chunk_size_, destination.size()),
                      PlainChunk(destination, i, chunk_size_));
    return opened.ok() ? absl::OkStatus() : AuthenticationFailure(what, i, chunks);
  });
}

namespace {

// How far a chunk's sealer has got, for the opener that follows it (SealThenOpen's pipeline).
class SealProgress {
 public:
  void Advance(size_t bytes) {
    absl::MutexLock lock(&mu_);
    sealed_ = bytes;
  }
  void Fail() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
  }
  // Waits until `bytes` are sealed; an error when the sealer failed first.
  absl::Status WaitFor(size_t bytes) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return failed_ || sealed_ >= bytes;
    };
    mu_.Await(absl::Condition(&ready));
    if (sealed_ >= bytes) return absl::OkStatus();
    return absl::InternalError("PCIe transfer: sealing the chunk failed");
  }

 private:
  absl::Mutex mu_;
  size_t sealed_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::Status ChunkCipher::SealThenOpen(uint8_t direction, uint64_t counter, ByteSpan source,
                                       std::span<uint8_t> sealed, std::span<uint8_t> destination,
                                       std::string_view what) const {
  GatherPiece whole;
  return SealThenOpen(direction, counter, source.size(), WholePiece(source, whole), sealed,
                      destination, what);
}

absl::Status ChunkCipher::SealThenOpen(uint8_t direction, uint64_t counter, size_t size,
                                       std::span<const GatherPiece> pieces,
                                       std::span<uint8_t> sealed, std::span<uint8_t> destination,
                                       std::string_view what) const {
  ASSIGN_OR_RETURN(const GatheredPlaintext source, GatheredPlaintext::Create(size, pieces));
  const size_t chunks = ChunkCount(size, chunk_size_);
  if (sealed.size() != size + chunks * kChunkTagSize || destination.size() != size) {
    return absl::InvalidArgumentError("sealed or destination size does not match the transfer");
  }
  const auto aad = TransferAad(size, chunks);
  auto bounce_of = [&](size_t i) { return SealedChunk(sealed, i, chunk_size_, size); };
  auto source_of = [&](size_t i) { return source.ChunkParts(i, chunk_size_); };
  auto destination_of = [&](size_t i) { return PlainChunk(destination, i, chunk_size_); };
  const size_t threads = static_cast<size_t>(workers_->size());
  if (threads < 2 || size < kPipelineMinimum || chunks >= 4 * threads) {
    // One thread, too little to split, or chunks enough to share the threads evenly: each chunk
    // is sealed and then opened by one thread.
    return workers_->Run(chunks, [&](size_t i, const crypto::Aead& aead) -> absl::Status {
      const auto nonce = ChunkNonce(direction, counter, static_cast<uint32_t>(i));
      RETURN_IF_ERROR(aead.SealPartsInto(nonce, aad, source_of(i), bounce_of(i)));
      const absl::Status opened = aead.OpenInto(nonce, aad, bounce_of(i), destination_of(i));
      return opened.ok() ? absl::OkStatus() : AuthenticationFailure(what, i, chunks);
    });
  }
  // Few chunks: each gets a sealer and an opener that follows it piece by piece on another
  // thread, so the transfer takes about one pass over its bytes instead of two, and the threads
  // share a few chunks evenly. Job 2i seals chunk i, job 2i+1 opens it; jobs are
  // handed out in order, so a chunk's sealer always starts before (or on the same thread as)
  // its opener, which only ever waits for a sealer that is running.
  std::vector<SealProgress> progress(chunks);
  return workers_->Run(2 * chunks, [&](size_t job, const crypto::Aead& aead) -> absl::Status {
    const size_t i = job / 2;
    const auto nonce = ChunkNonce(direction, counter, static_cast<uint32_t>(i));
    if (job % 2 == 0) {
      absl::Status status = aead.SealPartsIntoInPieces(nonce, aad, source_of(i), bounce_of(i),
                                                       kPipelinePiece, [&](size_t bytes) {
                                                         progress[i].Advance(bytes);
                                                         return absl::OkStatus();
                                                       });
      if (!status.ok()) progress[i].Fail();
      return status;
    }
    const absl::Status opened =
        aead.OpenIntoInPieces(nonce, aad, bounce_of(i), destination_of(i), kPipelinePiece,
                              [&](size_t bytes) { return progress[i].WaitFor(bytes); });
    if (opened.ok()) return absl::OkStatus();
    return absl::IsDataLoss(opened) ? AuthenticationFailure(what, i, chunks) : opened;
  });
}

}  // namespace cloister::enclave::pcie

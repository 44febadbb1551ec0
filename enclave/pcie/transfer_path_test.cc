#include "enclave/pcie/transfer_path.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "enclave/pcie/batch_path.h"
#include "enclave/pcie/chunk_cipher.h"
#include "gtest/gtest.h"

namespace cloister::enclave::pcie {
namespace {

Bytes Pattern(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes data(size);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return data;
}

bool AllZero(ByteSpan data) {
  return std::all_of(data.begin(), data.end(), [](uint8_t b) { return b == 0; });
}

std::unique_ptr<TransferPath> MakePath(PcieMode mode, TransferOptions options = {}) {
  auto path = TransferPath::Create(mode, std::move(options));
  EXPECT_TRUE(path.ok()) << path.status();
  return path.ok() ? std::move(*path) : nullptr;
}

TEST(PcieModeTest, ParsesTheThreeModesAndRefusesOthers) {
  EXPECT_EQ(*ParsePcieMode("off"), PcieMode::kOff);
  EXPECT_EQ(*ParsePcieMode("driver"), PcieMode::kDriver);
  EXPECT_EQ(*ParsePcieMode("emulated"), PcieMode::kEmulated);
  for (PcieMode mode : {PcieMode::kOff, PcieMode::kDriver, PcieMode::kEmulated}) {
    EXPECT_EQ(*ParsePcieMode(PcieModeName(mode)), mode);
  }
  auto bad = ParsePcieMode("encrypted");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'encrypted'"), std::string::npos);
}

TEST(TransferPathTest, RefusesBadOptionsAndOversizedTransfers) {
  TransferOptions tiny;
  tiny.chunk_size = 100;
  EXPECT_EQ(TransferPath::Create(PcieMode::kEmulated, tiny).status().code(),
            absl::StatusCode::kInvalidArgument);
  TransferOptions negative;
  negative.threads = -1;
  EXPECT_FALSE(TransferPath::Create(PcieMode::kOff, negative).ok());

  TransferOptions small;
  small.max_transfer_size = 1000;
  auto path = MakePath(PcieMode::kEmulated, small);
  Bytes data(1001, 7);
  EXPECT_EQ(path->ToDevice(data).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(path->AcquireHostStaging(1001).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(path->ToDevice(ByteSpan(data).first(1000)).ok());
}

// Every mode moves exactly the same bytes there and back, whatever the size and chunking.
TEST(TransferPathTest, TheThreeModesMoveIdenticalBytes) {
  const std::vector<size_t> sizes = {0, 1, 64, 4096, 4096 * 3 + 5, (size_t{5} << 20) + 7};
  for (PcieMode mode : {PcieMode::kOff, PcieMode::kDriver, PcieMode::kEmulated}) {
    for (size_t chunk : {size_t{4096}, kEmulatedChunkSize}) {
      TransferOptions options;
      options.chunk_size = chunk;
      options.threads = 3;
      auto path = MakePath(mode, options);
      for (size_t size : sizes) {
        SCOPED_TRACE(testing::Message()
                     << PcieModeName(mode) << " chunk " << chunk << " size " << size);
        Bytes data = Pattern(size, static_cast<uint32_t>(size));
        auto staging = path->AcquireHostStaging(size);
        ASSERT_TRUE(staging.ok());
        ASSERT_EQ(staging->size(), size);
        if (size > 0) std::memcpy(staging->data(), data.data(), size);
        auto device = path->ToDevice(staging->view());
        ASSERT_TRUE(device.ok()) << device.status();
        ASSERT_EQ(device->size(), size);
        EXPECT_TRUE(std::equal(data.begin(), data.end(), device->data()));
        auto back = path->ToHost(device->view());
        ASSERT_TRUE(back.ok()) << back.status();
        EXPECT_EQ(Bytes(back->data(), back->data() + back->size()), data);
      }
      auto stats = path->stats();
      EXPECT_EQ(stats.to_device_transfers, sizes.size());
      EXPECT_EQ(stats.to_host_transfers, sizes.size());
      EXPECT_EQ(stats.authentication_failures, 0u);
      if (mode == PcieMode::kEmulated) {
        // One chunk per started chunk_size bytes (at least one), both directions.
        uint64_t chunks = 0;
        for (size_t size : sizes) chunks += std::max<size_t>(1, (size + chunk - 1) / chunk);
        EXPECT_EQ(stats.chunks_sealed, 2 * chunks);
      } else {
        EXPECT_EQ(stats.chunks_sealed, 0u);
      }
    }
  }
}

// Transfers of one or two chunks on a pool with more threads go through the pipelined
// SealThenOpen (an opener thread following each chunk's sealer): the same sealed bytes as a
// plain Seal, the same bytes delivered, from many transfers at once.
TEST(ChunkCipherTest, PipelinedSealThenOpenMatchesSealAndOpen) {
  const Bytes key = Pattern(32, 7);
  for (int threads : {1, 2, 3, 8}) {
    auto cipher = ChunkCipher::Create(key, kEmulatedChunkSize, threads);
    ASSERT_TRUE(cipher.ok()) << cipher.status();
    for (size_t size :
         {size_t{1000}, size_t{600000}, (size_t{3} << 20) / 2, kEmulatedChunkSize + 12345,
          5 * kEmulatedChunkSize, 9 * kEmulatedChunkSize + 1}) {  // (chunks enough not to pipeline)
      SCOPED_TRACE(testing::Message() << threads << " threads, " << size << " bytes");
      const Bytes data = Pattern(size, static_cast<uint32_t>(size));
      Bytes reference(SealedSize(size, kEmulatedChunkSize));
      ASSERT_TRUE((*cipher)->Seal(kToDeviceDirection, 5, data, reference).ok());
      Bytes bounce(reference.size());
      Bytes delivered(size, 0xAA);
      ASSERT_TRUE((*cipher)
                      ->SealThenOpen(kToDeviceDirection, 5, data, bounce, delivered, "to the device")
                      .ok());
      EXPECT_EQ(bounce, reference);
      EXPECT_EQ(delivered, data);
    }
    // Concurrent single-chunk transfers share the pool without waiting on each other forever.
    std::vector<std::thread> callers;
    std::atomic<int> good{0};
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&, t] {
        const Bytes data = Pattern(700000, 100 + t);
        for (int round = 0; round < 5; ++round) {
          Bytes bounce(SealedSize(data.size(), kEmulatedChunkSize));
          Bytes delivered(data.size());
          if ((*cipher)
                  ->SealThenOpen(kToHostDirection, 1000 * t + round, data, bounce, delivered, "back")
                  .ok() &&
              delivered == data) {
            ++good;
          }
        }
      });
    }
    for (auto& caller : callers) caller.join();
    EXPECT_EQ(good.load(), 20);
  }
}

// A transfer's plaintext as pieces scattered in memory, with gaps between them (zeros), and
// the buffer they gather into, for the pieces forms.
struct Scattered {
  std::vector<Bytes> sources;
  std::vector<GatherPiece> pieces;
  Bytes gathered;
};

// Pieces of `sizes` bytes, each after a gap of `gap` bytes (and `gap` at the end).
Scattered Scatter(const std::vector<size_t>& sizes, size_t gap, uint32_t seed) {
  Scattered s;
  size_t offset = 0;
  s.sources.reserve(sizes.size());
  for (size_t size : sizes) {
    offset += gap;
    s.sources.push_back(Pattern(size, seed++));
    s.pieces.push_back(GatherPiece{offset, s.sources.back().data(), size});
    offset += size;
  }
  s.gathered.assign(offset + gap, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::copy(s.sources[i].begin(), s.sources[i].end(), s.gathered.begin() + s.pieces[i].offset);
  }
  return s;
}

// Sealing pieces where they lie gives exactly the bytes sealing the gathered buffer gives, in
// both the chunk-per-thread and the pipelined forms, with pieces that cross chunk and pipeline
// boundaries, empty pieces and gaps of zeros.
TEST(ChunkCipherTest, PiecesSealAsTheirGatheredBuffer) {
  const Bytes key = Pattern(32, 9);
  const std::vector<std::vector<size_t>> layouts = {
      {}, {0}, {1}, {10, 0, 4000, 5000, 1}, {600000, 3, 700001}, {kEmulatedChunkSize + 5, 64}};
  for (int threads : {1, 2, 8}) {
    auto cipher = ChunkCipher::Create(key, kEmulatedChunkSize, threads);
    ASSERT_TRUE(cipher.ok()) << cipher.status();
    for (const auto& sizes : layouts) {
      for (size_t gap : {size_t{0}, size_t{48}}) {
        SCOPED_TRACE(testing::Message() << threads << " threads, gap " << gap << ", "
                                        << testing::PrintToString(sizes));
        const Scattered s = Scatter(sizes, gap, 11);
        const size_t size = s.gathered.size();
        Bytes reference(SealedSize(size, kEmulatedChunkSize));
        ASSERT_TRUE((*cipher)->Seal(kToDeviceDirection, 3, s.gathered, reference).ok());
        Bytes sealed(reference.size(), 0xAA);
        ASSERT_TRUE((*cipher)->Seal(kToDeviceDirection, 3, size, s.pieces, sealed).ok());
        EXPECT_EQ(sealed, reference);
        Bytes bounce(reference.size(), 0xAA);
        Bytes delivered(size, 0xAA);
        ASSERT_TRUE((*cipher)
                        ->SealThenOpen(kToDeviceDirection, 3, size, s.pieces, bounce, delivered,
                                       "to the device")
                        .ok());
        EXPECT_EQ(bounce, reference);
        EXPECT_EQ(delivered, s.gathered);
      }
    }
  }
}

// GatherToDevice in every mode delivers the gathered buffer; in mode emulated what crosses is
// ciphertext that a modified byte still gets refused for; pieces out of order, overlapping or
// past the end are refused with nothing moved.
TEST(TransferPathTest, GatherToDeviceMovesPiecesAsOneBuffer) {
  const Scattered s = Scatter({100, 5000, 0, 9000, 3}, 40, 21);
  for (PcieMode mode : {PcieMode::kOff, PcieMode::kDriver, PcieMode::kEmulated}) {
    SCOPED_TRACE(PcieModeName(mode));
    TransferOptions options;
    options.chunk_size = 4096;  // pieces cross chunks
    auto path = MakePath(mode, options);
    auto device = path->GatherToDevice(s.gathered.size(), s.pieces);
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(Bytes(device->data(), device->data() + device->size()), s.gathered);
    EXPECT_EQ(path->stats().to_device_transfers, 1u);
    EXPECT_EQ(path->stats().to_device_size, s.gathered.size());
    EXPECT_EQ(path->stats().host_pool.acquired, 0u) << "a host staging buffer was used";

    const std::vector<std::vector<GatherPiece>> bad = {
        {s.pieces[1], s.pieces[0]},  // out of order
        {GatherPiece{0, s.sources[1].data(), 200}, GatherPiece{100, s.sources[0].data(), 50}},
        {GatherPiece{s.gathered.size() - 2, s.sources[4].data(), 3}},  // past the end
        {GatherPiece{s.gathered.size() + 1, s.sources[4].data(), 0}},
    };
    for (const auto& pieces : bad) {
      auto refused = path->GatherToDevice(s.gathered.size(), pieces);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInternal) << refused.status();
      EXPECT_NE(refused.status().message().find("out of order, overlaps another or overruns"),
                std::string::npos)
          << refused.status();
    }
    EXPECT_EQ(path->stats().to_device_transfers, 1u);
    EXPECT_EQ(path->stats().device_pool.acquired, 1u) << "a refused transfer took a buffer";
  }

  TransferOptions tamper;
  tamper.chunk_size = 4096;
  Bytes seen;
  tamper.in_flight_hook_for_test = [&seen](std::span<uint8_t> bounce) {
    seen.assign(bounce.begin(), bounce.end());
    bounce[5000] ^= 0x80;
  };
  auto path = MakePath(PcieMode::kEmulated, tamper);
  auto refused = path->GatherToDevice(s.gathered.size(), s.pieces);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_EQ(path->stats().authentication_failures, 1u);
  // What crossed is ciphertext (the path's key is its own, so the bytes themselves are
  // compared with a gathered buffer's in ChunkCipherTest): no run of the plaintext shows in it.
  ASSERT_EQ(seen.size(), SealedSize(s.gathered.size(), 4096));
  const Bytes& largest = s.sources[3];
  EXPECT_EQ(std::search(seen.begin(), seen.end(), largest.begin(), largest.begin() + 64),
            seen.end());
}

// The untrusted host modifies the bounce buffer: any flipped byte in any chunk or tag, or two
// chunks swapped, refuses the transfer and delivers nothing.
TEST(TransferPathTest, EmulatedModeRefusesAModifiedBounceBuffer) {
  const size_t chunk = 4096;
  const size_t size = 3 * chunk + 100;  // four chunks
  const size_t wire = size + 4 * 16;
  Bytes data = Pattern(size, 1);
  std::vector<size_t> positions = {0,         chunk - 1, chunk + 16, 2 * (chunk + 16) + 5,
                                   wire - 17, wire - 1};
  for (size_t position : positions) {
    TransferOptions options;
    options.chunk_size = chunk;
    options.in_flight_hook_for_test = [position](std::span<uint8_t> bounce) {
      ASSERT_LT(position, bounce.size());
      bounce[position] ^= 0x01;
    };
    auto path = MakePath(PcieMode::kEmulated, options);
    auto device = path->ToDevice(data);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kDataLoss) << "byte " << position;
    EXPECT_NE(device.status().message().find("failed authentication"), std::string::npos);
    auto back = path->ToHost(data);
    EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << "byte " << position;
    EXPECT_EQ(path->stats().authentication_failures, 2u);
    // The refused destination went back to its pool zeroed.
    auto reused = path->AcquireDeviceStaging(size);
    ASSERT_TRUE(reused.ok());
    EXPECT_TRUE(AllZero(reused->view()));
  }

  TransferOptions swap;
  swap.chunk_size = chunk;
  swap.in_flight_hook_for_test = [](std::span<uint8_t> bounce) {
    std::swap_ranges(bounce.begin(), bounce.begin() + chunk + 16, bounce.begin() + chunk + 16);
  };
  auto path = MakePath(PcieMode::kEmulated, swap);
  EXPECT_EQ(path->ToDevice(data).status().code(), absl::StatusCode::kDataLoss);

  // The bounce buffer holds ciphertext: no run of the plaintext shows in it.
  TransferOptions watch;
  watch.chunk_size = chunk;
  Bytes seen;
  watch.in_flight_hook_for_test = [&seen](std::span<uint8_t> bounce) {
    seen.assign(bounce.begin(), bounce.end());
  };
  auto watched = MakePath(PcieMode::kEmulated, watch);
  Bytes zeros(size, 0);
  ASSERT_TRUE(watched->ToDevice(zeros).ok());
  ASSERT_EQ(seen.size(), wire);
  EXPECT_LT(std::count(seen.begin(), seen.end(), 0), static_cast<long>(wire / 64));
}

TEST(StagingPoolTest, BuffersAreReusedAndZeroedBetweenLeases) {
  StagingPool pool({.pin = true, .max_idle_blocks = 2});
  const uint8_t* first_data = nullptr;
  {
    auto lease = pool.Acquire(100000);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(AllZero(lease->view()));
    EXPECT_GE(lease->capacity(), 100000u);
    EXPECT_TRUE(lease->pinned() || pool.stats().pin_failures == 1);
    std::memset(lease->data(), 0xAB, lease->size());
    first_data = lease->data();
  }
  auto again = pool.Acquire(90000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first_data);                   // the same block, reused...
  EXPECT_TRUE(AllZero(ByteSpan(again->data(), 100000)));  // ...and zero where it was written
  EXPECT_EQ(pool.stats().reused, 1u);
  EXPECT_EQ(pool.stats().allocated, 1u);

  // An explicit Release zeroes too, and a moved-from lease holds nothing.
  std::memset(again->data(), 0xCD, again->size());
  StagingBuffer moved = std::move(*again);
  EXPECT_FALSE(again->valid());
  moved.Release();
  EXPECT_FALSE(moved.valid());
  auto third = pool.Acquire(100000);
  EXPECT_EQ(third->data(), first_data);
  EXPECT_TRUE(AllZero(third->view()));

  // Idle blocks beyond the limit are freed.
  std::vector<StagingBuffer> leases;
  for (int i = 0; i < 4; ++i) leases.push_back(*pool.Acquire(1000));
  leases.clear();
  EXPECT_EQ(pool.stats().idle_blocks, 2u);
  EXPECT_EQ(pool.stats().freed, 2u);
  EXPECT_EQ(pool.Acquire(size_t{2} << 30).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StagingPoolTest, APoolWithWipeOffHandsBackWhatTheLastLeaseWrote) {
  // For ciphertext only: the bounce buffers, overwritten whole by the next transfer.
  StagingPool pool({.pin = false, .max_idle_blocks = 2, .wipe = false});
  const uint8_t* first_data = nullptr;
  {
    auto lease = pool.Acquire(50000);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(AllZero(lease->view()));  // fresh memory is zero all the same
    std::memset(lease->data(), 0xAB, lease->size());
    first_data = lease->data();
  }
  auto again = pool.Acquire(50000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first_data);
  EXPECT_EQ(Bytes(again->data(), again->data() + again->size()), Bytes(50000, 0xAB));
}

TEST(TransferPathTest, TheBounceBufferIsReusedAndStillOpensAfterAnotherTransfer) {
  // The bounce pool keeps the last transfer's ciphertext: a transfer of another size over it
  // must still deliver exactly its own bytes, and the plaintext pools still come back zeroed.
  auto path = MakePath(PcieMode::kEmulated);
  const Bytes big = Pattern(300000, 3);
  const Bytes small = Pattern(1000, 4);
  for (int round = 0; round < 3; ++round) {
    auto first = path->ToDevice(big);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(Bytes(first->data(), first->data() + first->size()), big);
    first->Release();
    auto second = path->ToDevice(small);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(Bytes(second->data(), second->data() + second->size()), small);
  }
  EXPECT_GE(path->stats().bounce_pool.reused, 4u);
  auto next = path->AcquireDeviceStaging(300000);
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(AllZero(next->view()));
}

TEST(TransferPathTest, DeviceBuffersComeBackZeroedForTheNextBatch) {
  for (PcieMode mode : {PcieMode::kOff, PcieMode::kDriver, PcieMode::kEmulated}) {
    auto path = MakePath(mode);
    Bytes secret = Pattern(70000, 9);
    const uint8_t* where = nullptr;
    {
      auto device = path->ToDevice(secret);
      ASSERT_TRUE(device.ok());
      where = device->data();
    }
    auto next = path->AcquireDeviceStaging(70000);
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(next->data(), where) << PcieModeName(mode);
    EXPECT_TRUE(AllZero(next->view())) << PcieModeName(mode);
  }
}

TEST(TransferPathTest, ConcurrentTransfersShareTheThreadPool) {
  TransferOptions options;
  options.chunk_size = 4096;
  options.threads = 4;
  auto path = MakePath(PcieMode::kEmulated, options);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        Bytes data = Pattern(4096 * (1 + (t + i) % 7) + t, t * 100 + i);
        auto device = path->ToDevice(data);
        if (!device.ok() || !std::equal(data.begin(), data.end(), device->data())) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(path->stats().to_device_transfers, 120u);
}

// The host path RunBatch takes to the CPU executor: host staging, one transfer each way through
// the TransferPath (counted in its statistics), outputs gathered from pieces, a gather that
// would overrun its buffer refused.
TEST(HostBatchPathTest, GathersAndMovesThroughItsTransferPath) {
  auto transfer = MakePath(PcieMode::kEmulated);
  ASSERT_NE(transfer, nullptr);
  HostBatchPath path(*transfer);
  EXPECT_EQ(path.mode(), PcieMode::kEmulated);
  EXPECT_FALSE(path.executor_memory_on_device());
  const Bytes inputs = Pattern(10000, 3);
  auto host = path.AcquireHostStaging(inputs.size());
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE(AllZero(host->view()));
  std::memcpy(host->data, inputs.data(), inputs.size());
  auto device = path.ToDevice(host->view());
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_TRUE(std::equal(inputs.begin(), inputs.end(), device->data));

  auto outgoing = path.AcquireDeviceStaging(96);
  ASSERT_TRUE(outgoing.ok()) << outgoing.status();
  const std::array<GatherPiece, 2> pieces = {GatherPiece{0, inputs.data(), 32},
                                             GatherPiece{64, inputs.data() + 100, 32}};
  ASSERT_TRUE(path.GatherOnDevice(*outgoing, pieces).ok());
  const std::array<GatherPiece, 1> overrun = {GatherPiece{80, inputs.data(), 32}};
  absl::Status refused = path.GatherOnDevice(*outgoing, overrun);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(refused.message(), "gather of 32 bytes at 80 overruns a staging buffer of 96");
  auto back = path.ToHost(*outgoing);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size, 96u);
  EXPECT_EQ(std::memcmp(back->data, inputs.data(), 32), 0);
  EXPECT_TRUE(AllZero(ByteSpan(back->data + 32, 32)));
  EXPECT_EQ(std::memcmp(back->data + 64, inputs.data() + 100, 32), 0);
  EXPECT_EQ(transfer->stats().to_device_transfers, 1u);
  EXPECT_EQ(transfer->stats().to_host_transfers, 1u);

  device->Release();
  EXPECT_EQ(device->data, nullptr);
}

}  // namespace
}  // namespace cloister::enclave::pcie

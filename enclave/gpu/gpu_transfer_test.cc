// The GPU PCIe path (cuda_transfer.h) on a real device: round trips in every mode and size, the
// device-side decryption checked on its own (plain download of what ToDevice delivered),
// tampering in flight refused in both directions with the destination never returned, scrubbed
// pinned staging, and concurrent callers. Without a CUDA device the device tests skip, saying
// why; the option checks still run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "enclave/gpu/cuda_transfer.h"

namespace cloister::gpu {
namespace {

using enclave::pcie::PcieMode;

std::vector<uint8_t> RandomBytes(size_t size, unsigned seed) {
  std::mt19937 random(seed);
  std::vector<uint8_t> bytes(size);
  for (auto& b : bytes) b = static_cast<uint8_t>(random());
  return bytes;
}

std::vector<uint8_t> Download(const CudaBuffer& device) {
  std::vector<uint8_t> host(device.size());
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(host.data(), device.data(), host.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  return host;
}

std::unique_ptr<CudaTransferPath> MakePath(PcieMode mode, CudaTransferOptions options = {}) {
  auto path = CudaTransferPath::Create(mode, std::move(options));
  if (!path.ok()) return nullptr;
  return *std::move(path);
}

#define REQUIRE_DEVICE(path)                                             \
  if ((path) == nullptr) {                                               \
    auto status = CudaTransferPath::Create(PcieMode::kOff).status();     \
    GTEST_SKIP() << "skipping GPU PCIe path test: " << status.message(); \
  }

TEST(GpuTransferOptionsTest, BadOptionsAreRefusedWithoutTouchingADevice) {
  CudaTransferOptions options;
  options.chunk_size = 4096 + 8;
  auto path = CudaTransferPath::Create(PcieMode::kEmulated, options);
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().message(),
            "PCIe chunk size 4104 is not a multiple of 16 in 4 KiB..64 MiB");
  options.chunk_size = 4096;
  options.threads = -1;
  EXPECT_EQ(CudaTransferPath::Create(PcieMode::kEmulated, options).status().message(),
            "PCIe thread count must not be negative");
}

class GpuTransferTest : public ::testing::TestWithParam<PcieMode> {};

TEST_P(GpuTransferTest, RoundTripsEverySize) {
  auto path = MakePath(GetParam());
  REQUIRE_DEVICE(path);
  const size_t mib2 = size_t{2} << 20;
  for (size_t size :
       {size_t{0}, size_t{1}, size_t{17}, size_t{4096}, mib2 - 1, mib2, mib2 + 1, 5 * mib2 + 3}) {
    const std::vector<uint8_t> source = RandomBytes(size, static_cast<unsigned>(size));
    auto staging = path->AcquireHostStaging(size);
    ASSERT_TRUE(staging.ok()) << staging.status();
    std::copy(source.begin(), source.end(), staging->data());
    auto device = path->ToDevice(staging->view());
    ASSERT_TRUE(device.ok()) << size << ": " << device.status();
    // The device holds the plaintext (decrypted there in emulated mode).
    EXPECT_EQ(Download(*device), source) << size;
    auto back = path->ToHost(device->data(), device->size());
    ASSERT_TRUE(back.ok()) << size << ": " << back.status();
    EXPECT_EQ(std::vector<uint8_t>(back->data(), back->data() + back->size()), source) << size;
  }
  const auto stats = path->stats();
  EXPECT_EQ(stats.to_device_transfers, 8u);
  EXPECT_EQ(stats.to_host_transfers, 8u);
  EXPECT_EQ(stats.authentication_failures, 0u);
}

TEST_P(GpuTransferTest, GatherToDeviceDeliversThePiecesAsOneBuffer) {
  auto path = MakePath(GetParam());
  REQUIRE_DEVICE(path);
  // Pieces of a batch where they lie, with gaps (zeros on the device) and one piece across a
  // 2 MiB chunk boundary.
  const size_t mib2 = size_t{2} << 20;
  const std::vector<std::pair<size_t, size_t>> layout = {
      {0, 64}, {128, 5000}, {mib2 - 100, 300}, {mib2 + 4096, 1}, {mib2 + 8192, 70000}};
  const size_t size = mib2 + 8192 + 70000 + 31;
  std::vector<std::vector<uint8_t>> sources;
  std::vector<enclave::pcie::GatherPiece> pieces;
  std::vector<uint8_t> gathered(size, 0);
  for (const auto& [offset, bytes] : layout) {
    sources.push_back(RandomBytes(bytes, static_cast<unsigned>(offset + 1)));
    pieces.push_back({offset, sources.back().data(), bytes});
    std::copy(sources.back().begin(), sources.back().end(), gathered.begin() + offset);
  }
  auto device = path->GatherToDevice(size, pieces);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(Download(*device), gathered);
  // A layout that is wrong is refused before anything moves.
  std::swap(pieces[0], pieces[1]);
  EXPECT_EQ(path->GatherToDevice(size, pieces).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(path->stats().to_device_transfers, 1u);
}

TEST_P(GpuTransferTest, ConcurrentCallersEachGetTheirOwnBytes) {
  auto path = MakePath(GetParam());
  REQUIRE_DEVICE(path);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        const auto source = RandomBytes(100000 + 4099 * (t + 1) * (i + 1), t * 100 + i);
        auto device = path->ToDevice(source);
        if (!device.ok()) {
          ++wrong;
          continue;
        }
        auto back = path->ToHost(device->data(), device->size());
        if (!back.ok() ||
            std::vector<uint8_t>(back->data(), back->data() + back->size()) != source) {
          ++wrong;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuTransferTest,
                         ::testing::Values(PcieMode::kOff, PcieMode::kDriver, PcieMode::kEmulated),
                         [](const auto& info) {
                           return std::string(enclave::pcie::PcieModeName(info.param));
                         });

// The host flips one ciphertext byte in flight: the device refuses the transfer, naming the
// chunk; the way back is refused by the CPU side the same way.
TEST(GpuTransferTamperTest, ModifiedCiphertextIsRefusedBothWays) {
  std::atomic<int> tamper_call{-1};  // which hook call flips a byte
  std::atomic<int> calls{0};
  std::atomic<size_t> flip_at{0};
  CudaTransferOptions options;
  options.chunk_size = 64 << 10;
  options.in_flight_hook_for_test = [&](std::span<uint8_t> sealed) {
    if (calls.fetch_add(1) == tamper_call.load()) sealed[flip_at.load() % sealed.size()] ^= 0x40;
  };
  auto path = MakePath(PcieMode::kEmulated, options);
  REQUIRE_DEVICE(path);
  const auto source = RandomBytes(3 * (64 << 10) + 100, 7);

  // To the device, a byte in the second chunk.
  tamper_call = 0;
  flip_at = (64 << 10) + 16 + 5;
  auto refused = path->ToDevice(source);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "chunk 2 of 4")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "to the device"));

  // A clean transfer still works afterwards (hook call 1 is not tampered).
  tamper_call = 100;
  auto device = path->ToDevice(source);
  ASSERT_TRUE(device.ok()) << device.status();

  // To the host, the last chunk's tag.
  calls = 0;
  tamper_call = 0;
  flip_at = 3 * ((64 << 10) + 16) + 100 + 3;
  auto back = path->ToHost(device->data(), device->size());
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(back.status().message(), "chunk 4 of 4")) << back.status();
  EXPECT_TRUE(absl::StrContains(back.status().message(), "to the host"));
  EXPECT_EQ(path->stats().authentication_failures, 2u);
}

// A pinned staging block is zero when it comes back for the next batch.
TEST(GpuTransferScrubTest, PinnedStagingIsZeroedBetweenLeases) {
  auto path = MakePath(PcieMode::kOff);
  REQUIRE_DEVICE(path);
  const uint8_t* first_block = nullptr;
  {
    auto staging = path->AcquireHostStaging(100000);
    ASSERT_TRUE(staging.ok());
    std::fill(staging->data(), staging->data() + staging->size(), 0xCD);
    first_block = staging->data();
  }
  auto again = path->AcquireHostStaging(100000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first_block);  // the same block, reused
  for (size_t i = 0; i < again->size(); ++i) ASSERT_EQ(again->data()[i], 0) << i;
}

}  // namespace
}  // namespace cloister::gpu

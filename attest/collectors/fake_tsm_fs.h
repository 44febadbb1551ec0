// TEST ONLY: test doubles for the collectors' tests, never linked into a program.
//   * FakeTsmFs plays the kernel's configfs-tsm on a temp directory: mkdir of an entry under
//     the root creates its attribute files (provider, generation, privlevel_floor); writes to
//     inblob and privlevel bump generation; reading outblob asks a callback for the report
//     over the inblob; auxblob is a fixed blob (or absent, as for TDX); rmdir removes it all.
//   * SimSnpSignerForTest makes real-format SEV-SNP reports signed by the VCEK key of a
//     simulated TEE directory (attest/sim), and the matching certificate table.
//   * BuildSnpCertTableForTest lays out a certificate table from (GUID, bytes) pairs.
// Thread-safety: not thread-safe; one test at a time.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "attest/collectors/tsm.h"
#include "attest/sim/sim_tee.h"
#include "base/bytes.h"
#include "crypto/ecdsa.h"

namespace cloister::attest::testing {

class FakeTsmFs : public TsmFs {
 public:
  using OutblobMaker =
      std::function<absl::StatusOr<Bytes>(ByteSpan inblob, std::optional<uint32_t> privlevel)>;

  // `root` must exist (the test's temp dir stands for /sys/kernel/config/tsm/report).
  FakeTsmFs(std::string root, std::string provider, OutblobMaker make_outblob,
            std::optional<Bytes> auxblob);

  // The next `count` reads of outblob behave as if another process wrote the entry while
  // the report was being made (generation moves on).
  void SimulateConcurrentWritesForTest(int count) { concurrent_writes_ = count; }
  int entries_made() const { return entries_made_; }
  int entries_removed() const { return entries_removed_; }
  int outblob_reads() const { return outblob_reads_; }
  // privlevel values written, in order.
  const std::vector<uint32_t>& privlevels_written() const { return privlevels_written_; }

  bool IsDirectory(const std::string& path) override;
  absl::Status MakeDir(const std::string& path) override;
  absl::Status RemoveDir(const std::string& path) override;
  absl::Status Write(const std::string& path, ByteSpan data) override;
  absl::StatusOr<Bytes> Read(const std::string& path, size_t max_size) override;

 private:
  struct Entry {
    Bytes inblob;
    std::optional<uint32_t> privlevel;
    uint64_t generation = 0;
  };
  // Splits "<root>/<entry>/<attribute>"; NotFound for a path outside a live entry.
  absl::StatusOr<std::pair<Entry*, std::string>> Attribute(const std::string& path);
  absl::Status Bump(const std::string& entry_path, Entry& entry);

  std::string root_;
  std::string provider_;
  OutblobMaker make_outblob_;
  std::optional<Bytes> auxblob_;
  std::map<std::string, Entry> entries_;  // by entry path
  int concurrent_writes_ = 0;
  int entries_made_ = 0;
  int entries_removed_ = 0;
  int outblob_reads_ = 0;
  std::vector<uint32_t> privlevels_written_;
};

// A certificate table: one 24-byte entry per pair (GUID text, bytes), the all-zero
// terminator, then the bytes in order.
Bytes BuildSnpCertTableForTest(const std::vector<std::pair<std::string_view, Bytes>>& certs);

class SimSnpSignerForTest {
 public:
  // Creates (or loads) the simulated TEE in `sim_dir`.
  static absl::StatusOr<std::unique_ptr<SimSnpSignerForTest>> Create(const std::string& sim_dir);

  // A signed 1184-byte report with REPORT_DATA = `report_data` (zero-padded to 64 bytes) and
  // VMPL = `vmpl`, as the firmware would make it on the simulated chip.
  absl::StatusOr<Bytes> Report(ByteSpan report_data, uint32_t vmpl) const;
  // The certificate table a host would give: VCEK, ASK and ARK in DER.
  Bytes CertTable() const;
  const SimRootCertificates& certificates() const { return *certificates_; }
  Bytes measurement() const { return Bytes(48, 0x5A); }

 private:
  SimSnpSignerForTest() = default;
  std::unique_ptr<crypto::EcPrivateKey> vcek_key_;
  std::optional<SimRootCertificates> certificates_;
  Bytes chip_id_;
  uint64_t tcb_ = 0;
};

}  // namespace cloister::attest::testing

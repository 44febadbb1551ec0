// The simulated TEE and GPU: a development backend built like the real ones (DESIGN.md
// section 4). A simulated data directory holds two certificate chains made on first use, a
// CVM chain ("Cloister Simulated ARK" -> "ASK" -> "VCEK", P-384, the VCEK carrying a random
// 64-byte CHIP_ID and the TCB in AMD's extensions) and a GPU chain ("Cloister Simulated Device
// Identity CA" -> intermediate -> "Cloister Simulated GPU FMC LF", whose TCG DICE extension
// ends in the firmware ID), the two signing keys, and a random sealing secret. The collector
// produces real-format evidence: SPDM 1.1 GPU reports signed by the GPU leaf key and a
// 1184-byte SEV-SNP-layout CVM report signed by the VCEK key. Only a development policy that
// pins this directory's roots accepts it.
// Thread-safety: EnsureSimRoots serializes concurrent callers on one directory with a file
// lock; SimCollector is immutable after creation and safe to share between threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "attest/collector.h"
#include "attest/x509.h"
#include "base/bytes.h"
#include "base/clock.h"
#include "base/secret_bytes.h"
#include "crypto/ecdsa.h"

namespace cloister::attest {

// Names of the files in a simulated TEE directory.
inline constexpr std::string_view kSimCvmRootFile = "cvm_ark.pem";
inline constexpr std::string_view kSimCvmIntermediateFile = "cvm_ask.pem";
inline constexpr std::string_view kSimCvmLeafFile = "cvm_vcek.pem";
inline constexpr std::string_view kSimCvmLeafKeyFile = "cvm_vcek_key.pem";
inline constexpr std::string_view kSimGpuRootFile = "gpu_root.pem";
inline constexpr std::string_view kSimGpuIntermediateFile = "gpu_ica.pem";
inline constexpr std::string_view kSimGpuLeafFile = "gpu_leaf.pem";
inline constexpr std::string_view kSimGpuLeafKeyFile = "gpu_leaf_key.pem";
inline constexpr std::string_view kSimSealingSecretFile = "sealing_secret";
inline constexpr size_t kSimSealingSecretSize = 32;
inline constexpr size_t kSimChipIdSize = 64;

inline constexpr std::string_view kSimProductName = "Cloister-Sim";

struct SimOptions {
  uint32_t gpu_count = 1;  // 0 for a CPU-only bundle (gpu_type NONE); at most 16
  std::string driver_version = "550.90.07";
  std::string vbios_version = "96.00.9F.00.01";
  bool debug = false;            // sets the DEBUG bit of the CVM policy
  const Clock* clock = nullptr;  // for collected_at; nullptr means Clock::Real()
};

// Creates the simulated roots, keys and sealing secret in `sim_dir` (made 0700 if missing;
// keys and secret 0600, certificates 0644) unless they are all there, in which case it checks
// them (every file parses, the chains verify, the keys match their certificates, key files are
// not readable by others). FailedPrecondition for a half-present set, DataLoss for a corrupt
// one: neither is repaired, since new roots would invalidate every policy that trusts the old.
absl::Status EnsureSimRoots(const std::string& sim_dir);

// The public certificates of a checked simulated TEE directory, chains leaf first.
struct SimRootCertificates {
  Certificate cvm_root;
  Certificate gpu_root;
  std::vector<Certificate> cvm_chain;  // VCEK, ASK, ARK
  std::vector<Certificate> gpu_chain;  // leaf, intermediate, root
};
absl::StatusOr<SimRootCertificates> LoadSimRootCertificates(const std::string& sim_dir);

// The simulated GPU firmware's reference measurements (its "RIM"): block index -> SHA-384
// digest, derived deterministically from the driver and VBIOS versions. Blocks not listed are
// all-zero in reports.
std::map<uint8_t, Bytes> SimGpuReferenceMeasurements(std::string_view driver_version,
                                                     std::string_view vbios_version);

class SimCollector : public EvidenceCollector {
 public:
  // Bundles with tee_type SIM, gpu_type SIM (NONE when gpu_count is 0), one SPDM report and
  // chain per GPU, and the CVM report with MEASUREMENT = `enclave_measurement` and REPORT_DATA
  // = ReportData(nonce, GPU reports, keys).
  absl::StatusOr<v1::EvidenceBundle> Collect(ByteSpan nonce, ByteSpan hpke_public_key,
                                             ByteSpan signing_public_key) override;

 private:
  friend absl::StatusOr<std::unique_ptr<EvidenceCollector>> MakeSimCollector(const std::string&,
                                                                             Bytes, SimOptions);
  SimCollector() = default;
  absl::StatusOr<Bytes> GpuReport(ByteSpan requester_nonce) const;
  absl::StatusOr<Bytes> CvmReport(ByteSpan report_data) const;

  std::unique_ptr<crypto::EcPrivateKey> vcek_key_;
  std::unique_ptr<crypto::EcPrivateKey> gpu_key_;
  std::string cvm_chain_pem_;
  std::string gpu_chain_pem_;
  Bytes chip_id_;
  uint64_t tcb_ = 0;
  Bytes fwid_;
  Bytes report_id_;  // per simulated guest launch
  Bytes measurement_;
  std::map<uint8_t, Bytes> gpu_measurements_;
  SimOptions options_;
};

// Loads and checks the simulated TEE in `sim_dir` (EnsureSimRoots must have created it).
// InvalidArgument for a measurement that is not 48 bytes or bad options (gpu_count above 16,
// malformed VBIOS version).
absl::StatusOr<std::unique_ptr<EvidenceCollector>> MakeSimCollector(const std::string& sim_dir,
                                                                    Bytes enclave_measurement,
                                                                    SimOptions options = {});

// The simulated sealing key for an enclave measurement (48 bytes) and a purpose label:
// HKDF-SHA256(salt "cloister/v1 sim sealing", ikm the sealing secret,
// info LP(measurement) || LP(label)), 32 bytes. A different measurement gives an unrelated key.
absl::StatusOr<SecretBytes> SimSealingKey(const std::string& sim_dir, ByteSpan measurement,
                                          ByteSpan label);

}  // namespace cloister::attest

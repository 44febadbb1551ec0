// The simulated collector: real-format SPDM GPU reports and an SEV-SNP-layout CVM report,
// signed by the keys of a simulated TEE directory.

#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/sim/sim_files.h"
#include "attest/sim/sim_tee.h"
#include "attest/snp_report.h"
#include "attest/spdm.h"
#include "base/status.h"
#include "crypto/random.h"

namespace cloister::attest {
namespace {

constexpr uint8_t kMeasurementBlockCount = 64;
constexpr uint8_t kDigestValueType = 0x01;  // DMTF: digest of mutable firmware
constexpr uint32_t kSimBoardId = 0x0C15;
constexpr uint8_t kNvdecEnabled = 0xAA;
constexpr uint8_t kProtectedPcieOff = 0x55;
constexpr uint64_t kFeatureFlagSpt = 0;  // one GPU per CVM
// CPUID of the simulated chip (family 19h, a Genoa-like model) and its firmware version.
constexpr uint8_t kSimCpuFamily = 0x19;
constexpr uint8_t kSimCpuModel = 0x11;
constexpr uint8_t kSimCpuStepping = 0x01;
constexpr uint8_t kSimFirmwareBuild = 21;
constexpr uint8_t kSimFirmwareMinor = 55;
constexpr uint8_t kSimFirmwareMajor = 1;

// Text opaque fields are NUL-terminated and padded like the firmware's.
Bytes Text(absl::string_view text, size_t size) {
  Bytes out(text.begin(), text.end());
  out.resize(std::max(size, text.size() + 1), 0);
  return out;
}
Bytes LittleEndian(uint64_t value, size_t width) {
  Bytes out(width);
  for (size_t i = 0; i < width; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
  return out;
}

absl::Status CheckSize(ByteSpan value, size_t size, absl::string_view what) {
  if (value.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", value.size(), " bytes, expected ", size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EvidenceCollector>> MakeSimCollector(const std::string& sim_dir,
                                                                    Bytes enclave_measurement,
                                                                    SimOptions options) {
  RETURN_IF_ERROR(CheckSize(enclave_measurement, 48, "enclave measurement"));
  if (options.gpu_count > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_count ", options.gpu_count, " is more than the 16 supported"));
  }
  RETURN_IF_ERROR(EncodeVbiosVersion(options.vbios_version).status());
  if (options.driver_version.empty() || options.driver_version.size() > 32) {
    return absl::InvalidArgumentError("driver version must be 1 to 32 characters");
  }
  ASSIGN_OR_RETURN(sim_internal::SimSet set, sim_internal::LoadSimSet(sim_dir));
  std::unique_ptr<SimCollector> collector(new SimCollector());
  collector->vcek_key_ = std::move(set.vcek_key);
  collector->gpu_key_ = std::move(set.gpu_key);
  collector->cvm_chain_pem_ = ChainToPem(set.certificates.cvm_chain);
  collector->gpu_chain_pem_ = ChainToPem(set.certificates.gpu_chain);
  collector->chip_id_ = std::move(set.chip_id);
  collector->tcb_ = set.tcb;
  collector->fwid_ = std::move(set.fwid);
  collector->report_id_ = crypto::RandomBytes(32);
  collector->measurement_ = std::move(enclave_measurement);
  collector->gpu_measurements_ =
      SimGpuReferenceMeasurements(options.driver_version, options.vbios_version);
  if (options.clock == nullptr) options.clock = Clock::Real();
  collector->options_ = std::move(options);
  return collector;
}

absl::StatusOr<Bytes> SimCollector::GpuReport(ByteSpan requester_nonce) const {
  SpdmReport report;
  report.requester_nonce.assign(requester_nonce.begin(), requester_nonce.end());
  for (uint8_t index = 1; index <= kMeasurementBlockCount; ++index) {
    auto it = gpu_measurements_.find(index);
    report.blocks.push_back({.index = index,
                             .value_type = kDigestValueType,
                             .value = it != gpu_measurements_.end() ? it->second : Bytes(48, 0)});
  }
  report.responder_nonce = crypto::RandomBytes(kSpdmNonceSize);

  Bytes counters;
  for (uint8_t index = 1; index <= kMeasurementBlockCount; ++index) {
    Append(counters, LittleEndian(gpu_measurements_.count(index) ? 1 : 0, 4));
  }
  ASSIGN_OR_RETURN(Bytes vbios, EncodeVbiosVersion(options_.vbios_version));
  // In the order Hopper firmware writes them.
  const std::pair<OpaqueType, Bytes> fields[] = {
      {OpaqueType::kVbiosVersion, vbios},
      {OpaqueType::kBoardId, LittleEndian(kSimBoardId, 4)},
      {OpaqueType::kChipSku, Text("SIM", 9)},
      {OpaqueType::kChipSkuMod, Text("0", 5)},
      {OpaqueType::kProject, Text("SIM0", 5)},
      {OpaqueType::kProjectSku, Text("0000", 5)},
      {OpaqueType::kProjectSkuMod, Text("", 2)},
      {OpaqueType::kDriverVersion, Text(options_.driver_version, 0)},
      {OpaqueType::kMsrsCount, counters},
      {OpaqueType::kNvdec0Status, {kNvdecEnabled}},
      {OpaqueType::kFwid, fwid_},
      {OpaqueType::kProtectedPcieStatus, {kProtectedPcieOff}},
      {OpaqueType::kOpaqueDataVersion, LittleEndian(1, 1)},
      {OpaqueType::kFeatureFlag, LittleEndian(kFeatureFlagSpt, 1)},
  };
  for (const auto& [type, value] : fields) {
    report.opaque_field_order.push_back(static_cast<uint16_t>(type));
    report.opaque_fields[static_cast<uint16_t>(type)] = value;
  }
  ASSIGN_OR_RETURN(Bytes bytes, EncodeSpdmReportToSign(report));
  ASSIGN_OR_RETURN(Bytes signature, gpu_key_->SignP1363(crypto::HashAlg::kSha384, bytes));
  CLOISTER_CHECK(signature.size() == kSpdmSignatureSize);
  Append(bytes, signature);
  return bytes;
}

absl::StatusOr<Bytes> SimCollector::CvmReport(ByteSpan report_data) const {
  SnpReport report;
  report.version = 3;
  report.guest_svn = 0;
  report.policy = kSnpPolicyReservedOne | kSnpPolicySmtAllowed;
  if (options_.debug) report.policy |= kSnpPolicyDebug;
  report.family_id = Bytes(16, 0);
  report.image_id = Bytes(16, 0);
  report.vmpl = 0;
  report.signature_algo = kSnpSignatureAlgoEcdsaP384Sha384;
  report.current_tcb = tcb_;
  report.platform_info = 1;  // SMT enabled
  report.signer_info = kSnpSigningKeyVcek << 2;
  report.report_data.assign(report_data.begin(), report_data.end());
  report.measurement = measurement_;
  report.host_data = Bytes(32, 0);
  report.id_key_digest = Bytes(48, 0);
  report.author_key_digest = Bytes(48, 0);
  report.report_id = report_id_;
  report.report_id_ma = Bytes(32, 0xFF);  // no migration agent
  report.reported_tcb = tcb_;
  report.cpuid_family = kSimCpuFamily;
  report.cpuid_model = kSimCpuModel;
  report.cpuid_stepping = kSimCpuStepping;
  report.chip_id = chip_id_;
  report.committed_tcb = tcb_;
  report.current_build = report.committed_build = kSimFirmwareBuild;
  report.current_minor = report.committed_minor = kSimFirmwareMinor;
  report.current_major = report.committed_major = kSimFirmwareMajor;
  report.launch_tcb = tcb_;
  ASSIGN_OR_RETURN(Bytes bytes, EncodeSnpReportToSign(report));
  ASSIGN_OR_RETURN(Bytes signature, vcek_key_->SignP1363(crypto::HashAlg::kSha384,
                                                         ByteSpan(bytes).first(kSnpSignedSize)));
  RETURN_IF_ERROR(SetSnpSignature(bytes, signature));
  return bytes;
}

absl::StatusOr<v1::EvidenceBundle> SimCollector::Collect(ByteSpan nonce, ByteSpan hpke_public_key,
                                                         ByteSpan signing_public_key) {
  RETURN_IF_ERROR(CheckSize(nonce, kNonceSize, "nonce"));
  RETURN_IF_ERROR(CheckSize(hpke_public_key, 32, "enclave HPKE public key"));
  RETURN_IF_ERROR(CheckSize(signing_public_key, 32, "enclave signing public key"));

  v1::EvidenceBundle bundle;
  bundle.set_tee_type(v1::TEE_TYPE_SIM);
  bundle.set_gpu_type(options_.gpu_count > 0 ? v1::GPU_TYPE_SIM : v1::GPU_TYPE_NONE);
  std::vector<Bytes> gpu_reports;
  for (uint32_t i = 0; i < options_.gpu_count; ++i) {
    ASSIGN_OR_RETURN(Bytes report, GpuReport(GpuRequesterNonce(nonce, hpke_public_key, i)));
    v1::GpuEvidence* gpu = bundle.add_gpus();
    gpu->set_spdm_report(ToString(report));
    gpu->set_cert_chain_pem(gpu_chain_pem_);
    gpu->set_arch("SIM");
    gpu_reports.push_back(std::move(report));
  }
  ASSIGN_OR_RETURN(Bytes cvm_report,
                   CvmReport(ReportData(nonce, gpu_reports, hpke_public_key, signing_public_key)));
  bundle.set_cvm_report(ToString(cvm_report));
  bundle.set_cvm_cert_chain_pem(cvm_chain_pem_);
  bundle.set_enclave_hpke_public_key(ToString(hpke_public_key));
  bundle.set_enclave_signing_public_key(ToString(signing_public_key));
  bundle.set_nonce(ToString(nonce));
  bundle.set_collected_at_unix(absl::ToUnixSeconds(options_.clock->Now()));
  return bundle;
}

}  // namespace cloister::attest

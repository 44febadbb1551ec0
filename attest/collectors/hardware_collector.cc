// The hardware collector: NVML GPU reports, the binding, and the CVM report from
// configfs-tsm or /dev/sev-guest.

#include "attest/collectors/hardware_collector.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "attest/binding.h"
#include "attest/snp_report.h"
#include "attest/string_view.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/hkdf.h"

namespace cloister::attest {
namespace {

constexpr uint32_t kNvmlEnvironmentHardware = 2;
constexpr uint32_t kArchHopper = 9;
constexpr uint32_t kArchBlackwell = 10;

// TDX quote layout (shared/specs/attestation-formats.md section 10.2): the minimum the
// collector checks before it hands the quote on; the verifier parses it fully.
constexpr size_t kTdxHeaderSize = 48;
constexpr size_t kTdxBody10Size = 584;
constexpr size_t kTdxReportDataInBody = 0x208;
constexpr uint32_t kTdxTeeTypeTdx = 0x81;

absl::Status CheckSize(ByteSpan value, size_t size, std::string_view what) {
  if (value.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(what), " is ", value.size(), " bytes, expected ", size));
  }
  return absl::OkStatus();
}

uint32_t LoadLe(ByteSpan bytes, size_t offset, size_t width) {
  uint32_t value = 0;
  for (size_t i = 0; i < width; ++i) value |= static_cast<uint32_t>(bytes[offset + i]) << (8 * i);
  return value;
}

// NVML opened and checked for evidence collection: CC on in a hardware environment, and
// at least one GPU, every one Hopper or Blackwell.
absl::StatusOr<std::unique_ptr<NvmlGpus>> OpenCheckedGpus(const HardwareOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<NvmlGpus> gpus, NvmlGpus::Open(options.nvml_library));
  const NvmlCcState& state = gpus->cc_state();
  if (state.environment != kNvmlEnvironmentHardware) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU confidential computing is not in the hardware environment "
                     "(nvmlSystemGetConfComputeState: environment=",
                     state.environment, ")"));
  }
  if (gpus->gpus().empty()) {
    return absl::FailedPreconditionError("NVML found no GPU (nvmlDeviceGetCount_v2 returned 0)");
  }
  for (const NvmlGpuInfo& gpu : gpus->gpus()) {
    if (gpu.architecture_code != kArchHopper && gpu.architecture_code != kArchBlackwell) {
      return absl::FailedPreconditionError(
          absl::StrCat("GPU ", gpu.index, " (", gpu.uuid, ") is ", gpu.architecture,
                       ", not Hopper or Blackwell: it has no confidential computing"));
    }
  }
  if (state.dev_tools_mode) {
    Log(LogLevel::kWarning, "gpu_cc_devtools_mode",
        {{"detail", "GPU confidential computing runs in devtools mode"}});
  }
  return gpus;
}

// Checks that the TDX quote is a TDX quote carrying `report_data` as its REPORTDATA.
absl::Status CheckTdxQuote(ByteSpan quote, ByteSpan report_data) {
  if (quote.size() < kTdxHeaderSize + kTdxBody10Size) {
    return absl::DataLossError(
        absl::StrCat("the TDX quote is ", quote.size(), " bytes, too short for a quote"));
  }
  uint32_t version = LoadLe(quote, 0, 2);
  uint32_t tee_type = LoadLe(quote, 4, 4);
  if (tee_type != kTdxTeeTypeTdx) {
    return absl::DataLossError(
        absl::StrCat("the quote's TEE type is 0x", absl::Hex(tee_type), ", not TDX (0x81)"));
  }
  size_t body = kTdxHeaderSize;
  if (version == 5) {
    body += 6;  // body type (2 bytes) and body size (4 bytes)
  } else if (version != 4) {
    return absl::DataLossError(absl::StrCat("the TDX quote has version ", version, ", not 4 or 5"));
  }
  if (quote.size() < body + kTdxReportDataInBody + 64) {
    return absl::DataLossError("the TDX quote is too short for its REPORTDATA");
  }
  if (!std::equal(report_data.begin(), report_data.end(),
                  quote.begin() + body + kTdxReportDataInBody)) {
    return absl::DataLossError("the TDX quote's REPORTDATA is not the one requested");
  }
  return absl::OkStatus();
}

class HardwareCollector : public EvidenceCollector {
 public:
  HardwareCollector(HardwareOptions options, std::unique_ptr<NvmlGpus> gpus)
      : options_(std::move(options)), gpus_(std::move(gpus)) {}

  absl::StatusOr<v1::EvidenceBundle> Collect(ByteSpan nonce, ByteSpan hpke_public_key,
                                             ByteSpan signing_public_key) override {
    RETURN_IF_ERROR(CheckSize(nonce, kNonceSize, "nonce"));
    RETURN_IF_ERROR(CheckSize(hpke_public_key, 32, "enclave HPKE public key"));
    RETURN_IF_ERROR(CheckSize(signing_public_key, 32, "enclave signing public key"));
    std::lock_guard<std::mutex> lock(mu_);

    v1::EvidenceBundle bundle;
    std::vector<Bytes> gpu_reports;
    if (gpus_ != nullptr) {
      bundle.set_gpu_type(v1::GPU_TYPE_NVIDIA_CC);
      for (const NvmlGpuInfo& info : gpus_->gpus()) {
        ASSIGN_OR_RETURN(Bytes report,
                         gpus_->AttestationReport(
                             info.index, GpuRequesterNonce(nonce, hpke_public_key, info.index)));
        ASSIGN_OR_RETURN(std::string chain, gpus_->CertificateChainPem(info.index));
        v1::GpuEvidence* gpu = bundle.add_gpus();
        gpu->set_spdm_report(ToString(report));
        gpu->set_cert_chain_pem(std::move(chain));
        gpu->set_arch(info.architecture);
        gpu_reports.push_back(std::move(report));
      }
    } else {
      bundle.set_gpu_type(v1::GPU_TYPE_NONE);
    }
    Bytes report_data = ReportData(nonce, gpu_reports, hpke_public_key, signing_public_key);
    if (options_.tee == HardwareTee::kSevSnp) {
      bundle.set_tee_type(v1::TEE_TYPE_SEV_SNP);
      RETURN_IF_ERROR(CollectSnp(report_data, bundle));
    } else {
      bundle.set_tee_type(v1::TEE_TYPE_TDX);
      TsmReportRequest request{.inblob = report_data,
                               .privlevel = std::nullopt,
                               .expected_provider = std::string(kTsmProviderTdxGuest)};
      ASSIGN_OR_RETURN(TsmReport report, GetTsmReport(fs(), options_.tsm_root, request));
      RETURN_IF_ERROR(CheckTdxQuote(report.outblob, report_data));
      bundle.set_cvm_report(ToString(report.outblob));
      // The quote carries its PCK chain in its certification data.
    }
    bundle.set_enclave_hpke_public_key(ToString(hpke_public_key));
    bundle.set_enclave_signing_public_key(ToString(signing_public_key));
    bundle.set_nonce(ToString(nonce));
    const Clock* clock = options_.clock != nullptr ? options_.clock : Clock::Real();
    bundle.set_collected_at_unix(absl::ToUnixSeconds(clock->Now()));
    return bundle;
  }

 private:
  TsmFs& fs() { return options_.tsm_fs != nullptr ? *options_.tsm_fs : TsmFs::Real(); }

  // Called with mu_ held.
  absl::Status CollectSnp(const Bytes& report_data, v1::EvidenceBundle& bundle) {
    Bytes report;
    Bytes table;
    if (fs().IsDirectory(options_.tsm_root)) {
      TsmReportRequest request{.inblob = report_data,
                               .privlevel = options_.privlevel,
                               .expected_provider = std::string(kTsmProviderSevGuest)};
      ASSIGN_OR_RETURN(TsmReport tsm, GetTsmReport(fs(), options_.tsm_root, request));
      report = std::move(tsm.outblob);
      table = std::move(tsm.auxblob);
    } else {
      ASSIGN_OR_RETURN(SevGuestReport guest,
                       GetSevGuestReport(options_.sev_guest_device, report_data,
                                         options_.privlevel.value_or(0)));
      report = std::move(guest.report);
      table = std::move(guest.certificate_table);
    }
    auto parsed = ParseSnpReport(report);
    if (!parsed.ok()) {
      return absl::DataLossError(
          absl::StrCat("the SNP report does not parse: ", parsed.status().message()));
    }
    if (parsed->report_data != report_data) {
      return absl::DataLossError("the SNP report's REPORT_DATA is not the one requested");
    }
    auto entries = ParseSnpCertTable(table);
    if (!entries.ok()) {
      return absl::DataLossError(
          absl::StrCat("the host's certificates are unusable: ", entries.status().message()));
    }
    std::string chain = SnpCertChainPem(*entries, parsed->signing_key());
    if (chain.empty()) {
      Log(LogLevel::kWarning, "snp_no_host_certificates",
          {{"detail", "the host gave no VCEK/VLEK; verifiers must fetch it from AMD KDS"}});
    }
    bundle.set_cvm_report(ToString(report));
    bundle.set_cvm_cert_chain_pem(std::move(chain));
    return absl::OkStatus();
  }

  const HardwareOptions options_;
  const std::unique_ptr<NvmlGpus> gpus_;  // null for gpu: none
  std::mutex mu_;
};

}  // namespace

absl::Status CheckGpuReady(const HardwareOptions& options) {
  if (options.gpu == HardwareGpu::kNone) return absl::OkStatus();
  return OpenCheckedGpus(options).status();
}

absl::StatusOr<std::unique_ptr<EvidenceCollector>> MakeHardwareCollector(HardwareOptions options) {
  if (options.privlevel.has_value() && *options.privlevel > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("privlevel ", *options.privlevel, " is above 3"));
  }
  TsmFs& fs = options.tsm_fs != nullptr ? *options.tsm_fs : TsmFs::Real();
  bool have_tsm = fs.IsDirectory(options.tsm_root);
  if (options.tee == HardwareTee::kSevSnp) {
    if (!have_tsm && !FileExists(options.sev_guest_device)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no SEV-SNP guest interface: configfs-tsm is not at ", options.tsm_root, " and ",
          options.sev_guest_device, " does not exist (is this an SEV-SNP guest?)"));
    }
  } else if (!have_tsm) {
    return absl::FailedPreconditionError(
        absl::StrCat("no configfs-tsm at ", options.tsm_root,
                     ": TDX quotes need Linux 6.7 or newer in a TDX guest"));
  }
  std::unique_ptr<NvmlGpus> gpus;
  if (options.gpu == HardwareGpu::kNvidiaCc) {
    ASSIGN_OR_RETURN(gpus, OpenCheckedGpus(options));
  }
  return std::make_unique<HardwareCollector>(std::move(options), std::move(gpus));
}

absl::StatusOr<SecretBytes> HardwareSealingKey(const HardwareOptions& options, ByteSpan label) {
  if (options.tee == HardwareTee::kTdx) {
    return absl::UnimplementedError("TDX sealing needs a key service (not configured)");
  }
  SnpDerivedKeyRequest request;
  request.guest_field_select = kSnpKeyFieldMeasurement | kSnpKeyFieldPolicy;
  request.vmpl = options.privlevel.value_or(0);
  ASSIGN_OR_RETURN(SecretBytes firmware_key, GetSnpDerivedKey(options.sev_guest_device, request));
  Bytes info;
  AppendLengthPrefixed(info, label);
  return crypto::Hkdf(crypto::HashAlg::kSha256, AsBytes("cloister/v1 snp sealing"),
                      firmware_key.span(), info, 32);
}

}  // namespace cloister::attest

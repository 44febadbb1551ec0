// TEST ONLY: FakeTsmFs, BuildSnpCertTableForTest and SimSnpSignerForTest.

#include "attest/collectors/fake_tsm_fs.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "attest/snp_report.h"
#include "base/file.h"
#include "base/status.h"

namespace cloister::attest::testing {

FakeTsmFs::FakeTsmFs(std::string root, std::string provider, OutblobMaker make_outblob,
                     std::optional<Bytes> auxblob)
    : root_(std::move(root)),
      provider_(std::move(provider)),
      make_outblob_(std::move(make_outblob)),
      auxblob_(std::move(auxblob)) {}

bool FakeTsmFs::IsDirectory(const std::string& path) { return TsmFs::Real().IsDirectory(path); }

absl::Status FakeTsmFs::MakeDir(const std::string& path) {
  std::filesystem::path p(path);
  if (p.parent_path() != std::filesystem::path(root_)) {
    return absl::PermissionDeniedError(absl::StrCat("mkdir ", path, ": not a report entry"));
  }
  RETURN_IF_ERROR(TsmFs::Real().MakeDir(path));
  // What configfs shows in a new entry.
  RETURN_IF_ERROR(WriteFileAtomic(path + "/provider", provider_ + "\n", 0444));
  RETURN_IF_ERROR(WriteFileAtomic(path + "/generation", "0\n", 0444));
  RETURN_IF_ERROR(WriteFileAtomic(path + "/privlevel_floor", "0\n", 0444));
  entries_[path] = Entry{};
  ++entries_made_;
  return absl::OkStatus();
}

absl::Status FakeTsmFs::RemoveDir(const std::string& path) {
  auto it = entries_.find(path);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("rmdir ", path, ": no entry"));
  std::error_code error;
  std::filesystem::remove_all(path, error);
  if (error) return absl::InternalError(absl::StrCat("rmdir ", path, ": ", error.message()));
  entries_.erase(it);
  ++entries_removed_;
  return absl::OkStatus();
}

absl::StatusOr<std::pair<FakeTsmFs::Entry*, std::string>> FakeTsmFs::Attribute(
    const std::string& path) {
  std::filesystem::path p(path);
  auto it = entries_.find(p.parent_path().string());
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(path, ": No such file"));
  return std::make_pair(&it->second, p.filename().string());
}

absl::Status FakeTsmFs::Bump(const std::string& entry_path, Entry& entry) {
  ++entry.generation;
  return WriteFileAtomic(entry_path + "/generation", absl::StrCat(entry.generation, "\n"), 0444);
}

absl::Status FakeTsmFs::Write(const std::string& path, ByteSpan data) {
  ASSIGN_OR_RETURN(auto attribute, Attribute(path));
  auto [entry, name] = attribute;
  std::string entry_path = std::filesystem::path(path).parent_path().string();
  if (name == "inblob") {
    if (data.size() > kTsmMaxInblobSize) {
      return absl::InvalidArgumentError(absl::StrCat("writing ", path, ": File too large"));
    }
    entry->inblob.assign(data.begin(), data.end());
    return Bump(entry_path, *entry);
  }
  if (name == "privlevel") {
    uint32_t level = 0;
    if (!absl::SimpleAtoi(ToString(data), &level) || level > 3) {
      return absl::InvalidArgumentError(absl::StrCat("writing ", path, ": Invalid argument"));
    }
    entry->privlevel = level;
    privlevels_written_.push_back(level);
    return Bump(entry_path, *entry);
  }
  return absl::PermissionDeniedError(absl::StrCat("opening ", path, " for writing: read-only"));
}

absl::StatusOr<Bytes> FakeTsmFs::Read(const std::string& path, size_t max_size) {
  ASSIGN_OR_RETURN(auto attribute, Attribute(path));
  auto [entry, name] = attribute;
  if (name == "outblob") {
    ++outblob_reads_;
    if (concurrent_writes_ > 0) {
      --concurrent_writes_;
      RETURN_IF_ERROR(Bump(std::filesystem::path(path).parent_path().string(), *entry));
    }
    ASSIGN_OR_RETURN(Bytes outblob, make_outblob_(entry->inblob, entry->privlevel));
    if (outblob.size() > max_size) return absl::OutOfRangeError(absl::StrCat(path, " too large"));
    return outblob;
  }
  if (name == "auxblob") {
    if (!auxblob_.has_value()) return absl::NotFoundError(absl::StrCat(path, ": No such file"));
    return *auxblob_;
  }
  if (name == "inblob" || name == "privlevel") {
    return absl::PermissionDeniedError(absl::StrCat("opening ", path, ": write-only"));
  }
  return TsmFs::Real().Read(path, max_size);
}

Bytes BuildSnpCertTableForTest(const std::vector<std::pair<std::string_view, Bytes>>& certs) {
  Bytes table;
  size_t offset = (certs.size() + 1) * kSnpCertTableEntrySize;
  for (const auto& [guid, data] : certs) {
    auto guid_bytes = SnpGuidBytes(guid);
    CLOISTER_CHECK(guid_bytes.ok());
    Append(table, *guid_bytes);
    for (uint32_t value : {static_cast<uint32_t>(offset), static_cast<uint32_t>(data.size())}) {
      for (int i = 0; i < 4; ++i) table.push_back(static_cast<uint8_t>(value >> (8 * i)));
    }
    offset += data.size();
  }
  table.resize(table.size() + kSnpCertTableEntrySize, 0);
  for (const auto& [guid, data] : certs) Append(table, data);
  return table;
}

absl::StatusOr<std::unique_ptr<SimSnpSignerForTest>> SimSnpSignerForTest::Create(
    const std::string& sim_dir) {
  RETURN_IF_ERROR(EnsureSimRoots(sim_dir));
  std::unique_ptr<SimSnpSignerForTest> signer(new SimSnpSignerForTest());
  ASSIGN_OR_RETURN(signer->certificates_, LoadSimRootCertificates(sim_dir));
  ASSIGN_OR_RETURN(std::string key_pem, ReadFile(sim_dir + "/" + std::string(kSimCvmLeafKeyFile)));
  ASSIGN_OR_RETURN(signer->vcek_key_, crypto::EcPrivateKey::FromPem(key_pem));
  ASSIGN_OR_RETURN(VcekInfo vcek, ReadVcekExtensions(signer->certificates_->cvm_chain.at(0)));
  signer->chip_id_ = vcek.hwid;
  signer->tcb_ = vcek.tcb.ToMilanGenoa();
  return signer;
}

absl::StatusOr<Bytes> SimSnpSignerForTest::Report(ByteSpan report_data, uint32_t vmpl) const {
  SnpReport report;
  report.version = 3;
  report.policy = kSnpPolicyReservedOne | kSnpPolicySmtAllowed;
  report.family_id = Bytes(16, 0);
  report.image_id = Bytes(16, 0);
  report.vmpl = vmpl;
  report.signature_algo = kSnpSignatureAlgoEcdsaP384Sha384;
  report.current_tcb = tcb_;
  report.platform_info = 1;
  report.signer_info = kSnpSigningKeyVcek << 2;
  report.report_data.assign(report_data.begin(), report_data.end());
  report.report_data.resize(64, 0);
  report.measurement = measurement();
  report.host_data = Bytes(32, 0);
  report.id_key_digest = Bytes(48, 0);
  report.author_key_digest = Bytes(48, 0);
  report.report_id = Bytes(32, 0x42);
  report.report_id_ma = Bytes(32, 0xFF);
  report.reported_tcb = tcb_;
  report.cpuid_family = 0x19;
  report.cpuid_model = 0x11;
  report.cpuid_stepping = 0x01;
  report.chip_id = chip_id_;
  report.committed_tcb = tcb_;
  report.current_build = report.committed_build = 21;
  report.current_minor = report.committed_minor = 55;
  report.current_major = report.committed_major = 1;
  report.launch_tcb = tcb_;
  ASSIGN_OR_RETURN(Bytes bytes, EncodeSnpReportToSign(report));
  ASSIGN_OR_RETURN(Bytes signature, vcek_key_->SignP1363(crypto::HashAlg::kSha384,
                                                         ByteSpan(bytes).first(kSnpSignedSize)));
  RETURN_IF_ERROR(SetSnpSignature(bytes, signature));
  return bytes;
}

Bytes SimSnpSignerForTest::CertTable() const {
  return BuildSnpCertTableForTest({{kSnpVcekGuid, certificates_->cvm_chain.at(0).ToDer()},
                                   {kSnpAskGuid, certificates_->cvm_chain.at(1).ToDer()},
                                   {kSnpArkGuid, certificates_->cvm_chain.at(2).ToDer()}});
}

}  // namespace cloister::attest::testing

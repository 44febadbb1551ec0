// Creation, checking and loading of a simulated TEE directory, and the simulated sealing key.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/civil_time.h"
#include "attest/sim/sim_files.h"
#include "attest/sim/sim_tee.h"
#include "attest/snp_report.h"
#include "attest/string_view.h"
#include "attest/x509.h"
#include "base/file.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/hkdf.h"
#include "crypto/random.h"

namespace cloister::attest {
namespace sim_internal {

std::string SimPath(const std::string& sim_dir, std::string_view file) {
  return absl::StrCat(sim_dir, "/", Sv(file));
}

}  // namespace sim_internal

namespace {

using sim_internal::SimPath;
using sim_internal::SimSet;

constexpr std::string_view kOrganization = "Cloister (simulated, development only)";
// The simulated firmware's TCB: bootloader, TEE, SNP and microcode security patch levels.
constexpr SnpTcb kSimTcb = {.bootloader = 10, .tee = 0, .snp = 23, .microcode = 213};
constexpr std::string_view kSimFmcFirmware = "cloister/v1 simulated GPU FMC firmware";
constexpr std::string_view kSealingSalt = "cloister/v1 sim sealing";
// SHA-384's OID, inside the DICE extension's FWID entry.
constexpr std::string_view kSha384Oid = "2.16.840.1.101.3.4.2.2";

struct SimFile {
  std::string_view name;
  bool secret;  // key or sealing secret: 0600 and never readable by others
};
constexpr SimFile kSimFiles[] = {
    {kSimCvmRootFile, false},   {kSimCvmIntermediateFile, false}, {kSimCvmLeafFile, false},
    {kSimCvmLeafKeyFile, true}, {kSimGpuRootFile, false},         {kSimGpuIntermediateFile, false},
    {kSimGpuLeafFile, false},   {kSimGpuLeafKeyFile, true},       {kSimSealingSecretFile, true},
};

absl::Time SimNotBefore() {
  return absl::FromCivil(absl::CivilSecond(2020, 1, 1, 0, 0, 0), absl::UTCTimeZone());
}
absl::Time SimNotAfter() {
  return absl::FromCivil(absl::CivilSecond(9999, 12, 31, 23, 59, 59), absl::UTCTimeZone());
}

absl::Status Corrupt(const std::string& sim_dir, std::string_view file, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("simulated TEE directory ", sim_dir,
                                          " is corrupt: ", Sv(file), ": ", why,
                                          "; remove the directory to create a fresh set"));
}

// Holds an exclusive flock on <sim_dir>/.lock for its lifetime.
class DirectoryLock {
 public:
  static absl::StatusOr<DirectoryLock> Acquire(const std::string& sim_dir) {
    std::string path = SimPath(sim_dir, ".lock");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        int err = errno;
        ::close(fd);
        return absl::InternalError(absl::StrCat("cannot lock ", path, ": ", std::strerror(err)));
      }
    }
    return DirectoryLock(fd);
  }
  DirectoryLock(DirectoryLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirectoryLock& operator=(DirectoryLock&&) = delete;
  ~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }

 private:
  explicit DirectoryLock(int fd) : fd_(fd) {}
  int fd_;
};

// Reads a file of the set; secret files must not be accessible by group or others.
absl::StatusOr<std::string> ReadSimFile(const std::string& sim_dir, const SimFile& file) {
  std::string path = SimPath(sim_dir, file.name);
  if (file.secret) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("permissions 0", absl::Hex(st.st_mode & 0777), " on ", path,
                       " are too open; the file holds a secret and must be 0600"));
    }
  }
  auto text = ReadFile(path, 1 << 20);
  if (!text.ok()) return Corrupt(sim_dir, file.name, text.status().message());
  return text;
}

const SimFile& FileNamed(std::string_view name) {
  for (const SimFile& file : kSimFiles) {
    if (file.name == name) return file;
  }
  CLOISTER_CHECK(false && "unknown simulated TEE file");
  __builtin_unreachable();
}

absl::StatusOr<Certificate> ReadCertificate(const std::string& sim_dir, std::string_view name) {
  ASSIGN_OR_RETURN(std::string pem, ReadSimFile(sim_dir, FileNamed(name)));
  auto cert = Certificate::FromPem(pem);
  if (!cert.ok()) return Corrupt(sim_dir, name, cert.status().message());
  return cert;
}

absl::StatusOr<std::unique_ptr<crypto::EcPrivateKey>> ReadKey(const std::string& sim_dir,
                                                              std::string_view name,
                                                              const Certificate& cert) {
  ASSIGN_OR_RETURN(std::string pem, ReadSimFile(sim_dir, FileNamed(name)));
  auto key = crypto::EcPrivateKey::FromPem(pem);
  SecureWipe(pem.data(), pem.size());
  if (!key.ok()) return Corrupt(sim_dir, name, key.status().message());
  if ((*key)->curve() != crypto::EcCurve::kP384) return Corrupt(sim_dir, name, "not a P-384 key");
  if ((*key)->PublicKeyDer() != cert.PublicKeyDer()) {
    return Corrupt(sim_dir, name,
                   absl::StrCat("the key does not belong to the certificate '",
                                cert.SubjectCommonName(), "'"));
  }
  return key;
}

absl::Status CheckChain(const std::string& sim_dir, std::string_view leaf_file,
                        const std::vector<Certificate>& chain, const Certificate& root) {
  absl::Status status = VerifyChain(chain, root, absl::Now());
  if (!status.ok()) return Corrupt(sim_dir, leaf_file, status.message());
  return absl::OkStatus();
}

// ---- creation ----

absl::StatusOr<std::unique_ptr<crypto::EcPrivateKey>> NewP384() {
  return crypto::EcPrivateKey::Generate(crypto::EcCurve::kP384);
}

CertificateTemplate CaTemplate(std::string common_name, int path_length) {
  CertificateTemplate spec;
  spec.common_name = std::move(common_name);
  spec.organization = std::string(kOrganization);
  spec.is_ca = true;
  spec.path_length = path_length;
  spec.not_before = SimNotBefore();
  spec.not_after = SimNotAfter();
  return spec;
}

absl::Status CreateSimSet(const std::string& sim_dir) {
  // CVM chain: ARK -> ASK -> VCEK, the VCEK carrying the chip's ID and TCB like AMD's.
  ASSIGN_OR_RETURN(auto ark_key, NewP384());
  ASSIGN_OR_RETURN(auto ask_key, NewP384());
  ASSIGN_OR_RETURN(auto vcek_key, NewP384());
  ASSIGN_OR_RETURN(Certificate ark, IssueCertificate(CaTemplate("Cloister Simulated ARK", 1),
                                                     ark_key->PublicKeyDer(), nullptr, *ark_key));
  ASSIGN_OR_RETURN(Certificate ask, IssueCertificate(CaTemplate("Cloister Simulated ASK", 0),
                                                     ask_key->PublicKeyDer(), &ark, *ark_key));
  Bytes chip_id = crypto::RandomBytes(kSimChipIdSize);
  CertificateTemplate vcek_spec = CaTemplate("Cloister Simulated VCEK", -1);
  vcek_spec.is_ca = false;
  vcek_spec.extensions = {
      {std::string(kVcekStructVersionOid), der::Integer(0)},
      {std::string(kVcekProductNameOid), der::Ia5String(kSimProductName)},
      {std::string(kVcekBootloaderSplOid), der::Integer(kSimTcb.bootloader)},
      {std::string(kVcekTeeSplOid), der::Integer(kSimTcb.tee)},
      {std::string(kVcekSnpSplOid), der::Integer(kSimTcb.snp)},
      {std::string(kVcekMicrocodeSplOid), der::Integer(kSimTcb.microcode)},
      {std::string(kVcekHwidOid), chip_id},
  };
  ASSIGN_OR_RETURN(Certificate vcek,
                   IssueCertificate(vcek_spec, vcek_key->PublicKeyDer(), &ask, *ask_key));

  // GPU chain: Device Identity CA -> per-chip intermediate -> FMC alias leaf with the DICE
  // extension (version, issuer key, SHA-384 firmware ID) as on Hopper.
  ASSIGN_OR_RETURN(auto gpu_root_key, NewP384());
  ASSIGN_OR_RETURN(auto gpu_ica_key, NewP384());
  ASSIGN_OR_RETURN(auto gpu_leaf_key, NewP384());
  ASSIGN_OR_RETURN(Certificate gpu_root,
                   IssueCertificate(CaTemplate("Cloister Simulated Device Identity CA", 1),
                                    gpu_root_key->PublicKeyDer(), nullptr, *gpu_root_key));
  ASSIGN_OR_RETURN(Certificate gpu_ica,
                   IssueCertificate(CaTemplate("Cloister Simulated GPU BROM", 0),
                                    gpu_ica_key->PublicKeyDer(), &gpu_root, *gpu_root_key));
  Bytes fwid = crypto::Sha384(AsBytes(kSimFmcFirmware));
  ASSIGN_OR_RETURN(Bytes sha384_oid, der::ObjectId(kSha384Oid));
  Bytes dice = der::Sequence({der::Integer(1), gpu_ica.PublicKeyDer(),
                              der::Sequence({sha384_oid, der::OctetString(fwid)})});
  CertificateTemplate leaf_spec = CaTemplate("Cloister Simulated GPU FMC LF", -1);
  leaf_spec.is_ca = false;
  leaf_spec.extensions = {{std::string(kTcgDiceFwidOid), dice}};
  ASSIGN_OR_RETURN(Certificate gpu_leaf, IssueCertificate(leaf_spec, gpu_leaf_key->PublicKeyDer(),
                                                          &gpu_ica, *gpu_ica_key));

  SecretBytes sealing = crypto::RandomSecret(kSimSealingSecretSize);
  // Certificates first, keys and the sealing secret last.
  const std::pair<std::string_view, std::string> certs[] = {
      {kSimCvmRootFile, ark.ToPem()},
      {kSimCvmIntermediateFile, ask.ToPem()},
      {kSimCvmLeafFile, vcek.ToPem()},
      {kSimGpuRootFile, gpu_root.ToPem()},
      {kSimGpuIntermediateFile, gpu_ica.ToPem()},
      {kSimGpuLeafFile, gpu_leaf.ToPem()},
  };
  for (const auto& [name, pem] : certs) {
    RETURN_IF_ERROR(WriteFileAtomic(SimPath(sim_dir, name), pem, 0644));
  }
  std::string vcek_pem = vcek_key->ToPem();
  std::string gpu_pem = gpu_leaf_key->ToPem();
  absl::Status status = WriteFileAtomic(SimPath(sim_dir, kSimCvmLeafKeyFile), vcek_pem, 0600);
  if (status.ok()) status = WriteFileAtomic(SimPath(sim_dir, kSimGpuLeafKeyFile), gpu_pem, 0600);
  if (status.ok()) {
    status =
        WriteFileAtomic(SimPath(sim_dir, kSimSealingSecretFile), ToString(sealing.span()), 0600);
  }
  SecureWipe(vcek_pem.data(), vcek_pem.size());
  SecureWipe(gpu_pem.data(), gpu_pem.size());
  return status;
}

}  // namespace

namespace sim_internal {

absl::StatusOr<SimSet> LoadSimSet(const std::string& sim_dir) {
  std::vector<std::string> present;
  std::vector<std::string> missing;
  for (const SimFile& file : kSimFiles) {
    (FileExists(SimPath(sim_dir, file.name)) ? present : missing).push_back(std::string(file.name));
  }
  if (present.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no simulated TEE in ", sim_dir, " (EnsureSimRoots creates one)"));
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("simulated TEE directory ", sim_dir, " is incomplete: it lacks ",
                     absl::StrJoin(missing, ", "),
                     "; remove the directory to create a fresh set (policies "
                     "trusting the old roots will then stop verifying)"));
  }

  ASSIGN_OR_RETURN(Certificate ark, ReadCertificate(sim_dir, kSimCvmRootFile));
  ASSIGN_OR_RETURN(Certificate ask, ReadCertificate(sim_dir, kSimCvmIntermediateFile));
  ASSIGN_OR_RETURN(Certificate vcek, ReadCertificate(sim_dir, kSimCvmLeafFile));
  ASSIGN_OR_RETURN(Certificate gpu_root, ReadCertificate(sim_dir, kSimGpuRootFile));
  ASSIGN_OR_RETURN(Certificate gpu_ica, ReadCertificate(sim_dir, kSimGpuIntermediateFile));
  ASSIGN_OR_RETURN(Certificate gpu_leaf, ReadCertificate(sim_dir, kSimGpuLeafFile));
  std::vector<Certificate> cvm_chain = {vcek, ask, ark};
  std::vector<Certificate> gpu_chain = {gpu_leaf, gpu_ica, gpu_root};
  RETURN_IF_ERROR(CheckChain(sim_dir, kSimCvmLeafFile, cvm_chain, ark));
  RETURN_IF_ERROR(CheckChain(sim_dir, kSimGpuLeafFile, gpu_chain, gpu_root));

  SimSet set{.certificates = {ark, gpu_root, cvm_chain, gpu_chain}};
  ASSIGN_OR_RETURN(set.vcek_key, ReadKey(sim_dir, kSimCvmLeafKeyFile, vcek));
  ASSIGN_OR_RETURN(set.gpu_key, ReadKey(sim_dir, kSimGpuLeafKeyFile, gpu_leaf));

  auto vcek_info = ReadVcekExtensions(vcek);
  if (!vcek_info.ok()) return Corrupt(sim_dir, kSimCvmLeafFile, vcek_info.status().message());
  if (vcek_info->hwid.size() != kSimChipIdSize || vcek_info->tcb.fmc.has_value()) {
    return Corrupt(sim_dir, kSimCvmLeafFile, "not a simulated Milan/Genoa-style VCEK");
  }
  set.chip_id = vcek_info->hwid;
  set.tcb = vcek_info->tcb.ToMilanGenoa();
  auto fwid = DiceFwid(gpu_leaf);
  if (!fwid.ok()) return Corrupt(sim_dir, kSimGpuLeafFile, fwid.status().message());
  set.fwid = *fwid;

  ASSIGN_OR_RETURN(std::string secret, ReadSimFile(sim_dir, FileNamed(kSimSealingSecretFile)));
  size_t secret_size = secret.size();
  SecureWipe(secret.data(), secret.size());
  if (secret_size != kSimSealingSecretSize) {
    return Corrupt(sim_dir, kSimSealingSecretFile,
                   absl::StrCat(secret_size, " bytes, expected ", kSimSealingSecretSize));
  }
  return set;
}

}  // namespace sim_internal

absl::Status EnsureSimRoots(const std::string& sim_dir) {
  RETURN_IF_ERROR(MakeDirs(sim_dir, 0700));
  ASSIGN_OR_RETURN(DirectoryLock lock, DirectoryLock::Acquire(sim_dir));
  auto set = sim_internal::LoadSimSet(sim_dir);
  if (set.ok()) return absl::OkStatus();
  if (!absl::IsNotFound(set.status())) return set.status();
  return CreateSimSet(sim_dir);
}

absl::StatusOr<SimRootCertificates> LoadSimRootCertificates(const std::string& sim_dir) {
  ASSIGN_OR_RETURN(SimSet set, sim_internal::LoadSimSet(sim_dir));
  return std::move(set.certificates);
}

std::map<uint8_t, Bytes> SimGpuReferenceMeasurements(std::string_view driver_version,
                                                     std::string_view vbios_version) {
  // Indices populated on a Hopper GPU: firmware and VBIOS (2-12) and driver-loaded (22-41).
  static constexpr uint8_t kVbiosIndices[] = {2, 3, 4, 5, 6, 7, 8, 10, 12};
  static constexpr uint8_t kDriverIndices[] = {22, 23, 26, 27, 28, 30, 31, 32, 33,
                                               34, 35, 36, 37, 38, 39, 40, 41};
  std::map<uint8_t, Bytes> out;
  auto digest = [](std::string_view source, std::string_view version, uint8_t index) {
    Bytes message = ToBytes("cloister/v1 simulated GPU measurement");
    AppendLengthPrefixed(message, AsBytes(source));
    AppendLengthPrefixed(message, AsBytes(version));
    message.push_back(index);
    return crypto::Sha384(message);
  };
  for (uint8_t index : kVbiosIndices) out[index] = digest("vbios", vbios_version, index);
  for (uint8_t index : kDriverIndices) out[index] = digest("driver", driver_version, index);
  return out;
}

absl::StatusOr<SecretBytes> SimSealingKey(const std::string& sim_dir, ByteSpan measurement,
                                          ByteSpan label) {
  if (measurement.size() != 48) {
    return absl::InvalidArgumentError(
        absl::StrCat("enclave measurement is ", measurement.size(), " bytes, expected 48"));
  }
  std::string path = SimPath(sim_dir, kSimSealingSecretFile);
  if (!FileExists(path)) {
    return absl::NotFoundError(
        absl::StrCat("no simulated sealing secret at ", path, " (EnsureSimRoots creates one)"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadSimFile(sim_dir, FileNamed(kSimSealingSecretFile)));
  SecretBytes secret(AsBytes(text));
  SecureWipe(text.data(), text.size());
  if (secret.size() != kSimSealingSecretSize) {
    return Corrupt(sim_dir, kSimSealingSecretFile,
                   absl::StrCat(secret.size(), " bytes, expected ", kSimSealingSecretSize));
  }
  Bytes info;
  AppendLengthPrefixed(info, measurement);
  AppendLengthPrefixed(info, label);
  return crypto::Hkdf(crypto::HashAlg::kSha256, AsBytes(kSealingSalt), secret.span(), info, 32);
}

}  // namespace cloister::attest

#include "attest/binding.h"

#include <string_view>

#include "crypto/hash.h"

namespace cloister::attest {
namespace {
constexpr std::string_view kReportDataLabel = "cloister/v1 report data";
constexpr std::string_view kGpuNonceLabel = "cloister/v1 gpu nonce";
constexpr std::string_view kChallengeLabel = "cloister/v1 evidence challenge";
}  // namespace

Bytes ReportData(ByteSpan nonce, const std::vector<Bytes>& gpu_reports, ByteSpan hpke_public_key,
                 ByteSpan signing_public_key) {
  crypto::Hasher gpu_hasher(crypto::HashAlg::kSha384);
  Bytes prefix;
  for (const Bytes& report : gpu_reports) {
    prefix.clear();
    AppendBigEndian(prefix, report.size(), 4);
    gpu_hasher.Update(prefix);
    gpu_hasher.Update(report);
  }
  Bytes gpu_digest = gpu_hasher.Finish();

  Bytes message = ToBytes(kReportDataLabel);
  AppendLengthPrefixed(message, nonce);
  Append(message, gpu_digest);
  AppendLengthPrefixed(message, hpke_public_key);
  AppendLengthPrefixed(message, signing_public_key);
  return crypto::Sha512(message);
}

Bytes GpuRequesterNonce(ByteSpan nonce, ByteSpan hpke_public_key, uint32_t gpu_index) {
  Bytes message = ToBytes(kGpuNonceLabel);
  Append(message, nonce);
  Append(message, hpke_public_key);
  AppendBigEndian(message, gpu_index, 4);
  return crypto::Sha256(message);
}

Bytes EvidenceDigest(const std::string& serialized_bundle) {
  return crypto::Sha256(AsBytes(serialized_bundle));
}

Bytes ChallengeMessage(ByteSpan evidence_digest, ByteSpan client_nonce) {
  Bytes message = ToBytes(kChallengeLabel);
  Append(message, evidence_digest);
  Append(message, client_nonce);
  return message;
}

Bytes PublishedModelsMessage(ByteSpan evidence_digest, ByteSpan client_nonce,
                             ByteSpan published_models) {
  Bytes message = ToBytes("cloister/v1 published models");
  AppendLengthPrefixed(message, evidence_digest);
  AppendLengthPrefixed(message, client_nonce);
  Append(message, crypto::Sha256(published_models));
  return message;
}

}  // namespace cloister::attest

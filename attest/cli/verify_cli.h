// cloister-verify (DESIGN.md section 8): offline verification of attestation evidence against
// a policy, for verifiers and auditors. Subcommands:
//   sev-snp     --report FILE (--vcek FILE --ask-ark FILE | --cert-chain FILE)
//   tdx         --quote FILE [--collateral FILE]...
//   nvidia-gpu  (--report FILE --cert-chain FILE | --evidence-json FILE)
//               [--driver-rim FILE] [--vbios-rim FILE] [--ocsp FILE]...
//               (RIMs not given as files are taken from the policy's nvidia.rim_dir, saved
//               OCSP responses also from its nvidia.ocsp_dir)
//   bundle      FILE   (a serialized cloister.attest.v1.EvidenceBundle or ChallengeResponse)
// and for all of them: --policy FILE (YAML, attest/policy.h), --nonce HEX, --at TIME (RFC 3339;
// default now), --json. Report and quote files may hold raw bytes or hex text. Output: a verdict
// line, one line per check and the claims, or with --json exactly one document
//   {"verdict": "pass"|"fail", "checks": [{"name", "result", "detail"}], "claims": {...}}.
// Exit status 0 when the verdict passes, 1 when it fails, 2 for bad usage or unusable input
// (one line on stderr). This file holds the whole program so that tests can run it in process;
// verify_main.cc only calls RunVerifyCli. Thread-safe: no shared state.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "attest/verifier.h"
#include "base/bytes.h"

namespace cloister::attest {

inline constexpr int kExitPass = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitUsage = 2;

// Runs cloister-verify with `args` (without the program name), writing the result to `out` and
// errors to `err`; returns the exit status.
int RunVerifyCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// An evidence file as bytes: hex text (any case, whitespace ignored) is decoded, anything else
// is taken as raw bytes. NotFound / InvalidArgument naming the path.
absl::StatusOr<Bytes> ReadEvidenceFile(const std::string& path);

// A nonce given as hex on the command line, zero-padded to `padded_size` bytes when shorter
// (the REPORT_DATA convention of the CPU TEEs); `padded_size` 0 requires exactly
// `exact_size` bytes. InvalidArgument otherwise.
absl::StatusOr<Bytes> ParseNonceFlag(std::string_view hex, size_t padded_size, size_t exact_size);

// The two output formats.
std::string FormatVerdictText(const Verdict& verdict, std::string_view title);
std::string FormatVerdictJson(const Verdict& verdict);

}  // namespace cloister::attest

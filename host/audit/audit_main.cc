// cloister-audit: checks cloisterd's audit log (host/audit/audit_log.h) offline.
//
//   cloister-audit verify FILE [--evidence FILE]... [--key HEX]... [--require-signed] [--json]
//
// Exit status (DESIGN.md section 8): 0 the chain and every checkpoint signature hold; 1 they do
// not (the first bad entry is named on stderr), or --require-signed and some entries are not
// yet covered by a signed checkpoint; 2 bad usage or an unreadable file.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/file.h"
#include "host/audit/audit_log.h"

namespace {

constexpr char kUsage[] =
    "usage: cloister-audit verify FILE [--evidence FILE]... [--key HEX]... [--require-signed] "
    "[--json]";

constexpr char kHelp[] = R"(usage: cloister-audit verify FILE [flags]

Checks a cloisterd audit log (DATA_DIR/audit/audit.jsonl): every entry is well formed, the
entries are numbered without gaps, each one holds the SHA-256 of the one before, and every
checkpoint is signed by an enclave key over the hash of the entry it covers. The first bad
entry is named.

flags:
  --evidence FILE   attestation evidence (an evidence bundle or challenge response): only the
                    enclave signing key in it may sign checkpoints (repeatable)
  --key HEX         an enclave signing key (32 bytes, hex) allowed to sign (repeatable)
  --require-signed  fail when entries after the last checkpoint are not yet signed
  --json            print {"verdict", "entries", "signed_entries", "checkpoints", "keys",
                    "keys_pinned", "error"}

Without --evidence or --key any key may sign: the signatures then show that the log was not
changed after signing, but not by whom it was signed. Verify the evidence with cloister-verify.
exit status: 0 verified, 1 a bad entry (or unsigned entries with --require-signed), 2 bad usage
or unreadable input.
)";

int Usage(const std::string& message) {
  std::fprintf(stderr, "cloister-audit: %s (%s)\n", message.c_str(), kUsage);
  return 2;
}

std::string JsonQuote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrCat("\\u00", c < 0x10 ? "0" : "", absl::Hex(static_cast<unsigned char>(c)));
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cloister;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (args.empty() || args[0] != "verify") return Usage("the only subcommand is verify");
  std::string path;
  std::vector<Bytes> keys;
  bool json = false;
  bool require_signed = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help") {
      std::printf("%s", kHelp);
      return 0;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--require-signed") {
      require_signed = true;
    } else if (arg == "--evidence" || arg == "--key") {
      if (i + 1 >= args.size()) return Usage(absl::StrCat(arg, " needs a value"));
      const std::string& value = args[++i];
      if (arg == "--key") {
        absl::StatusOr<Bytes> key = HexDecode(value);
        if (!key.ok() || key->size() != 32) {
          return Usage(absl::StrCat("--key ", value, " is not 32 bytes of hex"));
        }
        keys.push_back(*std::move(key));
      } else {
        absl::StatusOr<std::string> evidence = ReadFile(value);
        if (!evidence.ok()) {
          std::fprintf(stderr, "cloister-audit: cannot read evidence %s: %s\n", value.c_str(),
                       std::string(evidence.status().message()).c_str());
          return 2;
        }
        absl::StatusOr<Bytes> key = host::SigningKeyFromEvidenceBytes(*evidence);
        if (!key.ok()) {
          std::fprintf(stderr, "cloister-audit: %s: %s\n", value.c_str(),
                       std::string(key.status().message()).c_str());
          return 2;
        }
        keys.push_back(*std::move(key));
      }
    } else if (!arg.empty() && arg[0] == '-') {
      return Usage(absl::StrCat("unknown flag ", arg));
    } else if (path.empty()) {
      path = arg;
    } else {
      return Usage(absl::StrCat("unexpected argument ", arg));
    }
  }
  if (path.empty()) return Usage("verify needs the audit log FILE");
  if (!FileExists(path)) {
    std::fprintf(stderr, "cloister-audit: cannot read audit log %s\n", path.c_str());
    return 2;
  }

  absl::StatusOr<host::AuditReport> report = host::VerifyAuditLog(path, keys);
  if (!report.ok() && absl::IsNotFound(report.status())) {
    std::fprintf(stderr, "cloister-audit: %s\n", std::string(report.status().message()).c_str());
    return 2;
  }
  // Entries after the last checkpoint's covered one are chained but unsigned, except that
  // checkpoint's own entry when it is the last.
  bool unsigned_tail =
      report.ok() && report->entries > 0 &&
      !(!report->checkpoints.empty() && report->checkpoints.back().entry == report->entries &&
        report->checkpoints.back().covers + 1 == report->entries);
  bool pass = report.ok() && !(require_signed && unsigned_tail);
  std::string error;
  if (!report.ok()) {
    error = std::string(report.status().message());
  } else if (!pass) {
    error = absl::StrCat("entries ", report->signed_entries + 1, " to ", report->entries,
                         " are not covered by a signed checkpoint");
  }

  if (json) {
    std::string out = absl::StrCat("{\"verdict\":\"", pass ? "pass" : "fail", "\"");
    if (report.ok()) {
      std::vector<std::string> checkpoints, key_hexes;
      for (const auto& checkpoint : report->checkpoints) {
        checkpoints.push_back(absl::StrCat(
            "{\"entry\":", checkpoint.entry, ",\"covers\":", checkpoint.covers, ",\"key\":\"",
            HexEncode(checkpoint.signing_public_key), "\",\"signed_at\":\"",
            absl::FormatTime(absl::RFC3339_sec, checkpoint.signed_at, absl::UTCTimeZone()), "\"}"));
      }
      for (const Bytes& key : report->signing_keys) {
        key_hexes.push_back(absl::StrCat("\"", HexEncode(key), "\""));
      }
      absl::StrAppend(&out, ",\"entries\":", report->entries,
                      ",\"signed_entries\":", report->signed_entries, ",\"checkpoints\":[",
                      absl::StrJoin(checkpoints, ","), "],\"keys\":[",
                      absl::StrJoin(key_hexes, ","), "]");
    }
    absl::StrAppend(&out, ",\"keys_pinned\":", keys.empty() ? "false" : "true");
    if (!error.empty()) absl::StrAppend(&out, ",\"error\":", JsonQuote(error));
    std::cout << out << "}\n";
  } else if (report.ok()) {
    std::cout << "audit log " << path << ": " << report->entries << " entries, "
              << report->checkpoints.size() << " signed checkpoints\n";
    for (const auto& checkpoint : report->checkpoints) {
      std::cout << "  checkpoint at entry " << checkpoint.entry << " signs entries 1.."
                << checkpoint.covers << " (key "
                << HexEncode(checkpoint.signing_public_key).substr(0, 16) << "..., "
                << absl::FormatTime(absl::RFC3339_sec, checkpoint.signed_at, absl::UTCTimeZone())
                << ")\n";
    }
    if (unsigned_tail) {
      std::cout << "  entries " << report->signed_entries + 1 << ".." << report->entries
                << " are chained but not yet signed\n";
    }
    if (keys.empty()) {
      std::cout << "  signing keys were not pinned (pass --evidence or --key)\n";
    }
    std::cout << (pass ? "verdict: pass\n" : "verdict: fail\n");
  }
  if (!pass) {
    std::fprintf(stderr, "cloister-audit: %s\n", error.c_str());
    return 1;
  }
  return 0;
}

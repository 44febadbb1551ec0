// cloister-audit: checks cloisterd's audit log (host/audit/audit_log.h) and its log of the
// enclaves' usage receipts (host/receipts/receipt_log.h) offline.
//
//   cloister-audit verify FILE [--evidence FILE]... [--key HEX]... [--require-signed] [--json]
//   cloister-audit receipts FILE [--evidence FILE]... [--key HEX]... [--tenant ID] [--json]
//
// Exit status (DESIGN.md section 8): 0 the log holds (verify: the chain and every checkpoint
// signature; receipts: every signature, sequence number and cumulative count); 1 it does not
// (the first bad entry or line is named on stderr), or --require-signed and some entries are not
// yet covered by a signed checkpoint; 2 bad usage or an unreadable file.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/flags.h"
#include "host/audit/audit_log.h"
#include "host/receipts/receipt_log.h"
#include "nlohmann/json.hpp"

namespace {

constexpr char kUsage[] =
    "usage: cloister-audit verify|receipts FILE [--evidence FILE]... [--key HEX]... "
    "[--require-signed] [--tenant ID] [--json]";

constexpr char kHelp[] = R"(usage: cloister-audit verify FILE [flags]
       cloister-audit receipts FILE [flags]

verify checks a cloisterd audit log (DATA_DIR/audit/audit.jsonl): every entry is well formed, the
entries are numbered without gaps, each one holds the SHA-256 of the one before, and every
checkpoint is signed by an enclave key over the hash of the entry it covers. The first bad
entry is named.

receipts checks a log of usage receipts (DATA_DIR/receipts/receipts.jsonl) and prints what the
enclaves counted per tenant and model: every receipt's signature verifies under the enclave key
it names, each key's receipts are numbered 1, 2, 3... with none missing or repeated, and each
tenant's cumulative counts add up receipt by receipt. The first bad line is named.

flags:
  --evidence FILE   attestation evidence (an evidence bundle or challenge response): only the
                    enclave signing key in it may sign (repeatable)
  --key HEX         an enclave signing key (32 bytes, hex) allowed to sign (repeatable)
  --require-signed  verify: fail when entries after the last checkpoint are not yet signed
  --tenant ID       receipts: print the usage of this tenant only (the whole log is checked)
  --json            verify: print {"verdict", "entries", "signed_entries", "checkpoints",
                    "keys", "keys_pinned", "error"}; receipts: print {"verdict", "receipts",
                    "keys", "keys_pinned", "usage": [{"tenant_id", "model_handle", "batches",
                    "requests", "failed_requests", "input_size", "output_size", "execution_ns",
                    "transfer_ns"}], "error"}

Without --evidence or --key any key may sign: the signatures then show that the log was not
changed after signing, but not by whom it was signed. Verify the evidence with cloister-verify.
Neither log can show lines cut off after its last signed checkpoint (verify) or after each
key's last receipt (receipts).
exit status: 0 verified, 1 a bad entry or line (or unsigned entries with --require-signed), 2
bad usage or unreadable input.
)";

int Usage(const std::string& message) {
  std::fprintf(stderr, "cloister-audit: %s (%s)\n", message.c_str(), kUsage);
  return 2;
}

// One JSON document on one line. Strings come from files and the command line, which need not
// be UTF-8 (a file name, say): invalid bytes print as U+FFFD instead of aborting the dump.
void PrintJson(const nlohmann::ordered_json& document) {
  std::cout << document.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

struct Flags {
  std::string subcommand;
  std::string path;
  std::vector<cloister::Bytes> keys;
  bool json = false;
  bool require_signed = false;
  std::string tenant;
};

int Verify(const Flags& flags) {
  using namespace cloister;
  const std::string& path = flags.path;
  const std::vector<Bytes>& keys = flags.keys;
  const bool json = flags.json;
  const bool require_signed = flags.require_signed;
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
    nlohmann::ordered_json out;
    out["verdict"] = pass ? "pass" : "fail";
    if (report.ok()) {
      out["entries"] = report->entries;
      out["signed_entries"] = report->signed_entries;
      out["checkpoints"] = nlohmann::json::array();
      for (const auto& checkpoint : report->checkpoints) {
        out["checkpoints"].push_back(nlohmann::ordered_json{
            {"entry", checkpoint.entry},
            {"covers", checkpoint.covers},
            {"key", HexEncode(checkpoint.signing_public_key)},
            {"signed_at",
             absl::FormatTime(absl::RFC3339_sec, checkpoint.signed_at, absl::UTCTimeZone())}});
      }
      out["keys"] = nlohmann::json::array();
      for (const Bytes& key : report->signing_keys) out["keys"].push_back(HexEncode(key));
    }
    out["keys_pinned"] = !keys.empty();
    if (!error.empty()) out["error"] = error;
    PrintJson(out);
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

int Receipts(const Flags& flags) {
  using namespace cloister;
  absl::StatusOr<host::ReceiptAudit> audit = host::AuditReceiptLog(flags.path, flags.keys);
  if (!audit.ok() && absl::IsNotFound(audit.status())) {
    std::fprintf(stderr, "cloister-audit: %s\n", std::string(audit.status().message()).c_str());
    return 2;
  }
  std::vector<std::pair<std::pair<std::string, std::string>, boundary::v1::UsageCounters>> usage;
  if (audit.ok()) {
    for (const auto& row : audit->totals) {
      if (flags.tenant.empty() || row.first.first == flags.tenant) usage.push_back(row);
    }
  }
  if (flags.json) {
    nlohmann::ordered_json out;
    out["verdict"] = audit.ok() ? "pass" : "fail";
    if (audit.ok()) {
      out["receipts"] = audit->receipts;
      out["keys"] = nlohmann::json::array();
      for (const Bytes& key : audit->keys) out["keys"].push_back(HexEncode(key));
    }
    out["keys_pinned"] = !flags.keys.empty();
    if (audit.ok()) {
      out["usage"] = nlohmann::json::array();
      for (const auto& [id, counters] : usage) {
        out["usage"].push_back(
            nlohmann::ordered_json{{"tenant_id", id.first},
                                   {"model_handle", id.second},
                                   {"batches", counters.batches()},
                                   {"requests", counters.requests()},
                                   {"failed_requests", counters.failed_requests()},
                                   {"input_size", counters.input_size()},
                                   {"output_size", counters.output_size()},
                                   {"execution_ns", counters.execution_ns()},
                                   {"transfer_ns", counters.transfer_ns()},
                                   {"sequences", counters.sequences()},
                                   {"prompt_tokens", counters.prompt_tokens()},
                                   {"cached_tokens", counters.cached_tokens()},
                                   {"completion_tokens", counters.completion_tokens()},
                                   {"kv_block_ms", counters.kv_block_ms()}});
      }
    } else {
      out["error"] = std::string(audit.status().message());
    }
    PrintJson(out);
  } else if (audit.ok()) {
    std::cout << "receipt log " << flags.path << ": " << audit->receipts
              << (audit->receipts == 1 ? " receipt" : " receipts") << " from " << audit->keys.size()
              << (audit->keys.size() == 1 ? " enclave key\n" : " enclave keys\n");
    for (const Bytes& key : audit->keys) {
      std::cout << "  signed by " << HexEncode(key).substr(0, 16) << "...\n";
    }
    if (usage.empty()) {
      std::cout << "  no receipts" << (flags.tenant.empty() ? "" : " for tenant " + flags.tenant)
                << "\n";
    } else {
      std::cout << absl::StrFormat("%-16s %-32s %8s %9s %7s %14s %14s %12s %12s\n", "TENANT",
                                   "MODEL HANDLE", "BATCHES", "REQUESTS", "FAILED", "INPUT BYTES",
                                   "OUTPUT BYTES", "EXECUTION", "PCIE PATH");
      for (const auto& [id, counters] : usage) {
        std::cout << absl::StrFormat("%-16s %-32s %8d %9d %7d %14d %14d %9.1f ms %9.1f ms\n",
                                     id.first, id.second, counters.batches(), counters.requests(),
                                     counters.failed_requests(), counters.input_size(),
                                     counters.output_size(), counters.execution_ns() / 1e6,
                                     counters.transfer_ns() / 1e6);
        if (counters.sequences() > 0) {
          // Generation: the tokens the enclave counted for this tenant and model.
          std::cout << absl::StrFormat(
              "%-16s %-32s %8s sequences %d, tokens: prompt %d (cached %d), completion %d, KV "
              "%.1f block-seconds\n",
              "", "", "", counters.sequences(), counters.prompt_tokens(), counters.cached_tokens(),
              counters.completion_tokens(), counters.kv_block_ms() / 1e3);
        }
      }
    }
    if (flags.keys.empty()) {
      std::cout << "  signing keys were not pinned (pass --evidence or --key)\n";
    }
    std::cout << "  receipts cut off after each key's last one here would not show: compare the "
                 "totals with your own count of answers\n";
    std::cout << "verdict: pass\n";
  }
  if (!audit.ok()) {
    std::fprintf(stderr, "cloister-audit: %s\n", std::string(audit.status().message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cloister;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (args.empty() || (args[0] != "verify" && args[0] != "receipts")) {
    return Usage("the subcommands are verify and receipts");
  }
  Flags flags;
  flags.subcommand = args[0];
  const bool receipts = flags.subcommand == "receipts";
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
    std::printf("%s", kHelp);
    return 0;
  }
  std::vector<FlagSpec> specs = {{"--json", SwitchFlag{&flags.json}}};
  if (receipts) {
    specs.push_back({"--tenant", StringFlag{&flags.tenant, {}, /*non_empty=*/true}});
  } else {
    specs.push_back({"--require-signed", SwitchFlag{&flags.require_signed}});
  }
  std::vector<std::string> evidence_files, key_texts, positional;
  specs.push_back({"--evidence", StringListFlag{&evidence_files}});
  specs.push_back({"--key", StringListFlag{&key_texts}});
  const absl::Status parsed =
      ParseFlags(rest, specs,
                 {.positional = &positional,
                  .inline_values = false,
                  .unknown_flag = [&](const std::string& arg) {
                    return absl::StrCat("unknown flag ", arg, " for ", flags.subcommand);
                  }});
  if (!parsed.ok()) return Usage(std::string(parsed.message()));
  if (positional.size() > 1) return Usage(absl::StrCat("unexpected argument ", positional[1]));
  if (!positional.empty()) flags.path = positional[0];
  for (const std::string& value : key_texts) {
    absl::StatusOr<Bytes> key = HexDecode(value);
    if (!key.ok() || key->size() != 32) {
      return Usage(absl::StrCat("--key ", value, " is not 32 bytes of hex"));
    }
    flags.keys.push_back(*std::move(key));
  }
  for (const std::string& value : evidence_files) {
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
    flags.keys.push_back(*std::move(key));
  }
  if (flags.path.empty()) {
    return Usage(receipts ? "receipts needs the receipt log FILE"
                          : "verify needs the audit log FILE");
  }
  if (!FileExists(flags.path)) {
    std::fprintf(stderr, "cloister-audit: cannot read %s %s\n",
                 receipts ? "receipt log" : "audit log", flags.path.c_str());
    return 2;
  }
  return receipts ? Receipts(flags) : Verify(flags);
}

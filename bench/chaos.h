// `cloister-bench chaos`: fault tolerance under load. It starts a real `cloisterd` with several
// enclave workers (the real cloister-enclave) and several tenants, each with its own token,
// identity and model, and has every tenant send a steady mixed load (Infer, and every
// `list_every`-th request ListModels) through the C++ SDK for `duration_s` seconds while a killer
// thread SIGKILLs `kills` cloister-enclave processes (children of cloisterd, found in /proc) at
// random points spread over the run. The SDK re-attests and retries idempotent calls on its own.
//
// Each tenant keeps a ledger of its request numbers. The model of tenant t is Y = X + offset_t
// (offset_t = 1000 * (t + 1)), and request n of tenant t sends X = [n, t, a, b] with random a, b;
// so every answer says which tenant's model ran on which request's input, and is checked:
// - ok: the answer is exactly what this request should produce;
// - errors: an error status (e.g. UNAVAILABLE after the SDK's retries ran out), by code;
// - lost: no answer within --call-timeout-s (DEADLINE_EXCEEDED at the client), or a ledger entry
//   still without an outcome at the end;
// - duplicated: an answer that carries a request number which already had its outcome;
// - misrouted: an answer computed for another request or by another tenant's model, or a
//   ListModels answer that is not exactly this tenant's model.
// Generation streams too: every `generate_every`-th request of a tenant is a Generate of the
// shared tiny model, which the config publishes to every tenant (so it is published again into
// every restarted worker): reference prompt n mod P, greedy, its reference length, checked
// against the model's reference ids (reference.json). A stream that ends OK with a strict prefix
// of its ids is `truncated` (a short answer the client took as whole); one with other ids is
// misrouted; a stream's error (UNAVAILABLE when its worker died, DATA_LOSS when the client
// caught a bad stream) counts under errors by code.
// Target: lost, duplicated, misrouted and truncated all 0. At the end every tenant must get one
// more Infer right (the appliance recovered).
//
// Threading: the tenant threads and the killer are this module's own, joined before it returns.
// Ownership: the cloisterd child process and its data dir live for one RunChaos call.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct ChaosOptions {
  std::string cloisterd;  // the cloisterd binary (cloister-enclave must sit beside it)
  int duration_s = 120;
  int kills = 20;
  int tenants = 3;
  int threads_per_tenant = 2;
  int workers = 2;      // enclave workers in cloisterd
  int list_every = 10;  // every N-th request of a tenant is ListModels; 0: none
  int generate_every = 4;  // every N-th request of a tenant is a Generate stream; 0: none
  std::string models_dir;  // holds llm/tiny-llama (for the streams)
  int call_timeout_s = 30;
  uint64_t seed = 20261130;
  bool json = false;
  // Exit with an error unless lost, duplicated and misrouted are 0, every kill happened, some
  // requests succeeded and the appliance recovered.
  bool check = false;
};

struct ChaosResult {
  int duration_s = 0;
  int tenants = 0;
  int workers = 0;
  int kills = 0;  // processes actually killed
  uint64_t sent = 0;
  uint64_t ok = 0;
  uint64_t errors = 0;
  uint64_t lost = 0;
  uint64_t duplicated = 0;
  uint64_t misrouted = 0;
  uint64_t streams = 0;     // Generate requests among `sent`
  uint64_t streams_ok = 0;  // of them, with exactly their reference ids
  uint64_t truncated = 0;   // ended OK with a strict prefix of their ids: not detected
  std::map<std::string, uint64_t> error_codes;  // code name -> count
  int worker_deaths_logged = 0;                 // cloisterd's enclave_worker_died lines
  int worker_restarts_logged = 0;               // enclave_worker_ready lines after the first start
  double ok_p50_ms = 0;
  double ok_p99_ms = 0;
  bool recovered = false;
};

absl::StatusOr<ChaosOptions> ParseChaosFlags(const std::vector<std::string>& args,
                                             ChaosOptions defaults);
std::string ChaosUsage();

// One JSON object on one line with every field of ChaosResult.
std::string ChaosJsonLine(const ChaosResult& result);
std::string ChaosTable(const ChaosResult& result);

// OK when the run met its target (see ChaosOptions::check), else FailedPrecondition saying
// which figure missed.
absl::Status CheckChaosResult(const ChaosOptions& options, const ChaosResult& result);

// Errors: cloisterd does not start (with its stderr), a tenant cannot connect or upload.
absl::StatusOr<ChaosResult> RunChaos(const ChaosOptions& options, std::FILE* out, std::FILE* log);

}  // namespace cloister::bench

// `cloister-bench proxy-overhead`: what the OpenAI-compatible proxy (`cloister proxy`,
// sdk/proxy/) costs a tenant's app over calling the SDK directly. One real `cloisterd` (which
// spawns the real cloister-enclave) publishes the model (published_models: the checkpoint folder
// and its digest) and one real `cloister proxy` process connects to it as the demo tenant on
// 127.0.0.1 port 0. At each concurrency N, N streams run at once, each one greedy generation of
// a fixed prompt (temperature 0, eos ignored, max_tokens each), on two sides in alternating
// rounds: "sdk", one sdk::Client per stream calling Client::Generate with a chunk callback, and
// "proxy", one HTTP client per stream posting /v1/completions with "stream": true and reading
// the server-sent events. Time to first token is from sending the request to the first chunk
// (sdk) or `data:` event (proxy) that carries text; throughput is completion tokens per second
// over all rounds of a side. Ratios: tokens_per_s proxy / sdk, TTFT p50 sdk / proxy (1.0 is no
// overhead, lower is worse; target at least 0.95 for both). Before timing, each side runs one
// untimed round and every stream's text is compared across the sides.
//
// Threading: the stream threads are this module's own, joined before each round ends.
// Ownership: the cloisterd and proxy child processes and their folder live for one call.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cloister::bench {

struct ProxyOverheadOptions {
  std::string models_dir;  // holds llm/tiny-llama
  std::string cloisterd;   // the cloisterd binary (cloister-enclave beside it)
  std::string cloister;    // the `cloister` CLI binary that runs `cloister proxy`
  // The checkpoint folder; empty: models_dir/llm/tiny-llama.
  std::string model_dir;
  std::vector<int> concurrency = {1, 16};
  int max_tokens = 64;
  int rounds = 3;
  // Above 1: both sides ask the enclave for chunks of this many tokens (StreamShape; through
  // the proxy as stream_options.tokens_per_chunk), so the relay's per-chunk cost is shared.
  int tokens_per_chunk = 0;
  bool json = false;
};

// The figures at one concurrency.
struct ProxyOverheadLine {
  std::string model;  // the folder's name
  int concurrency = 0;
  int max_tokens = 0;
  int rounds = 0;
  int tokens_per_chunk = 0;
  double sdk_tokens = 0, sdk_seconds = 0;
  double proxy_tokens = 0, proxy_seconds = 0;
  double ttft_p50_ms_sdk = 0, ttft_p50_ms_proxy = 0;
  bool texts_match = false;  // every stream's text was the same on both sides
  double tokens_per_s_sdk() const { return sdk_tokens / sdk_seconds; }
  double tokens_per_s_proxy() const { return proxy_tokens / proxy_seconds; }
  double tokens_per_s_ratio() const { return tokens_per_s_proxy() / tokens_per_s_sdk(); }
  double ttft_p50_ratio() const { return ttft_p50_ms_sdk / ttft_p50_ms_proxy; }
};

// InvalidArgument naming the flag for an unknown flag, a bad value, or a concurrency above 64
// (cloisterd's default max_generations per tenant and the proxy's HTTP threads).
absl::StatusOr<ProxyOverheadOptions> ParseProxyOverheadFlags(const std::vector<std::string>& args,
                                                             ProxyOverheadOptions options);
std::string ProxyOverheadUsage();
std::string ProxyOverheadJsonLine(const ProxyOverheadLine& line);
// The human-readable table: a header and one row per line.
std::string ProxyOverheadTable(const std::vector<ProxyOverheadLine>& lines);

// Runs the case; progress on `log`, the figures on `out` (one JSON line per concurrency with
// options.json, else the table).
absl::StatusOr<std::vector<ProxyOverheadLine>> RunProxyOverhead(const ProxyOverheadOptions& options,
                                                                std::FILE* out, std::FILE* log);

}  // namespace cloister::bench

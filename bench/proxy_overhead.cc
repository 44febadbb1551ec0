#include "bench/proxy_overhead.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/flags.h"
#include "base/status.h"
#include "bench/bench_support.h"
#include "bench/llm_enclave_driver.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "sdk/client.h"
#include "sdk/identity.h"
#include "tests/support/process.h"

namespace cloister::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kModelName[] = "bench-llm";
constexpr const char* kTenant = PublishingAppliance::kTenant;
// cloisterd's default max_generations per tenant; the proxy serves 64 requests at once too.
constexpr int kMaxConcurrency = 64;
constexpr int kReadTimeoutSeconds = 600;

// What one stream of one round gave.
struct Stream {
  double tokens = 0;   // completion tokens
  double ttft_ms = 0;  // request sent to the first text
  std::string text;
};

double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// One stream through the SDK.
absl::StatusOr<Stream> SdkStream(sdk::Client& client, int stream, int max_tokens,
                                 int tokens_per_chunk) {
  api::v1::GenerateRequest request;
  request.set_text(GenerationPrompt(stream));
  request.mutable_sampling()->set_temperature(0);
  request.set_max_tokens(max_tokens);
  request.set_ignore_eos(true);
  if (tokens_per_chunk > 1) request.mutable_shape()->set_tokens_per_chunk(tokens_per_chunk);
  Stream result;
  bool first = true;
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(sdk::GenerateResult generated,
                   client.Generate(kModelName, request, [&](const api::v1::GenerateChunk& chunk) {
                     if (first && !chunk.text().empty()) {
                       result.ttft_ms = MillisecondsSince(start);
                       first = false;
                     }
                   }));
  if (first) return absl::InternalError("an SDK stream carried no text");
  result.tokens = static_cast<double>(generated.usage.completion_tokens());
  result.text = std::move(generated.text);
  return result;
}

// Reads the server-sent events of one streamed /v1/completions answer as they arrive.
class SseReader {
 public:
  explicit SseReader(Clock::time_point start) : start_(start) {}

  // Takes the next bytes of the body; false (stop reading) once an event is wrong.
  bool Feed(const char* data, size_t size) {
    buffer_.append(data, size);
    size_t end;
    while (error_.ok() && (end = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, end);
      buffer_.erase(0, end + 1);
      OnLine(absl::StripSuffix(line, "\r"));
    }
    return error_.ok();
  }

  // The stream's figures once the body ended: an error unless it ended with [DONE] after a
  // usage event and some text.
  absl::StatusOr<Stream> Finish() && {
    RETURN_IF_ERROR(error_);
    if (!done_) return absl::DataLossError("the proxy's stream ended without data: [DONE]");
    if (!ttft_ms_.has_value()) return absl::InternalError("a proxy stream carried no text");
    if (!usage_) return absl::DataLossError("the proxy's stream had no usage event");
    result_.ttft_ms = *ttft_ms_;
    return std::move(result_);
  }

 private:
  void OnLine(absl::string_view line) {
    if (!absl::ConsumePrefix(&line, "data:")) return;  // blank lines between events
    line = absl::StripLeadingAsciiWhitespace(line);
    if (line == "[DONE]") {
      done_ = true;
      return;
    }
    nlohmann::json event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object()) {
      error_ =
          absl::DataLossError(absl::StrCat("the proxy sent an event that is not JSON: ", line));
      return;
    }
    if (event.contains("error")) {
      error_ = absl::InternalError(absl::StrCat("the proxy's stream failed: ", line));
      return;
    }
    if (event.contains("choices") && event["choices"].is_array() && !event["choices"].empty()) {
      const nlohmann::json& text = event["choices"][0]["text"];
      if (text.is_string() && !text.get<std::string>().empty()) {
        if (!ttft_ms_.has_value()) ttft_ms_ = MillisecondsSince(start_);
        result_.text += text.get<std::string>();
      }
    }
    if (event.contains("usage") && event["usage"].is_object()) {
      const nlohmann::json& tokens = event["usage"]["completion_tokens"];
      if (tokens.is_number()) {
        result_.tokens = tokens.get<double>();
        usage_ = true;
      }
    }
  }

  const Clock::time_point start_;
  std::string buffer_;
  absl::Status error_;
  std::optional<double> ttft_ms_;
  bool done_ = false;
  bool usage_ = false;
  Stream result_;
};

// One stream through the proxy: POST /v1/completions, streamed.
absl::StatusOr<Stream> ProxyStream(httplib::Client& http, int stream, int max_tokens,
                                   int tokens_per_chunk) {
  nlohmann::json body = {{"model", kModelName},      {"prompt", GenerationPrompt(stream)},
                         {"max_tokens", max_tokens}, {"temperature", 0},
                         {"ignore_eos", true},  // vLLM's extension, which the proxy honours
                         {"stream", true},           {"stream_options", {{"include_usage", true}}}};
  if (tokens_per_chunk > 1) body["stream_options"]["tokens_per_chunk"] = tokens_per_chunk;
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  request.body = body.dump();
  // A kept-alive connection that the proxy closed meanwhile (cpp-httplib's server closes one
  // after a few requests) fails before any answer: that attempt is sent again, once, on a new
  // connection, as HTTP clients do. Any failure after the answer began is an error.
  for (int attempt = 1;; ++attempt) {
    const Clock::time_point start = Clock::now();
    SseReader reader(start);
    int status = 0;
    std::string error_body;
    request.response_handler = [&](const httplib::Response& response) {
      status = response.status;
      return true;
    };
    request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      if (status != 200) {
        error_body.append(data, size);
        return true;
      }
      return reader.Feed(data, size);
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    const bool sent = http.send(request, response, error);
    if (status != 0 && status != 200) {
      return absl::InternalError(absl::StrCat("the proxy answered HTTP ", status, ": ",
                                              absl::StripAsciiWhitespace(error_body)));
    }
    if (!sent && status == 0 && attempt == 1 &&
        (error == httplib::Error::Read || error == httplib::Error::Write)) {
      continue;
    }
    if (!sent && error != httplib::Error::Canceled) {
      return absl::UnavailableError(
          absl::StrCat("POST /v1/completions to the proxy failed: ", httplib::to_string(error)));
    }
    return std::move(reader).Finish();
  }
}

// Runs `concurrency` streams of `run` at once; their results, and the seconds the round took.
template <typename Run>
absl::StatusOr<std::vector<Stream>> Round(int concurrency, const Run& run, double& seconds) {
  std::vector<Stream> streams(concurrency);
  absl::Mutex mu;
  absl::Status first_error;
  std::vector<std::thread> threads;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < concurrency; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<Stream> stream = run(i);
      absl::MutexLock lock(&mu);
      if (!stream.ok()) {
        if (first_error.ok()) first_error = stream.status();
        return;
      }
      streams[i] = *std::move(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  seconds = std::chrono::duration<double>(Clock::now() - start).count();
  RETURN_IF_ERROR(first_error);
  return streams;
}

bool SameTexts(const std::vector<Stream>& a, const std::vector<Stream>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].text != b[i].text) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<ProxyOverheadOptions> ParseProxyOverheadFlags(const std::vector<std::string>& args,
                                                             ProxyOverheadOptions options) {
  RETURN_IF_ERROR(ParseFlags(args, {{"--json", SwitchFlag{&options.json}},
                                    {"--models-dir", StringFlag{&options.models_dir, {}}},
                                    {"--model-dir", StringFlag{&options.model_dir, {}}},
                                    {"--cloisterd", StringFlag{&options.cloisterd, {}}},
                                    {"--cloister", StringFlag{&options.cloister, {}}},
                                    {"--concurrency", IntListFlag{&options.concurrency, 1}},
                                    {"--max-tokens", IntFlag{&options.max_tokens, 1}},
                                    {"--rounds", IntFlag{&options.rounds, 1}},
                                    {"--tokens-per-chunk",
                                     IntFlag{&options.tokens_per_chunk, 1}}}));
  if (options.tokens_per_chunk > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens-per-chunk ", options.tokens_per_chunk, " is above 4096"));
  }
  for (int concurrency : options.concurrency) {
    if (concurrency > kMaxConcurrency) {
      return absl::InvalidArgumentError(
          absl::StrCat("--concurrency ", concurrency, " is above ", kMaxConcurrency,
                       " (cloisterd's default max_generations per tenant)"));
    }
  }
  return options;
}

std::string ProxyOverheadUsage() {
  return "streamed generation through `cloister proxy` over the SDK called directly, one\n"
         "                   real cloisterd [--json] [--concurrency 1,16] [--max-tokens N (64)]\n"
         "                   [--rounds N (3)] [--model-dir DIR (default: the tiny model)]\n"
         "                   [--tokens-per-chunk N (1: every token its own chunk)]\n"
         "                   [--cloisterd PATH] [--cloister PATH] [--models-dir DIR]\n";
}

std::string ProxyOverheadJsonLine(const ProxyOverheadLine& line) {
  nlohmann::ordered_json json;
  json["case"] = "proxy-overhead";
  json["model"] = line.model;
  json["concurrency"] = line.concurrency;
  json["max_tokens"] = line.max_tokens;
  json["rounds"] = line.rounds;
  json["tokens_per_chunk"] = std::max(line.tokens_per_chunk, 1);
  json["tokens_per_s_sdk"] = line.tokens_per_s_sdk();
  json["tokens_per_s_proxy"] = line.tokens_per_s_proxy();
  json["tokens_per_s_ratio"] = line.tokens_per_s_ratio();
  json["ttft_p50_ms_sdk"] = line.ttft_p50_ms_sdk;
  json["ttft_p50_ms_proxy"] = line.ttft_p50_ms_proxy;
  json["ttft_p50_ratio"] = line.ttft_p50_ratio();
  json["texts_match"] = line.texts_match;
  return json.dump();
}

std::string ProxyOverheadTable(const std::vector<ProxyOverheadLine>& lines) {
  std::string table =
      absl::StrFormat("%-11s %12s %12s %7s %12s %12s %7s %s\n", "concurrency", "sdk tok/s",
                      "proxy tok/s", "ratio", "sdk TTFT ms", "proxy TTFT", "ratio", "texts");
  for (const ProxyOverheadLine& line : lines) {
    absl::StrAppendFormat(&table, "%-11d %12.1f %12.1f %7.3f %12.2f %12.2f %7.3f %s\n",
                          line.concurrency, line.tokens_per_s_sdk(), line.tokens_per_s_proxy(),
                          line.tokens_per_s_ratio(), line.ttft_p50_ms_sdk, line.ttft_p50_ms_proxy,
                          line.ttft_p50_ratio(), line.texts_match ? "match" : "DIFFER");
  }
  absl::StrAppend(&table,
                  "ratios: proxy tokens/s over sdk, sdk TTFT p50 over proxy (target 0.95)\n");
  return table;
}

absl::StatusOr<std::vector<ProxyOverheadLine>> RunProxyOverhead(const ProxyOverheadOptions& options,
                                                                std::FILE* out, std::FILE* log) {
  const std::string model_dir = options.model_dir.empty()
                                    ? (fs::path(options.models_dir) / "llm" / "tiny-llama").string()
                                    : options.model_dir;
  if (::access(options.cloisterd.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cloisterd binary ", options.cloisterd,
                                            " is missing or not executable (see --cloisterd)"));
  }
  if (::access(options.cloister.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cloister binary ", options.cloister,
                                            " is missing or not executable (see --cloister)"));
  }
  const std::string model = ModelNameOfDir(model_dir);
  int max_concurrency = 0;
  for (int concurrency : options.concurrency) {
    max_concurrency = std::max(max_concurrency, concurrency);
  }

  // cloisterd publishing the checkpoint folder to its tenants.
  ASSIGN_OR_RETURN(const std::string work, MakeScratchDir("cloister-proxy-bench"));
  ASSIGN_OR_RETURN(PublishingAppliance appliance,
                   StartPublishingAppliance(options.cloisterd, work, model_dir, kModelName));

  // The tenant's identity, in a key file for the proxy and in memory for the SDK clients.
  auto identity = std::make_shared<sdk::TenantIdentity>(sdk::TenantIdentity::Generate());
  const std::string key_file = work + "/tenant.key";
  RETURN_IF_ERROR(identity->Save(key_file));

  // The proxy, as a tenant runs it: connection settings from CLOISTER_*, loopback, port 0.
  const std::string proxy_logs = work + "/proxy";
  fs::create_directories(proxy_logs);
  testing::Process proxy({options.cloister, "proxy", "--listen", "127.0.0.1:0"}, proxy_logs,
                         {{"CLOISTER_SERVER", appliance.server},
                          {"CLOISTER_POLICY", appliance.policy_file},
                          {"CLOISTER_TENANT", kTenant},
                          {"CLOISTER_TOKEN_FILE", appliance.token_file},
                          {"CLOISTER_KEY", key_file}});
  const std::string proxy_line =
      proxy.WaitForStdout("cloister proxy listening on ", absl::Seconds(60));
  if (proxy_line.empty()) {
    return absl::UnavailableError(absl::StrCat("cloister proxy did not start: ", proxy.Stderr()));
  }
  // "... listening on http://127.0.0.1:PORT/v1".
  const std::string last_word = proxy_line.substr(proxy_line.rfind(' ') + 1);
  absl::string_view url = absl::StripAsciiWhitespace(last_word);
  int port = 0;
  if (!absl::ConsumePrefix(&url, "http://127.0.0.1:") || !absl::ConsumeSuffix(&url, "/v1") ||
      !absl::SimpleAtoi(url, &port) || port <= 0 || port > 65535) {
    return absl::InternalError(absl::StrCat("cannot read the proxy's address from: ", proxy_line));
  }
  if (!options.json) absl::FPrintF(log, "cloister proxy on 127.0.0.1:%d\n", port);

  // One SDK client (its own session) and one HTTP client (its own connection) per stream.
  sdk::ClientOptions client_options;
  client_options.server = appliance.server;
  client_options.tenant_id = kTenant;
  client_options.token = appliance.token;
  client_options.policy_path = appliance.policy_file;
  client_options.identity = identity;
  client_options.call_timeout = absl::Minutes(10);
  std::vector<std::unique_ptr<sdk::Client>> clients;
  std::vector<std::unique_ptr<httplib::Client>> https;
  for (int c = 0; c < max_concurrency; ++c) {
    ASSIGN_OR_RETURN(std::unique_ptr<sdk::Client> client, sdk::Client::Connect(client_options));
    clients.push_back(std::move(client));
    auto http = std::make_unique<httplib::Client>("127.0.0.1", port);
    http->set_keep_alive(true);
    // As OpenAI client libraries do: without it, Nagle holds the body back behind the
    // headers until the proxy's delayed ACK (40 ms on Linux), which is no cost of the proxy.
    http->set_tcp_nodelay(true);
    http->set_read_timeout(kReadTimeoutSeconds, 0);
    https.push_back(std::move(http));
  }
  auto sdk_run = [&](int i) {
    return SdkStream(*clients[i], i, options.max_tokens, options.tokens_per_chunk);
  };
  auto proxy_run = [&](int i) {
    return ProxyStream(*https[i], i, options.max_tokens, options.tokens_per_chunk);
  };

  std::vector<ProxyOverheadLine> lines;
  for (int concurrency : options.concurrency) {
    ProxyOverheadLine line;
    line.model = model;
    line.concurrency = concurrency;
    line.max_tokens = options.max_tokens;
    line.rounds = options.rounds;
    line.tokens_per_chunk = options.tokens_per_chunk;
    // Untimed warm-up of both sides, and the greedy texts compared stream by stream.
    double seconds = 0;
    ASSIGN_OR_RETURN(std::vector<Stream> sdk_warm, Round(concurrency, sdk_run, seconds));
    ASSIGN_OR_RETURN(std::vector<Stream> proxy_warm, Round(concurrency, proxy_run, seconds));
    line.texts_match = SameTexts(sdk_warm, proxy_warm);
    if (!line.texts_match && !options.json) {
      absl::FPrintF(log, "concurrency %d: the proxy's greedy texts differ from the SDK's\n",
                    concurrency);
    }
    std::vector<double> ttft_sdk, ttft_proxy;
    for (int round = 0; round < options.rounds; ++round) {
      // Alternate which side goes first, so that neither always follows the other.
      double sdk_seconds = 0, proxy_seconds = 0;
      std::vector<Stream> sdk_streams, proxy_streams;
      for (int side = 0; side < 2; ++side) {
        if ((side + round) % 2 == 0) {
          ASSIGN_OR_RETURN(sdk_streams, Round(concurrency, sdk_run, sdk_seconds));
        } else {
          ASSIGN_OR_RETURN(proxy_streams, Round(concurrency, proxy_run, proxy_seconds));
        }
      }
      double sdk_tokens = 0, proxy_tokens = 0;
      for (const Stream& stream : sdk_streams) {
        sdk_tokens += stream.tokens;
        ttft_sdk.push_back(stream.ttft_ms);
      }
      for (const Stream& stream : proxy_streams) {
        proxy_tokens += stream.tokens;
        ttft_proxy.push_back(stream.ttft_ms);
      }
      line.sdk_tokens += sdk_tokens;
      line.sdk_seconds += sdk_seconds;
      line.proxy_tokens += proxy_tokens;
      line.proxy_seconds += proxy_seconds;
      line.texts_match = line.texts_match && SameTexts(sdk_streams, sdk_warm) &&
                         SameTexts(proxy_streams, sdk_warm);
      if (!options.json) {
        absl::FPrintF(log, "concurrency %d round %d: sdk %.0f tokens/s, proxy %.0f tokens/s\n",
                      concurrency, round + 1, sdk_tokens / sdk_seconds,
                      proxy_tokens / proxy_seconds);
      }
    }
    line.ttft_p50_ms_sdk = Percentile(ttft_sdk, 0.5);
    line.ttft_p50_ms_proxy = Percentile(ttft_proxy, 0.5);
    if (options.json) absl::FPrintF(out, "%s\n", ProxyOverheadJsonLine(line));
    lines.push_back(std::move(line));
  }
  https.clear();
  clients.clear();
  const int proxy_exit = proxy.Stop(SIGTERM);
  appliance.cloisterd->Stop(SIGTERM);
  if (proxy_exit != 0 && !options.json) {
    absl::FPrintF(log, "cloister proxy exited with status %d on SIGTERM\n", proxy_exit);
  }
  if (!options.json) {
    absl::FPrintF(out, "proxy-overhead %s, %d tokens each, %d rounds, %d token(s) per chunk\n%s",
                  model, options.max_tokens, options.rounds, std::max(options.tokens_per_chunk, 1),
                  ProxyOverheadTable(lines));
  }
  return lines;
}

}  // namespace cloister::bench

// GenerationService: the enclave's side of Generate (docs/PROTOCOL.md, "Generation streams").
// Each LLM that has a generation running gets an llm::Generator, and one stepping thread steps
// them all, each time the one whose next sequence ranks first by class and by its tenant's
// weighted token service (shared counters, so tenants are served fairly across models as within
// one): new sequences join between steps, every step's tokens are
// detokenized there, gathered into chunks (StreamShape), padded, sealed to the tenant's session
// with the stream's place bound in the associated data, and written to the host as one
// GenerateResult frame each. The final chunk carries the finish reason, usage and the signed
// usage receipt of the request. Cancel (the host's CancelCall) and a passed deadline take a
// sequence out before the next step; its KV blocks are scrubbed and freed by the Generator.
//
// Errors decided after a request opened (a prompt past the context, a bad sampling value, an
// engine failure) end the stream with a sealed final chunk that carries them; the caller
// handles requests that did not open.
//
// Threading: Start and Cancel are thread-safe and never wait for a step. Frames are written
// from the stepping thread. The destructor ends every open stream with a sealed UNAVAILABLE
// chunk and joins the thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include <deque>
#include <map>
#include <set>
#include <thread>
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/secret_bytes.h"
#include "cloister/api/v1/api.pb.h"
#include "cloister/boundary/v1/boundary.pb.h"
#include "enclave/accounting/usage_ledger.h"
#include "enclave/boundary/boundary_server.h"
#include "enclave/llm/generator.h"
#include "enclave/models/model_store.h"
#include "enclave/pcie/transfer_path.h"
#include "enclave/session/session_manager.h"

namespace cloister::enclave {

struct GenerationOptions {
  int threads = 1;            // each model's CPU engine
  int max_sequences = 16;     // running at once per model; more wait in the Generator's queue
  int max_step_tokens = 512;  // tokens one step may carry (decode first, then prefill chunks)
  // For this long after a realtime tenant's last sequence, other tenants' prefill goes in chunks
  // of at most realtime_step_tokens, so that a realtime request that arrives does not wait
  // behind a long step (its time to first token stays short).
  absl::Duration realtime_guard = absl::Seconds(2);
  int realtime_step_tokens = 64;
  // A realtime request that arrives while a step without realtime work runs interrupts that
  // step between two layers (llm::Generator::set_interrupt): it waits for one layer, not the
  // whole step. The interrupted step is done again after the realtime prefill.
  bool interrupt_for_realtime = true;
  // Where each step's token ids and results cross (step_transfer.h): the enclave's host
  // transfer path; null: they do not cross (a device engine with a path of its own).
  pcie::TransferPath* transfer = nullptr;
};

// The default StreamShape.pad_to: every chunk's plaintext a multiple of this many bytes.
inline constexpr uint32_t kDefaultChunkPadding = 256;

class GenerationService {
 public:
  GenerationService(const SecretBytes* signing_seed, UsageLedger* usage, Clock* clock,
                    GenerationOptions options);
  ~GenerationService();
  GenerationService(const GenerationService&) = delete;
  GenerationService& operator=(const GenerationService&) = delete;

  // One opened request: everything the stream needs, the request's plaintext already parsed.
  struct Request {
    uint64_t call_id = 0;
    std::string tenant_id;
    std::shared_ptr<Session> session;
    std::string request_id;    // the item's, bound in every chunk with the model handle
    std::string model_handle;
    // The model, or why the request is refused (sent as the stream's only chunk).
    std::shared_ptr<const StoredModel> model;
    absl::Status refusal;
    api::v1::GenerateRequest request;
    uint64_t max_tokens_limit = 0;  // the host's cap (GenerateLimits.max_tokens); 0: none
    llm::Priority priority = llm::Priority::kStandard;  // and the tenant's class and weight
    double weight = 1;
    uint64_t kv_cache_tokens = 0;  // the tenant's KV quota; 0: none
    double tokens_per_second = 0;  // the tenant's token bucket; 0: none
    double token_burst = 0;
    std::optional<absl::Time> deadline;
    std::shared_ptr<FrameSink> sink;
  };

  // Starts the stream: from here on every outcome, an error included, is a sealed chunk on
  // request.sink ending in one final chunk. A call id already running is refused the same way.
  void Start(Request request) ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the generation of `call_id`; false when it is not running (it ended, or never was).
  bool Cancel(uint64_t call_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Streams running or waiting, over all models.
  size_t active() ABSL_LOCKS_EXCLUDED(mu_);

  // The operator's view of the generations (GetStatsCall), as the stepping thread last
  // published it (after each of its turns): per tenant and class, sequences running and
  // waiting and the KV blocks they hold; the blocks of all generators' caches. Any thread.
  struct Occupancy {
    std::vector<llm::Generator::Occupancy> tenants;
    int64_t kv_blocks_total = 0;
    int32_t kv_block_size = 0;
    // Best-effort steps given up for a realtime arrival since the service started
    // (GenerationOptions::interrupt_for_realtime): the work thrown away, in steps.
    int64_t interrupted_steps = 0;
  };
  Occupancy occupancy() ABSL_LOCKS_EXCLUDED(occupancy_mu_);

 private:
  struct Stream;
  struct Engine;

  // The stepping thread: takes new streams and cancels, steps the model whose next sequence
  // ranks first, releases generators idle for a while.
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // A generator for `model`, its steps on the transfer path when there is one.
  absl::StatusOr<std::unique_ptr<llm::Generator>> MakeGenerator(const StoredModel& model,
                                                                const llm::GeneratorOptions& options);
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Admit(std::unique_ptr<Stream> stream);
  void Step(Engine& engine);
  // Ends a stream whose sequence finished; false when its final chunk waits for the stream's
  // next tick (a fixed cadence), the stream then kept in finishing_.
  bool Finish(Stream& stream, const llm::TokenEvent& event);
  // Sends the chunks of fixed-cadence streams whose tick has come (the held tokens, or the
  // final chunk of a finished one); `all_final`: every finished one now (stopping). The time
  // of the next tick of any stream, or InfiniteFuture.
  absl::Time Tick(absl::Time now, bool all_final = false);
  // Seals `chunk` as the stream's next chunk and writes it; final ends the stream. False when
  // it could not be sealed (the host then gets the error as the stream's last frame).
  bool Send(Stream& stream, api::v1::GenerateChunk& chunk, bool final,
            const boundary::v1::SignedUsageReceipt* receipt) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a stream with an error chunk (and its receipt, when a model was found).
  void Fail(Stream& stream, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Signs the stream's usage; nothing without a model, or on failure (logged).
  std::optional<boundary::v1::SignedUsageReceipt> Receipt(const Stream& stream, bool ran,
                                                          uint64_t cached, uint64_t completion);
  void Forget(const Stream& stream) ABSL_LOCKS_EXCLUDED(mu_);

  const SecretBytes* const signing_seed_;
  UsageLedger* const usage_;
  Clock* const clock_;
  const GenerationOptions options_;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Stream>> incoming_ ABSL_GUARDED_BY(mu_);
  // Set (under mu_) when a realtime request joins `incoming_`, cleared when the stepping
  // thread takes them; the generators' steps without realtime work watch it.
  std::atomic<bool> interrupt_{false};
  int64_t interrupted_steps_ = 0;  // stepping thread only
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> calls_ ABSL_GUARDED_BY(mu_);  // call ids with a stream not yet ended
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The stepping thread's own: one engine per model handle, and the tenants' fair-share
  // counters all of them charge (so tenants share the cores fairly across models too).
  std::map<std::string, std::unique_ptr<Engine>> engines_;
  // Fixed-cadence streams whose sequence finished, their final chunk waiting for its tick.
  std::vector<std::unique_ptr<Stream>> finishing_;
  // The earliest tick of a fixed-cadence stream, for the idle wait (the stepping thread's,
  // read under mu_ only by itself).
  absl::Time next_tick_ = absl::InfiniteFuture();
  const std::shared_ptr<llm::TenantCounters> counters_;
  absl::Time last_realtime_ = absl::InfinitePast();  // when a realtime sequence last ran
  // Publishes occupancy_ from the engines (the stepping thread's).
  void PublishOccupancy() ABSL_LOCKS_EXCLUDED(occupancy_mu_);
  absl::Mutex occupancy_mu_;
  Occupancy occupancy_ ABSL_GUARDED_BY(occupancy_mu_);
  struct TokenBucket {
    double level = 0;
    absl::Time refilled = absl::InfinitePast();
  };
  std::map<std::string, TokenBucket> buckets_;  // per tenant with a token rate
  // Takes `cost` tokens from the tenant's bucket, or says why not (the stepping thread's).
  absl::Status TakeTokens(const Stream& stream, double cost);
  void ReturnTokens(const Stream& stream, double tokens);
  std::thread thread_;  // last: it starts once everything above is set up
};

}  // namespace cloister::enclave

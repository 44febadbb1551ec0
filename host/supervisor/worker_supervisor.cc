#include "host/supervisor/worker_supervisor.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status.h"
#include "crypto/hash.h"
#include "crypto/random.h"
#include "proto/checkpoint_dir.h"
#include "proto/error_reason.h"
#include "proto/frame.h"

namespace cloister::host {
namespace {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;

// What ProcessEnclaveClient answers when its worker is gone.

// The session a sealed call other than InferBatch names, or nullptr.
const std::string* SessionOf(const HostToEnclave& call) {
  switch (call.call_case()) {
    case HostToEnclave::kListModels:
      return &call.list_models().request().session_id();
    case HostToEnclave::kDeleteModel:
      return &call.delete_model().request().session_id();
    case HostToEnclave::kLoadModel:
      return &call.load_model().request().session_id();
    case HostToEnclave::kGenerate:
      return &call.generate().request().session_id();
    default:
      return nullptr;
  }
}

// Sends GetEvidenceCalls until one succeeds (a worker answers once its start-up is done).
absl::StatusOr<boundary::v1::GetEvidenceResult> WaitForEvidence(ProcessEnclaveClient& enclave,
                                                                absl::Duration timeout) {
  absl::Time give_up = absl::Now() + timeout;
  absl::Status last = absl::DeadlineExceededError("no attempt");
  while (absl::Now() < give_up) {
    HostToEnclave call;
    call.mutable_get_evidence()->set_nonce(ToString(crypto::RandomBytes(32)));
    absl::StatusOr<EnclaveToHost> reply =
        CallAndWait(enclave, std::move(call), give_up - absl::Now());
    if (reply.ok()) return reply->get_evidence();
    last = reply.status();
    if (absl::IsUnavailable(last) || !enclave.connected()) return last;
    Log(LogLevel::kInfo, "waiting_for_enclave", {{"error", last.ToString()}});
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "enclave worker not ready after ", absl::FormatDuration(timeout), ": ", last.ToString()));
}

}  // namespace

namespace {

// The bytes published from `path`: the file, or the package of a checkpoint folder.
absl::StatusOr<std::string> ReadModelBytes(const std::string& path, uint64_t max_size) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    ASSIGN_OR_RETURN(Bytes packed, package::PackCheckpointDir(path, max_size));
    return ToString(packed);
  }
  return ReadFile(path, max_size);
}

}  // namespace

absl::StatusOr<std::string> PublishedModelDigest(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadModelBytes(path, boundary::kMaxFrameSize - 4096);
  if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes.status().message()));
  return HexEncode(crypto::Sha256(AsBytes(*bytes)));
}

absl::StatusOr<std::string> ReadPublishedModel(const PublishedModelSource& model,
                                               uint64_t max_size) {
  const std::string where = absl::StrCat("published model ", model.name, " (", model.file, ")");
  absl::StatusOr<std::string> bytes = ReadModelBytes(model.file, max_size);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", bytes.status().message()));
  }
  std::string digest = HexEncode(crypto::Sha256(AsBytes(*bytes)));
  if (digest != model.digest) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has digest ", digest,
                                                   " but the config expects ", model.digest));
  }
  return bytes;
}

absl::Status PublishModels(const std::vector<PublishedModelSource>& models,
                           EnclaveClient& enclave, absl::Duration timeout, int* published_out) {
  int published = 0;
  for (const PublishedModelSource& model : models) {
    ASSIGN_OR_RETURN(std::string bytes, ReadPublishedModel(model, boundary::kMaxFrameSize - 4096));
    HostToEnclave call;
    boundary::v1::PublishModelCall* publish = call.mutable_publish_model();
    publish->set_name(model.name);
    publish->set_model(std::move(bytes));
    publish->set_digest(model.digest);
    absl::StatusOr<EnclaveToHost> reply = CallAndWait(enclave, std::move(call), timeout);
    if (!reply.ok()) {
      if (absl::IsUnavailable(reply.status())) return reply.status();
      return absl::Status(reply.status().code(),
                          absl::StrCat("the enclave refused published model ", model.name, ": ",
                                       reply.status().message()));
    }
    ++published;
    Log(LogLevel::kInfo, "model_published",
        {{"name", model.name},
         {"handle", reply->publish_model().model_handle()},
         {"digest", model.digest}});
  }
  if (published_out != nullptr) *published_out = published;
  return absl::OkStatus();
}

absl::Status ReloadStoredModels(BlobStore& blobs, EnclaveClient& enclave, absl::Duration timeout,
                                int* reloaded_out) {
  ASSIGN_OR_RETURN(std::vector<StoredModel> models, blobs.List());
  int reloaded = 0;
  for (const StoredModel& model : models) {
    auto skip = [&](const absl::Status& why) {
      Log(LogLevel::kWarning, "model_reload_failed",
          {{"tenant", model.tenant_id}, {"handle", model.handle}, {"error", why.ToString()}});
    };
    absl::StatusOr<std::string> ciphertext = blobs.ReadCiphertext(model.tenant_id, model.handle);
    if (!ciphertext.ok()) {
      skip(ciphertext.status());
      continue;
    }
    if (HexEncode(crypto::Sha256(AsBytes(*ciphertext))) != model.ciphertext_sha256) {
      skip(absl::DataLossError("stored ciphertext does not match its recorded SHA-256"));
      continue;
    }
    absl::StatusOr<std::string> wrapped_key = blobs.ReadWrappedKey(model.tenant_id, model.handle);
    if (!wrapped_key.ok()) {
      skip(wrapped_key.status());
      continue;
    }
    HostToEnclave call;
    boundary::v1::ReloadModelCall* reload = call.mutable_reload_model();
    reload->set_model_handle(model.handle);
    reload->set_wrapped_model_key(*std::move(wrapped_key));
    reload->set_model_ciphertext(*std::move(ciphertext));
    absl::StatusOr<EnclaveToHost> reply = CallAndWait(enclave, std::move(call), timeout);
    if (!reply.ok()) {
      if (absl::IsUnavailable(reply.status())) return reply.status();
      skip(reply.status());
      continue;
    }
    ++reloaded;
    Log(LogLevel::kInfo, "model_reloaded", {{"tenant", model.tenant_id}, {"handle", model.handle}});
  }
  Log(LogLevel::kInfo, "models_reloaded",
      {{"reloaded", reloaded}, {"stored", static_cast<long long>(models.size())}});
  if (reloaded_out != nullptr) *reloaded_out = reloaded;
  return absl::OkStatus();
}

// One worker index: the stable EnclaveClient in front of its current incarnation.
class WorkerSupervisor::Worker : public EnclaveClient {
 public:
  Worker(int index, int max_stale_sessions)
      : index_(index), max_stale_sessions_(std::max(1, max_stale_sessions)) {}

  void Call(HostToEnclave call, Done done) override {
    if (IsStreamingCall(call.call_case())) {
      done(StreamingCallError());
      return;
    }
    Send(std::move(call), nullptr, std::move(done));
  }

  // The stream id is the supervisor's own: a process's call ids start again with each
  // incarnation, so a Cancel() for a stream of a dead one must not reach the next one.
  uint64_t CallStream(HostToEnclave call, OnFrame on_frame, Done done) override {
    return Send(std::move(call), std::move(on_frame), std::move(done));
  }

  void Cancel(uint64_t stream_id) override {
    ProcessEnclaveClient* target = nullptr;
    uint64_t call_id = 0;
    {
      absl::MutexLock lock(&mu);
      auto it = streams.find(stream_id);
      if (it == streams.end()) return;
      target = it->second.first;
      call_id = it->second.second;
    }
    // A dead incarnation is stopped but kept: it no longer holds the call and does nothing.
    target->Cancel(call_id);
  }

  // Call() and CallStream() (`on_frame` set): routed to the current incarnation unless the
  // worker restarts or the call names a session of an earlier one. Returns the stream id (0 for
  // a call, or a refusal).
  uint64_t Send(HostToEnclave call, OnFrame on_frame, Done done) {
    ProcessEnclaveClient* target = nullptr;
    uint64_t generation = 0;
    uint64_t stream_id = 0;
    std::vector<bool> stale_items;  // InferBatch: items naming a dead incarnation's session
    absl::Status refusal;
    {
      absl::MutexLock lock(&mu);
      if ((!ready || current == nullptr) && call.has_reload_model() && !given_up) {
        // A model uploaded while this worker restarts: held and handed to the new incarnation
        // before it serves, so that it does not miss the model.
        held_reloads.emplace_back(std::move(call), std::move(done));
        return 0;
      }
      if ((!ready || current == nullptr) && call.has_get_evidence() && !given_up) {
        // A client attesting (again): answered by the new incarnation once it serves, whose
        // evidence its session will need.
        held_evidence.emplace_back(std::move(call), std::move(done));
        return 0;
      }
      if (!ready || current == nullptr) {
        refusal = absl::UnavailableError(
            absl::StrCat("enclave worker ", index_, " is restarting; retry"));
      } else if (const std::string* session = SessionOf(call);
                 session != nullptr && stale_sessions.contains(*session)) {
        refusal = SessionLostError();
      } else {
        if (call.has_infer_batch()) {
          bool any = false;
          for (const auto& item : call.infer_batch().items()) {
            bool stale = stale_sessions.contains(item.session_id());
            stale_items.push_back(stale);
            any = any || stale;
          }
          if (!any) stale_items.clear();
        }
        target = current;
        generation = this->generation;
        if (on_frame != nullptr) {
          // Registered before the call goes out: its `done` may run before CallStream returns.
          stream_id = next_stream_id++;
          streams.emplace(stream_id, std::make_pair(target, uint64_t{0}));
        }
      }
    }
    if (!refusal.ok()) {
      done(std::move(refusal));
      return 0;
    }
    const HostToEnclave::CallCase call_case = call.call_case();
    Done relay = [this, generation, call_case, stream_id, stale_items = std::move(stale_items),
                  done = std::move(done)](Reply reply) mutable {
      if (stream_id != 0) {
        absl::MutexLock lock(&mu);
        streams.erase(stream_id);
      }
      if (!reply.ok()) {
        if (proto::ReasonOf(reply.status()) == api::v1::WORKER_EXITED) {
          reply =
              proto::WithReason(absl::UnavailableError(absl::StrCat(
                                    "enclave worker ", index_,
                                    " exited while holding this call; it is restarting, retry")),
                                api::v1::WORKER_EXITED);
        }
        done(std::move(reply));
        return;
      }
      if (call_case == HostToEnclave::kOpenSession) {
        RecordSession(generation, reply->open_session().session_id());
      } else if (!stale_items.empty() && reply->has_infer_batch()) {
        auto* replies = reply->mutable_infer_batch()->mutable_replies();
        for (int i = 0; i < replies->size() && i < static_cast<int>(stale_items.size()); ++i) {
          boundary::v1::EnclaveReply& item = (*replies)[i];
          if (stale_items[i] && item.has_status() && item.status().code() != 0) {
            proto::SetBoundaryStatus(SessionLostError(), *item.mutable_status());
          }
        }
      }
      done(std::move(reply));
    };
    if (stream_id == 0) {
      target->Call(std::move(call), std::move(relay));
      return 0;
    }
    uint64_t call_id = target->CallStream(std::move(call), std::move(on_frame), std::move(relay));
    absl::MutexLock lock(&mu);
    if (auto it = streams.find(stream_id); it != streams.end()) it->second.second = call_id;
    return stream_id;
  }

  // A session opened by incarnation `generation`.
  void RecordSession(uint64_t generation, const std::string& session_id) {
    absl::MutexLock lock(&mu);
    if (generation == this->generation && ready) {
      stale_sessions.erase(session_id);  // a new incarnation may reuse an id
      if (live_sessions.insert(session_id).second) live_order.push_back(session_id);
      // Bounded like the stale ones: the oldest are long expired in the enclave anyway.
      while (static_cast<int>(live_order.size()) > max_stale_sessions_) {
        live_sessions.erase(live_order.front());
        live_order.pop_front();
      }
    } else {
      AddStaleLocked(session_id);
    }
  }

  // The current incarnation died: its sessions become stale.
  void RetireSessionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const std::string& session : live_order) AddStaleLocked(session);
    live_sessions.clear();
    live_order.clear();
  }

  void AddStaleLocked(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!stale_sessions.insert(session_id).second) return;
    stale_order.push_back(session_id);
    while (static_cast<int>(stale_order.size()) > max_stale_sessions_) {
      stale_sessions.erase(stale_order.front());
      stale_order.pop_front();
    }
  }

  const int index_;
  const int max_stale_sessions_;

  mutable absl::Mutex mu;
  // All incarnations, the current one last; dead ones are kept (stopped) until the end.
  std::vector<std::unique_ptr<ProcessEnclaveClient>> incarnations ABSL_GUARDED_BY(mu);
  ProcessEnclaveClient* current ABSL_GUARDED_BY(mu) = nullptr;  // set while ready
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;  // the current (or starting) incarnation
  uint64_t next_generation ABSL_GUARDED_BY(mu) = 0;
  bool ready ABSL_GUARDED_BY(mu) = false;
  bool starting ABSL_GUARDED_BY(mu) = false;
  bool died_while_starting ABSL_GUARDED_BY(mu) = false;
  bool given_up ABSL_GUARDED_BY(mu) = false;
  // ReloadModel calls that arrived while restarting, for the next incarnation.
  std::vector<std::pair<HostToEnclave, Done>> held_reloads ABSL_GUARDED_BY(mu);
  // GetEvidence calls that arrived while restarting, sent on once the new incarnation serves.
  std::vector<std::pair<HostToEnclave, Done>> held_evidence ABSL_GUARDED_BY(mu);
  int restarts ABSL_GUARDED_BY(mu) = 0;
  absl::Time up_since ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  absl::flat_hash_set<std::string> live_sessions ABSL_GUARDED_BY(mu);
  std::deque<std::string> live_order ABSL_GUARDED_BY(mu);  // live_sessions, oldest first
  absl::flat_hash_set<std::string> stale_sessions ABSL_GUARDED_BY(mu);
  std::deque<std::string> stale_order ABSL_GUARDED_BY(mu);
  // Open streams: stream id -> the incarnation holding it and its call id there (0 until
  // CallStream has returned it).
  absl::flat_hash_map<uint64_t, std::pair<ProcessEnclaveClient*, uint64_t>> streams
      ABSL_GUARDED_BY(mu);
  uint64_t next_stream_id ABSL_GUARDED_BY(mu) = 1;
};

WorkerSupervisor::WorkerSupervisor(WorkerSupervisorOptions options) : options_(std::move(options)) {
  for (int index = 0; index < options_.worker_count; ++index) {
    workers_.push_back(std::make_unique<Worker>(index, options_.max_stale_sessions));
  }
}

absl::StatusOr<std::unique_ptr<WorkerSupervisor>> WorkerSupervisor::Start(
    WorkerSupervisorOptions options) {
  if (options.worker_count < 1) {
    return absl::InvalidArgumentError("the supervisor needs at least one worker");
  }
  if (!options.start_worker) {
    return absl::InvalidArgumentError("the supervisor needs a start_worker function");
  }
  if (options.initial_backoff <= absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff || options.max_consecutive_failures < 1) {
    return absl::InvalidArgumentError(
        "restart backoff must be positive, max_backoff at least initial_backoff and "
        "max_consecutive_failures at least 1");
  }
  std::unique_ptr<WorkerSupervisor> supervisor(new WorkerSupervisor(std::move(options)));
  for (int index = 0; index < supervisor->worker_count(); ++index) {
    if (absl::Status started = supervisor->StartIncarnation(index); !started.ok()) {
      supervisor->Stop();
      return started;
    }
  }
  supervisor->thread_ = std::thread([raw = supervisor.get()] { raw->SuperviseLoop(); });
  return supervisor;
}

WorkerSupervisor::~WorkerSupervisor() { Stop(); }

EnclaveClient* WorkerSupervisor::client(int index) const {
  CLOISTER_CHECK(index >= 0 && index < worker_count());
  return workers_[index].get();
}

std::vector<EnclaveClient*> WorkerSupervisor::clients() const {
  std::vector<EnclaveClient*> clients;
  for (const auto& worker : workers_) clients.push_back(worker.get());
  return clients;
}

int WorkerSupervisor::restarts(int index) const {
  Worker& worker = *workers_.at(index);
  absl::MutexLock lock(&worker.mu);
  return worker.restarts;
}

bool WorkerSupervisor::ready(int index) const {
  Worker& worker = *workers_.at(index);
  absl::MutexLock lock(&worker.mu);
  return worker.ready;
}

bool WorkerSupervisor::gave_up() const {
  absl::MutexLock lock(&mu_);
  return gave_up_;
}

pid_t WorkerSupervisor::pid(int index) const {
  Worker& worker = *workers_.at(index);
  absl::MutexLock lock(&worker.mu);
  return worker.current != nullptr ? worker.current->pid() : -1;
}

bool WorkerSupervisor::WaitForRestarts(int index, int restarts, absl::Duration timeout) const {
  Worker& worker = *workers_.at(index);
  absl::MutexLock lock(&worker.mu);
  auto done = [&worker, restarts]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker.mu) {
    return worker.restarts >= restarts && worker.ready;
  };
  return worker.mu.AwaitWithTimeout(absl::Condition(&done), timeout);
}

absl::Status WorkerSupervisor::StartIncarnation(int index) {
  Worker& worker = *workers_[index];
  uint64_t generation;
  {
    absl::MutexLock lock(&worker.mu);
    generation = worker.next_generation++;
    worker.generation = generation;
    worker.starting = true;
    worker.died_while_starting = false;
  }
  auto fail = [&](absl::Status why) {
    absl::MutexLock lock(&worker.mu);
    worker.starting = false;
    return why;
  };
  absl::StatusOr<std::unique_ptr<ProcessEnclaveClient>> process = options_.start_worker(
      index,
      [this, index, generation](const absl::Status& why) { OnWorkerExit(index, generation, why); });
  if (!process.ok()) return fail(process.status());
  ProcessEnclaveClient* raw = process->get();
  {
    absl::MutexLock lock(&worker.mu);
    worker.incarnations.push_back(*std::move(process));
  }
  absl::StatusOr<boundary::v1::GetEvidenceResult> evidence =
      WaitForEvidence(*raw, options_.ready_timeout);
  if (!evidence.ok()) {
    raw->Stop();
    return fail(evidence.status());
  }
  int reloaded = 0;
  if (options_.blobs != nullptr) {
    if (absl::Status status =
            ReloadStoredModels(*options_.blobs, *raw, options_.reload_timeout, &reloaded);
        !status.ok()) {
      raw->Stop();
      return fail(status);
    }
  }
  int published = 0;
  if (absl::Status status =
          PublishModels(options_.published, *raw, options_.reload_timeout, &published);
      !status.ok()) {
    raw->Stop();
    return fail(status);
  }
  // Fresh evidence first, so that e.g. receipts of the new incarnation find its key.
  if (options_.on_ready) options_.on_ready(index, static_cast<int>(generation), *evidence);
  // Models uploaded during the restart are handed over first; once none is left (checked under
  // the lock that OnWorkerExit and Call take) the worker serves.
  bool died = false;
  std::vector<std::pair<HostToEnclave, EnclaveClient::Done>> evidence_calls;
  while (true) {
    std::vector<std::pair<HostToEnclave, EnclaveClient::Done>> held;
    {
      absl::MutexLock lock(&worker.mu);
      died = worker.died_while_starting || !raw->connected();
      if (died || worker.held_reloads.empty()) {
        worker.starting = false;
        if (!died) {
          worker.current = raw;
          worker.ready = true;
          worker.up_since = absl::Now();
          if (generation > 0) ++worker.restarts;
          evidence_calls.swap(worker.held_evidence);
        }
        break;
      }
      held.swap(worker.held_reloads);
    }
    for (auto& [call, done] : held) {
      absl::StatusOr<EnclaveToHost> reply =
          CallAndWait(*raw, std::move(call), options_.reload_timeout);
      if (reply.ok()) ++reloaded;
      done(std::move(reply));
    }
  }
  if (died) {
    raw->Stop();
    return absl::UnavailableError(
        absl::StrCat("enclave worker ", index, " exited while it was starting"));
  }
  for (auto& [call, done] : evidence_calls) worker.Call(std::move(call), std::move(done));
  Log(LogLevel::kInfo, "enclave_worker_ready",
      {{"worker", index},
       {"generation", static_cast<long long>(generation)},
       {"pid", static_cast<long long>(raw->pid())},
       {"models_reloaded", reloaded},
       {"models_published", published}});
  return absl::OkStatus();
}

void WorkerSupervisor::OnWorkerExit(int index, uint64_t generation, const absl::Status& why) {
  Worker& worker = *workers_[index];
  {
    absl::MutexLock lock(&worker.mu);
    if (generation != worker.generation) return;
    if (worker.starting) {
      // StartIncarnation sees the failure itself and reports it.
      worker.died_while_starting = true;
      return;
    }
    worker.ready = false;
    worker.current = nullptr;
    worker.RetireSessionsLocked();
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    Log(LogLevel::kInfo, "enclave_worker_exited",
        {{"worker", index}, {"reason", why.ToString()}, {"action", "none, shutting down"}});
    return;
  }
  Log(LogLevel::kError, "enclave_worker_died",
      {{"worker", index},
       {"generation", static_cast<long long>(generation)},
       {"reason", why.ToString()},
       {"action", "restarting"}});
  dead_.push_back(index);
}

void WorkerSupervisor::StopRestarting() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void WorkerSupervisor::SuperviseLoop() {
  while (true) {
    int index;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !dead_.empty(); };
      mu_.Await(absl::Condition(&wake));
      if (stopping_) return;
      index = dead_.front();
      dead_.pop_front();
    }
    Worker& worker = *workers_[index];
    ProcessEnclaveClient* dead = nullptr;
    absl::Duration backoff = options_.initial_backoff;
    {
      absl::MutexLock lock(&worker.mu);
      if (!worker.incarnations.empty()) dead = worker.incarnations.back().get();
      // A worker that died soon after its last start waits longer before the next one.
      if (absl::Now() - worker.up_since < options_.stable_after && worker.restarts > 0) {
        backoff = std::min(options_.max_backoff, options_.initial_backoff * 2);
      }
    }
    if (dead != nullptr) dead->Stop();  // reaps the process and joins its threads
    int failures = 0;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff)) return;
      }
      absl::Status started = StartIncarnation(index);
      if (started.ok()) break;
      ++failures;
      Log(LogLevel::kError, "enclave_worker_restart_failed",
          {{"worker", index}, {"attempt", failures}, {"error", started.ToString()}});
      if (failures >= options_.max_consecutive_failures) {
        absl::Status why = absl::UnavailableError(
            absl::StrCat("enclave worker ", index, " failed to restart ", failures,
                         " times in a row; last: ", started.ToString()));
        Log(LogLevel::kError, "enclave_worker_given_up",
            {{"worker", index}, {"error", why.ToString()}});
        {
          absl::MutexLock lock(&mu_);
          gave_up_ = true;
        }
        FailHeldReloads(worker, why, /*give_up=*/true);
        if (options_.on_gave_up) options_.on_gave_up(index, why);
        break;
      }
      backoff = std::min(options_.max_backoff, backoff * 2);
    }
  }
}

void WorkerSupervisor::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // The workers first, gracefully (SIGTERM): restarted ones are children of the restart thread
  // and get PR_SET_PDEATHSIG's SIGKILL when it ends. A restart under way fails fast once its
  // process is stopped; one that spawns after this sweep is caught by the second.
  StopAllIncarnations();
  if (thread_.joinable()) thread_.join();
  StopAllIncarnations();
  for (auto& worker : workers_) {
    FailHeldReloads(*worker, absl::UnavailableError("cloisterd is shutting down"),
                    /*give_up=*/true);
  }
}

void WorkerSupervisor::StopAllIncarnations() {
  for (auto& worker : workers_) {
    std::vector<ProcessEnclaveClient*> processes;
    {
      absl::MutexLock lock(&worker->mu);
      worker->ready = false;
      worker->current = nullptr;
      for (auto& process : worker->incarnations) processes.push_back(process.get());
    }
    for (ProcessEnclaveClient* process : processes) process->Stop();
  }
}

void WorkerSupervisor::FailHeldReloads(Worker& worker, const absl::Status& why, bool give_up) {
  std::vector<std::pair<HostToEnclave, EnclaveClient::Done>> held;
  {
    absl::MutexLock lock(&worker.mu);
    if (give_up) worker.given_up = true;
    held.swap(worker.held_reloads);
    for (auto& call : worker.held_evidence) held.push_back(std::move(call));
    worker.held_evidence.clear();
  }
  for (auto& [call, done] : held) done(why);
}

}  // namespace cloister::host

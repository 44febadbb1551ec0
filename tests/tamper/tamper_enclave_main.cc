// cloister-tamper-enclave: a hostile boundary between cloisterd and the real cloister-enclave,
// for the tamper tests (tests/tamper/tamper_*_test.cc). cloisterd is configured to use this
// program as its enclave binary (`enclave_binary:`); it is exec'd exactly like the worker
// (`--fd 3 --data-dir ...`), starts the real worker with its own socketpair on that worker's
// fd 3 and the same arguments, and relays boundary frames (proto/frame.h) both ways. Each frame
// is decoded (HostToEnclave one way, EnclaveToHost the other) and changed as the current tamper
// plan says, the way a compromised host could change it.
//
// Environment:
//   CLOISTER_TAMPER_REAL_ENCLAVE  path of the real cloister-enclave (required)
//   CLOISTER_TAMPER_PLAN          path of the plan file (optional: without it, frames pass
//                                 unchanged). Re-read before every frame, so a test switches
//                                 plans by rewriting it (write a temporary file and rename).
//
// Plan file: one line "ID MUTATION [KIND [ARG]]". ID is any word that names the plan; each plan
// applies its mutation once (to the first frame that qualifies) and then relays unchanged until
// the ID changes. "off" (or no file, or an empty one) relays everything. KIND is the call the
// mutation targets: infer, list, delete, load or open (default infer). Mutations:
//   flip-request      flip one bit of the sealed request (open: of the sealed hello; load: of
//                     the sealed load request)
//   flip-model        load: flip one bit of the model ciphertext the host relays
//   flip-reply        flip one bit of the sealed reply (open: of the sealed welcome)
//   truncate-request  cut the sealed request to half its size
//   truncate-reply    cut the sealed reply to half its size
//   swap-reply-rows   an inference batch result with two or more rows: swap the sealed replies
//                     (sequence and ciphertext, request ids kept) of rows 0 and 1
//   swap-replies      two inference results in a row: swap the sealed replies of their first
//                     rows (the first result is held until the second arrives)
//   replay-request    remember the first inference request, then put it in place of the first
//                     row of the next inference batch (and give that row's reply the displaced
//                     request's id again, as cloisterd expects)
//   splice-session    remember the session of the first inference request, then move the first
//                     row of the next batch that comes from another session of the same tenant
//                     under the remembered session
//   splice-tenant     remember the tenant of the first inference batch, then relabel the next
//                     batch of another tenant as the remembered tenant's
//   swap-tenant-rows  hold an inference batch, then swap its first row with the first row of
//                     the next batch of another tenant (the rows' model handles are rewritten
//                     to their new batch's, so the batch model check alone does not catch it)
//   empty-request     infer: send the first row with an empty ciphertext
//   reorder-rows      an inference batch with two or more rows: swap rows 0 and 1 on the way
//                     in and their replies back on the way out (order restored for cloisterd)
//   reorder-rows-unrestored  the same without restoring the replies' order
//   swap-model        remember the model handle of the first inference batch, then point the
//                     next batch of another tenant (batch and rows) at that model
//   relabel-tenant    list, delete or load: present the call as tenant ARG's (fourth word)
//   swap-reload       remember the first ReloadModel call (after a worker restart), then give
//                     the next one, for another model handle, the remembered wrapped key and
//                     model ciphertext: the host swapping two stored models
// A held frame is released unchanged when nothing to pair it with comes within 5 seconds.
//
// At start the proxy appends the real worker's process id to PLAN.workers (one line each), so
// a test can kill the worker to make cloisterd restart it. Each applied mutation appends "ID
// MUTATION applied" to PLAN.log (and "ID MUTATION released" when a held frame timed out), so a test
// can tell that the mutation really happened.
//
// Threading: one relay thread per direction; the plan state is guarded by one mutex. The
// process owns the real worker, forwards SIGTERM to it and exits with its exit status.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cloister/boundary/v1/boundary.pb.h"
#include "proto/frame.h"

namespace {

using cloister::boundary::v1::EnclaveToHost;
using cloister::boundary::v1::HostToEnclave;
using cloister::boundary::v1::ForwardedRequest;
using cloister::boundary::v1::EnclaveReply;

constexpr int kHoldTimeoutMs = 5000;

struct Plan {
  std::string id;
  std::string mutation = "off";
  std::string kind = "infer";
  std::string argument;
};

// Plan state shared by both relay threads.
class Tamperer {
 public:
  explicit Tamperer(std::string plan_path) : plan_path_(std::move(plan_path)) {}

  // Mutates (or holds) one host-to-enclave frame; returns the frames to send now.
  std::vector<std::string> FromHost(const std::string& frame);
  // Mutates (or holds) one enclave-to-host frame; returns the frames to send now.
  std::vector<std::string> FromEnclave(const std::string& frame);
  // A frame held longer than the timeout in `direction` (0 host->enclave, 1 enclave->host),
  // released unchanged; empty when none is due.
  std::optional<std::string> ReleaseStale(int direction);
  bool Holding(int direction) {
    std::lock_guard<std::mutex> lock(mu_);
    return held_[direction].has_value();
  }

 private:
  // Reads the plan file again; a different plan resets what the last one remembered.
  void RefreshLocked();
  void RecordLocked(const std::string& what);

  const std::string plan_path_;
  std::mutex mu_;
  Plan plan_;
  bool done_ = false;
  std::optional<ForwardedRequest> remembered_item_;
  std::string remembered_tenant_;
  // replay-request: the call whose first reply gets `relabel_request_id_` (0: none).
  uint64_t relabel_call_id_ = 0;
  std::string relabel_request_id_;
  // reorder-rows: the call whose first two replies go back to the original order (0: none).
  uint64_t restore_call_id_ = 0;
  std::string remembered_model_;
  std::optional<cloister::boundary::v1::ReloadModelCall> remembered_reload_;
  std::optional<std::string> held_[2];
  std::chrono::steady_clock::time_point held_since_[2];
};

void FlipBit(std::string& bytes) {
  if (bytes.empty()) return;
  bytes[bytes.size() / 2] ^= 0x10;
}

void Truncate(std::string& bytes) { bytes.resize(bytes.size() / 2); }

bool HasSealed(const EnclaveReply& reply) {
  return (!reply.has_status() || reply.status().code() == 0) && !reply.ciphertext().empty();
}

void Tamperer::RefreshLocked() {
  if (plan_path_.empty()) return;
  std::ifstream in(plan_path_);
  Plan next;
  std::string line;
  if (in && std::getline(in, line)) {
    std::istringstream words(line);
    words >> next.id >> next.mutation;
    std::string kind;
    if (words >> kind) next.kind = kind;
    words >> next.argument;
    if (next.mutation.empty()) next.mutation = "off";
  }
  if (next.id != plan_.id || next.mutation != plan_.mutation || next.kind != plan_.kind ||
      next.argument != plan_.argument) {
    plan_ = next;
    done_ = false;
    remembered_item_.reset();
    remembered_tenant_.clear();
    remembered_reload_.reset();
  }
}

void Tamperer::RecordLocked(const std::string& what) {
  done_ = true;
  std::ofstream log(plan_path_ + ".log", std::ios::app);
  log << plan_.id << " " << plan_.mutation << " " << what << "\n";
}

std::vector<std::string> Tamperer::FromHost(const std::string& frame) {
  std::lock_guard<std::mutex> lock(mu_);
  RefreshLocked();
  HostToEnclave call;
  if (done_ || plan_.mutation == "off" || !call.ParseFromString(frame)) return {frame};

  auto sealed_request = [&]() -> std::string* {
    const std::string& kind = plan_.kind;
    if (kind == "infer" && call.has_infer_batch() && call.infer_batch().items_size() > 0) {
      return call.mutable_infer_batch()->mutable_items(0)->mutable_ciphertext();
    }
    if (kind == "list" && call.has_list_models()) {
      return call.mutable_list_models()->mutable_request()->mutable_ciphertext();
    }
    if (kind == "delete" && call.has_delete_model()) {
      return call.mutable_delete_model()->mutable_request()->mutable_ciphertext();
    }
    if (kind == "load" && call.has_load_model()) {
      return call.mutable_load_model()->mutable_request()->mutable_ciphertext();
    }
    if (kind == "open" && call.has_open_session()) {
      return call.mutable_open_session()->mutable_sealed_hello();
    }
    return nullptr;
  };

  if (plan_.mutation == "flip-request" || plan_.mutation == "truncate-request") {
    std::string* sealed = sealed_request();
    if (sealed == nullptr) return {frame};
    plan_.mutation == "flip-request" ? FlipBit(*sealed) : Truncate(*sealed);
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "relabel-tenant") {
    std::string* tenant = nullptr;
    if (plan_.kind == "list" && call.has_list_models()) {
      tenant = call.mutable_list_models()->mutable_tenant_id();
    } else if (plan_.kind == "delete" && call.has_delete_model()) {
      tenant = call.mutable_delete_model()->mutable_tenant_id();
    } else if (plan_.kind == "load" && call.has_load_model()) {
      tenant = call.mutable_load_model()->mutable_tenant_id();
    }
    if (tenant == nullptr) return {frame};
    *tenant = plan_.argument;
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "swap-reload" && call.has_reload_model()) {
    auto& reload = *call.mutable_reload_model();
    if (!remembered_reload_) {
      remembered_reload_ = reload;
      return {frame};
    }
    if (reload.model_handle() == remembered_reload_->model_handle()) return {frame};
    reload.set_wrapped_model_key(remembered_reload_->wrapped_model_key());
    reload.set_model_ciphertext(remembered_reload_->model_ciphertext());
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "flip-model" && call.has_load_model()) {
    FlipBit(*call.mutable_load_model()->mutable_model_ciphertext());
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (!call.has_infer_batch() || call.infer_batch().items_size() == 0) return {frame};
  auto& batch = *call.mutable_infer_batch();

  if (plan_.mutation == "empty-request") {
    batch.mutable_items(0)->clear_ciphertext();
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "reorder-rows" || plan_.mutation == "reorder-rows-unrestored") {
    if (batch.items_size() < 2) return {frame};
    batch.mutable_items()->SwapElements(0, 1);
    if (plan_.mutation == "reorder-rows") restore_call_id_ = call.call_id();
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "swap-model") {
    if (remembered_tenant_.empty()) {
      remembered_tenant_ = batch.tenant_id();
      remembered_model_ = batch.model_handle();
      return {frame};
    }
    if (batch.tenant_id() == remembered_tenant_) return {frame};
    batch.set_model_handle(remembered_model_);
    for (ForwardedRequest& item : *batch.mutable_items()) item.set_model_handle(remembered_model_);
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "replay-request") {
    if (!remembered_item_) {
      remembered_item_ = batch.items(0);
      return {frame};
    }
    // The reply is relabelled with the displaced request's id (FromEnclave), so cloisterd,
    // which checks reply ids against its batch, relays whatever the enclave answers.
    relabel_call_id_ = call.call_id();
    relabel_request_id_ = batch.items(0).request_id();
    *batch.mutable_items(0) = *remembered_item_;
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "splice-session") {
    if (!remembered_item_) {
      remembered_item_ = batch.items(0);
      remembered_tenant_ = batch.tenant_id();
      return {frame};
    }
    if (batch.tenant_id() != remembered_tenant_ ||
        batch.items(0).session_id() == remembered_item_->session_id()) {
      return {frame};
    }
    batch.mutable_items(0)->set_session_id(remembered_item_->session_id());
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "splice-tenant") {
    if (remembered_tenant_.empty()) {
      remembered_tenant_ = batch.tenant_id();
      return {frame};
    }
    if (batch.tenant_id() == remembered_tenant_) return {frame};
    batch.set_tenant_id(remembered_tenant_);
    RecordLocked("applied");
    return {call.SerializeAsString()};
  }
  if (plan_.mutation == "swap-tenant-rows") {
    if (!held_[0]) {
      held_[0] = call.SerializeAsString();
      held_since_[0] = std::chrono::steady_clock::now();
      return {};
    }
    HostToEnclave first;
    first.ParseFromString(*held_[0]);
    auto& first_batch = *first.mutable_infer_batch();
    if (first_batch.tenant_id() == batch.tenant_id()) return {frame};
    ForwardedRequest row = first_batch.items(0);
    *first_batch.mutable_items(0) = batch.items(0);
    *batch.mutable_items(0) = row;
    first_batch.mutable_items(0)->set_model_handle(first_batch.model_handle());
    batch.mutable_items(0)->set_model_handle(batch.model_handle());
    held_[0].reset();
    RecordLocked("applied");
    return {first.SerializeAsString(), call.SerializeAsString()};
  }
  return {frame};
}

std::vector<std::string> Tamperer::FromEnclave(const std::string& frame) {
  std::lock_guard<std::mutex> lock(mu_);
  RefreshLocked();
  EnclaveToHost reply;
  if (!reply.ParseFromString(frame)) return {frame};
  if (relabel_call_id_ != 0 && reply.call_id() == relabel_call_id_) {
    relabel_call_id_ = 0;
    if (reply.has_infer_batch() && reply.infer_batch().replies_size() > 0) {
      reply.mutable_infer_batch()->mutable_replies(0)->set_request_id(relabel_request_id_);
      return {reply.SerializeAsString()};
    }
  }
  if (restore_call_id_ != 0 && reply.call_id() == restore_call_id_) {
    restore_call_id_ = 0;
    if (reply.has_infer_batch() && reply.infer_batch().replies_size() >= 2) {
      reply.mutable_infer_batch()->mutable_replies()->SwapElements(0, 1);
      return {reply.SerializeAsString()};
    }
  }
  if (done_ || plan_.mutation == "off") return {frame};

  if (plan_.mutation == "flip-reply" || plan_.mutation == "truncate-reply") {
    std::string* sealed = nullptr;
    const std::string& kind = plan_.kind;
    if (kind == "infer" && reply.has_infer_batch() && reply.infer_batch().replies_size() > 0 &&
        HasSealed(reply.infer_batch().replies(0))) {
      sealed = reply.mutable_infer_batch()->mutable_replies(0)->mutable_ciphertext();
    } else if (kind == "list" && reply.has_list_models() &&
               HasSealed(reply.list_models().reply())) {
      sealed = reply.mutable_list_models()->mutable_reply()->mutable_ciphertext();
    } else if (kind == "delete" && reply.has_delete_model() &&
               HasSealed(reply.delete_model().reply())) {
      sealed = reply.mutable_delete_model()->mutable_reply()->mutable_ciphertext();
    } else if (kind == "load" && reply.has_load_model() && HasSealed(reply.load_model().reply())) {
      sealed = reply.mutable_load_model()->mutable_reply()->mutable_ciphertext();
    } else if (kind == "open" && reply.has_open_session()) {
      sealed = reply.mutable_open_session()->mutable_sealed_welcome();
    }
    if (sealed == nullptr) return {frame};
    plan_.mutation == "flip-reply" ? FlipBit(*sealed) : Truncate(*sealed);
    RecordLocked("applied");
    return {reply.SerializeAsString()};
  }
  if (!reply.has_infer_batch() || reply.infer_batch().replies_size() == 0 ||
      !HasSealed(reply.infer_batch().replies(0))) {
    return {frame};
  }
  auto swap_sealed = [](EnclaveReply& a, EnclaveReply& b) {
    uint64_t sequence = a.sequence();
    a.set_sequence(b.sequence());
    b.set_sequence(sequence);
    a.mutable_ciphertext()->swap(*b.mutable_ciphertext());
  };
  auto& batch = *reply.mutable_infer_batch();
  if (plan_.mutation == "swap-reply-rows") {
    if (batch.replies_size() < 2 || !HasSealed(batch.replies(1))) return {frame};
    swap_sealed(*batch.mutable_replies(0), *batch.mutable_replies(1));
    RecordLocked("applied");
    return {reply.SerializeAsString()};
  }
  if (plan_.mutation == "swap-replies") {
    if (!held_[1]) {
      held_[1] = frame;
      held_since_[1] = std::chrono::steady_clock::now();
      return {};
    }
    EnclaveToHost first;
    first.ParseFromString(*held_[1]);
    swap_sealed(*first.mutable_infer_batch()->mutable_replies(0), *batch.mutable_replies(0));
    held_[1].reset();
    RecordLocked("applied");
    return {first.SerializeAsString(), reply.SerializeAsString()};
  }
  return {frame};
}

std::optional<std::string> Tamperer::ReleaseStale(int direction) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_[direction]) return std::nullopt;
  if (std::chrono::steady_clock::now() - held_since_[direction] <
      std::chrono::milliseconds(kHoldTimeoutMs)) {
    return std::nullopt;
  }
  std::optional<std::string> frame = std::move(held_[direction]);
  held_[direction].reset();
  std::ofstream log(plan_path_ + ".log", std::ios::app);
  log << plan_.id << " " << plan_.mutation << " released\n";
  return frame;
}

// Relays frames from `in` to `out` until either side closes, then shuts both down.
void Relay(int in, int out, int direction, Tamperer& tamperer) {
  while (true) {
    if (tamperer.Holding(direction)) {
      pollfd ready{in, POLLIN, 0};
      int polled = ::poll(&ready, 1, 100);
      if (auto stale = tamperer.ReleaseStale(direction)) {
        if (!cloister::boundary::WriteFrame(out, *stale).ok()) break;
      }
      if (polled <= 0) continue;
    }
    auto frame = cloister::boundary::ReadFrame(in);
    if (!frame.ok()) break;
    std::vector<std::string> frames =
        direction == 0 ? tamperer.FromHost(*frame) : tamperer.FromEnclave(*frame);
    bool written = true;
    for (const std::string& f : frames) {
      written = written && cloister::boundary::WriteFrame(out, f).ok();
    }
    if (!written) break;
  }
  ::shutdown(in, SHUT_RDWR);
  ::shutdown(out, SHUT_RDWR);
}

pid_t g_worker = -1;

void ForwardSignal(int signal) {
  if (g_worker > 0) ::kill(g_worker, signal);
}

}  // namespace

int main(int argc, char** argv) {
  const char* real = std::getenv("CLOISTER_TAMPER_REAL_ENCLAVE");
  if (real == nullptr || *real == '\0') {
    std::fprintf(stderr, "cloister-tamper-enclave: CLOISTER_TAMPER_REAL_ENCLAVE is not set\n");
    return 2;
  }
  const char* plan = std::getenv("CLOISTER_TAMPER_PLAN");
  // cloisterd hands us its end of the boundary on fd 3 (`--fd 3`, passed through unchanged).
  const int host_fd = 3;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    std::perror("cloister-tamper-enclave: socketpair");
    return 1;
  }
  const pid_t parent = ::getpid();
  pid_t child = ::fork();
  if (child < 0) {
    std::perror("cloister-tamper-enclave: fork");
    return 1;
  }
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    if (::dup2(pair[1], 3) != 3) ::_exit(1);  // dup2 clears close-on-exec on the copy
    ::close_range(4, ~0U, 0);
    std::vector<char*> args;
    args.push_back(const_cast<char*>(real));
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    ::execv(real, args.data());
    ::_exit(127);
  }
  ::close(pair[1]);
  g_worker = child;
  if (plan != nullptr && *plan != '\0') {
    std::ofstream(std::string(plan) + ".workers", std::ios::app) << child << "\n";
  }
  struct sigaction action = {};
  action.sa_handler = ForwardSignal;
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  Tamperer tamperer(plan == nullptr ? "" : plan);
  std::thread to_enclave(Relay, host_fd, pair[0], 0, std::ref(tamperer));
  std::thread to_host(Relay, pair[0], host_fd, 1, std::ref(tamperer));
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  ::shutdown(host_fd, SHUT_RDWR);
  ::shutdown(pair[0], SHUT_RDWR);
  to_enclave.join();
  to_host.join();
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// FakeEnclave: a test double for the enclave worker's boundary behaviour, for host tests only
// (the real enclave and its tests live in enclave/). It answers each HostToEnclave the way the
// protocol says the enclave does, but "sealing" is plain text that tests can read:
//   GetEvidence   -> challenge_response "evidence:" + nonce
//   OpenSession   -> needs sealed_hello == "hello:" + tenant (else PERMISSION_DENIED);
//                    session_id "session-%08d", sealed_welcome "welcome"
//   LoadModel     -> model ciphertext starting "bad" is refused (sealed "error:...", no wrapped
//                    key), one starting "budget" likewise with the reply "budget:" + the call's
//                    model_memory_budget; otherwise wrapped key
//                    "wrapped:HANDLE:SHA256HEX(ciphertext)", reply "loaded:HANDLE"
//   ReloadModel   -> DATA_LOSS unless the wrapped key matches the ciphertext as above
//   ListModels    -> "models:" + comma-separated handles loaded by the tenant
//   DeleteModel   -> drops request.model_handle if the tenant loaded it (model_deleted)
//   InferBatch    -> per item "out:" + ciphertext + ";batch=N"; an item "sleep:MS" waits MS
//                    milliseconds first; an item "crash" makes Handle() return nullopt (the
//                    worker program exits at once)
//   Generate      -> (Respond only) the session is checked like an item's, but a problem is the
//                    frame's boundary status (the request did not open). The ciphertext is a
//                    comma-separated list of parts: each part TEXT is one GenerateResult (same
//                    request id, the session's next sequence, chunk 0, 1, 2...) with ciphertext
//                    "chunk:" + TEXT, the last one final and carrying a SignedUsageReceipt
//                    (an unsigned UsageReceipt of the tenant and model, signature "fake"); a
//                    part "hold" keeps the stream open (nothing more is sent) until a
//                    CancelCall names it; a part "crash" makes the worker exit there, after the
//                    chunks before it
//   Cancel        -> CancelResult{found}; a held stream then ends with a final chunk
//                    "chunk:cancelled" (no receipt)
// Item-level problems (unknown session, another tenant's session, model not loaded) come back as
// the item's host-visible status, as in the real protocol.
// Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cloister/boundary/v1/boundary.pb.h"

namespace cloister::host::testing {

class FakeEnclave {
 public:
  FakeEnclave() = default;
  // A worker among several: session ids are "NAME-session-%08d", evidence is "NAME:evidence:"
  // + nonce, and OpenSession refuses with FAILED_PRECONDITION any evidence digest other than
  // `evidence_digest`, as a real worker refuses evidence it did not issue.
  FakeEnclave(std::string name, std::string evidence_digest)
      : name_(std::move(name)), evidence_digest_(std::move(evidence_digest)) {}

  // What the worker sends for one call: the frames to write in order (each with the call id it
  // answers: a CancelCall also ends the stream it names), then whether to exit.
  struct Response {
    std::vector<boundary::v1::EnclaveToHost> frames;
    bool crash = false;
  };
  Response Respond(const boundary::v1::HostToEnclave& call);

  // The reply for a call answered by one frame (same call id), or nullopt when the call asks
  // the worker to crash.
  std::optional<boundary::v1::EnclaveToHost> Handle(const boundary::v1::HostToEnclave& call);

  static std::string WrappedKeyFor(const std::string& handle, const std::string& ciphertext);

 private:
  // Checks an item's session against the tenant; fills `reply` with the failure if any.
  bool CheckSession(const std::string& tenant_id, const boundary::v1::ForwardedRequest& item,
                    boundary::v1::EnclaveReply& reply);
  void Seal(const boundary::v1::ForwardedRequest& item, std::string plaintext,
            boundary::v1::EnclaveReply& reply);
  // A GenerateCall's frames (see above).
  Response Generate(const boundary::v1::HostToEnclave& call);
  // The chunk `chunk` of the stream of `call_id` for `request`, with ciphertext `text`.
  boundary::v1::EnclaveToHost Chunk(uint64_t call_id, const boundary::v1::ForwardedRequest& request,
                                    uint64_t chunk, bool final, std::string text);

  struct HeldStream {
    boundary::v1::ForwardedRequest request;
    uint64_t next_chunk = 0;
  };
  std::map<uint64_t, HeldStream> held_streams_;  // call id -> a stream left open

  std::map<std::string, std::string> session_tenants_;  // session id -> tenant
  std::map<std::string, uint64_t> session_sequences_;   // next e2c sequence per session
  std::map<std::string, std::string> model_tenants_;    // handle -> tenant that loaded it
  std::map<std::string, uint64_t> model_sizes_;         // handle -> its ciphertext's size
  int session_count_ = 0;
  std::string name_;             // empty: the single-worker formats
  std::string evidence_digest_;  // empty: any digest is accepted
};

}  // namespace cloister::host::testing

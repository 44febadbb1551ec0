#include "host/testing/fake_enclave.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/bytes.h"
#include "crypto/hash.h"

namespace cloister::host::testing {

using boundary::v1::EnclaveToHost;
using boundary::v1::HostToEnclave;
using boundary::v1::ForwardedRequest;
using boundary::v1::EnclaveReply;

namespace {

void SetStatus(boundary::v1::Status* status, int code, std::string message) {
  status->set_code(code);
  status->set_message(std::move(message));
}

}  // namespace

std::string FakeEnclave::WrappedKeyFor(const std::string& handle, const std::string& ciphertext) {
  return absl::StrCat("wrapped:", handle, ":", HexEncode(crypto::Sha256(AsBytes(ciphertext))));
}

bool FakeEnclave::CheckSession(const std::string& tenant_id, const ForwardedRequest& item,
                               EnclaveReply& reply) {
  reply.set_request_id(item.request_id());
  auto it = session_tenants_.find(item.session_id());
  if (it == session_tenants_.end()) {
    SetStatus(reply.mutable_status(), 5, "unknown session");
    return false;
  }
  if (it->second != tenant_id) {
    SetStatus(reply.mutable_status(), 7, "session belongs to another tenant");
    return false;
  }
  return true;
}

void FakeEnclave::Seal(const ForwardedRequest& item, std::string plaintext, EnclaveReply& reply) {
  reply.set_request_id(item.request_id());
  reply.set_sequence(session_sequences_[item.session_id()]++);
  reply.set_ciphertext(std::move(plaintext));
}

FakeEnclave::Response FakeEnclave::Respond(const HostToEnclave& call) {
  if (call.has_generate()) return Generate(call);
  Response response;
  if (call.has_cancel()) {
    EnclaveToHost& reply = response.frames.emplace_back();
    reply.set_call_id(call.call_id());
    auto held = held_streams_.find(call.cancel().target_call_id());
    reply.mutable_cancel()->set_found(held != held_streams_.end());
    if (held != held_streams_.end()) {
      response.frames.push_back(Chunk(held->first, held->second.request, held->second.next_chunk,
                                      /*final=*/true, "chunk:cancelled"));
      held_streams_.erase(held);
    }
    return response;
  }
  std::optional<EnclaveToHost> reply = Handle(call);
  if (reply.has_value()) {
    response.frames.push_back(*std::move(reply));
  } else {
    response.crash = true;
  }
  return response;
}

EnclaveToHost FakeEnclave::Chunk(uint64_t call_id, const ForwardedRequest& request, uint64_t chunk,
                                 bool final, std::string text) {
  EnclaveToHost frame;
  frame.set_call_id(call_id);
  boundary::v1::GenerateResult* result = frame.mutable_generate();
  result->set_request_id(request.request_id());
  result->set_sequence(session_sequences_[request.session_id()]++);
  result->set_chunk(chunk);
  result->set_final(final);
  result->set_ciphertext(std::move(text));
  return frame;
}

FakeEnclave::Response FakeEnclave::Generate(const HostToEnclave& call) {
  const boundary::v1::GenerateCall& generate = call.generate();
  const ForwardedRequest& request = generate.request();
  Response response;
  EnclaveReply checked;
  if (!CheckSession(generate.tenant_id(), request, checked)) {
    EnclaveToHost& refusal = response.frames.emplace_back();
    refusal.set_call_id(call.call_id());
    *refusal.mutable_status() = checked.status();
    return response;
  }
  std::vector<std::string> parts = absl::StrSplit(request.ciphertext(), ',');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "crash") {
      response.crash = true;
      return response;
    }
    if (parts[i] == "hold") {
      held_streams_[call.call_id()] = HeldStream{request, i};
      return response;
    }
    const bool final = i + 1 == parts.size();
    EnclaveToHost frame = Chunk(call.call_id(), request, i, final, "chunk:" + parts[i]);
    if (final) {
      boundary::v1::UsageReceipt receipt;
      receipt.set_tenant_id(generate.tenant_id());
      receipt.set_model_handle(request.model_handle());
      receipt.mutable_batch()->set_sequences(1);
      receipt.mutable_batch()->set_completion_tokens(parts.size());
      auto* signed_receipt = frame.mutable_generate()->mutable_receipt();
      signed_receipt->set_receipt(receipt.SerializeAsString());
      signed_receipt->set_signature("fake");
    }
    response.frames.push_back(std::move(frame));
  }
  return response;
}

std::optional<EnclaveToHost> FakeEnclave::Handle(const HostToEnclave& call) {
  EnclaveToHost reply;
  reply.set_call_id(call.call_id());
  switch (call.call_case()) {
    case HostToEnclave::kGetEvidence:
      reply.mutable_get_evidence()->set_challenge_response(
          absl::StrCat(name_.empty() ? "" : name_ + ":", "evidence:", call.get_evidence().nonce()));
      break;
    case HostToEnclave::kOpenSession: {
      const auto& open = call.open_session();
      if (open.sealed_hello() != absl::StrCat("hello:", open.tenant_id())) {
        SetStatus(reply.mutable_status(), 7, "session hello is for another tenant");
        break;
      }
      if (!evidence_digest_.empty() && open.evidence_digest() != evidence_digest_) {
        SetStatus(reply.mutable_status(), 9, "evidence digest is not this enclave's evidence");
        break;
      }
      std::string session_id = absl::StrCat(name_.empty() ? "" : name_ + "-",
                                            absl::StrFormat("session-%08d", ++session_count_));
      session_tenants_[session_id] = open.tenant_id();
      session_sequences_[session_id] = 1;
      auto* result = reply.mutable_open_session();
      result->set_session_id(session_id);
      result->set_sequence(0);
      result->set_sealed_welcome("welcome");
      break;
    }
    case HostToEnclave::kLoadModel: {
      const auto& load = call.load_model();
      auto* result = reply.mutable_load_model();
      if (!CheckSession(load.tenant_id(), load.request(), *result->mutable_reply())) break;
      const std::string& handle = load.request().model_handle();
      if (absl::StartsWith(load.model_ciphertext(), "bad")) {
        Seal(load.request(), "error:cannot parse model", *result->mutable_reply());
        break;
      }
      if (absl::StartsWith(load.model_ciphertext(), "budget")) {
        Seal(load.request(), absl::StrCat("budget:", load.model_memory_budget()),
             *result->mutable_reply());
        break;
      }
      model_tenants_[handle] = load.tenant_id();
      model_sizes_[handle] = load.model_ciphertext().size();
      result->set_wrapped_model_key(WrappedKeyFor(handle, load.model_ciphertext()));
      Seal(load.request(), absl::StrCat("loaded:", handle), *result->mutable_reply());
      break;
    }
    case HostToEnclave::kReloadModel: {
      const auto& reload = call.reload_model();
      if (reload.wrapped_model_key() !=
          WrappedKeyFor(reload.model_handle(), reload.model_ciphertext())) {
        SetStatus(reply.mutable_status(), 15, "wrapped model key does not open");
        break;
      }
      // The real enclave learns the owner from the wrapped key; the fake keeps the tenant
      // encoded nowhere, so reloaded models belong to whoever asks first.
      model_tenants_.emplace(reload.model_handle(), "");
      model_sizes_[reload.model_handle()] = reload.model_ciphertext().size();
      reply.mutable_reload_model();
      break;
    }
    case HostToEnclave::kListModels: {
      const auto& list = call.list_models();
      auto* result = reply.mutable_list_models();
      if (!CheckSession(list.tenant_id(), list.request(), *result->mutable_reply())) break;
      std::vector<std::string> handles;
      for (const auto& [handle, tenant] : model_tenants_) {
        if (tenant == list.tenant_id() || tenant.empty()) handles.push_back(handle);
      }
      Seal(list.request(), absl::StrCat("models:", absl::StrJoin(handles, ",")),
           *result->mutable_reply());
      break;
    }
    case HostToEnclave::kDeleteModel: {
      const auto& del = call.delete_model();
      auto* result = reply.mutable_delete_model();
      if (!CheckSession(del.tenant_id(), del.request(), *result->mutable_reply())) break;
      const std::string& handle = del.request().model_handle();
      auto it = model_tenants_.find(handle);
      if (it == model_tenants_.end() || (!it->second.empty() && it->second != del.tenant_id())) {
        Seal(del.request(), "error:no such model", *result->mutable_reply());
        break;
      }
      model_tenants_.erase(it);
      model_sizes_.erase(handle);
      result->set_model_deleted(true);
      result->set_deleted_handle(handle);
      Seal(del.request(), absl::StrCat("deleted:", handle), *result->mutable_reply());
      break;
    }
    case HostToEnclave::kInferBatch: {
      const auto& batch = call.infer_batch();
      auto* result = reply.mutable_infer_batch();
      for (const ForwardedRequest& item : batch.items()) {
        if (item.ciphertext() == "crash") return std::nullopt;
        int sleep_ms;
        if (absl::StartsWith(item.ciphertext(), "sleep:") &&
            absl::SimpleAtoi(item.ciphertext().substr(6), &sleep_ms)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
        }
      }
      for (const ForwardedRequest& item : batch.items()) {
        EnclaveReply* out = result->add_replies();
        if (!CheckSession(batch.tenant_id(), item, *out)) continue;
        auto model = model_tenants_.find(batch.model_handle());
        if (item.model_handle() != batch.model_handle() || model == model_tenants_.end()) {
          SetStatus(out->mutable_status(), 9, "model is not loaded");
          continue;
        }
        Seal(item, absl::StrCat("out:", item.ciphertext(), ";batch=", batch.items_size()), *out);
      }
      result->set_execution_ns(1000);
      break;
    }
    case HostToEnclave::kGetStats: {
      // No device; each model counts its ciphertext's size.
      auto* stats = reply.mutable_get_stats();
      for (const auto& [handle, size] : model_sizes_) {
        auto* model = stats->add_models();
        model->set_model_handle(handle);
        model->set_size(size);
      }
      break;
    }
    case HostToEnclave::kGenerate:
    case HostToEnclave::kCancel:
      SetStatus(reply.mutable_status(), 3, "answered by Respond, not Handle");
      break;
    case HostToEnclave::kPublishModel:
      // The fake loads nothing; it answers as the enclave does for a model it accepted.
      reply.mutable_publish_model()->set_model_handle(
          absl::StrCat("published-", call.publish_model().name()));
      reply.mutable_publish_model()->set_size(call.publish_model().model().size());
      break;
    case HostToEnclave::CALL_NOT_SET:
      SetStatus(reply.mutable_status(), 3, "empty call");
      break;
  }
  return reply;
}

}  // namespace cloister::host::testing

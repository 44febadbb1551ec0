// Fuzz target for what the enclave decodes *inside* a seal: a tenant in a real session sends
// arbitrary plaintext, properly sealed, as an inference request, a model listing, a delete or a
// model load. The AEAD keeps outsiders from reaching these decoders, so they face only tenants
// - who are still untrusted by each other and by the enclave. Every call must get an answer
// for its call id, and every sealed answer must open in the tenant's session (the enclave
// never answers a session with garbage), never a crash, hang or abort.
//
// Input: byte 0 picks the call (byte 0 % 4: 0 infer, 1 list, 2 delete, 3 load; an inference
// batch holds 1 + (byte 0 / 4) % 3 requests of the same plaintext, so that the enclave's
// coalescing and run groups see what tenants can send), the rest is the plaintext.
// With CLOISTER_FUZZ_WRITE_SEEDS=DIR the target first writes its seed inputs to DIR.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "cloister/api/v1/api.pb.h"
#include "crypto/chunked.h"
#include "crypto/hash.h"
#include "crypto/model_handle.h"
#include "tests/fuzz/fuzz_enclave.h"
#include "tests/support/enclave_tenant.h"

namespace {

using cloister::AsBytes;
using cloister::Bytes;
using cloister::ToString;
using cloister::boundary::v1::EnclaveToHost;
using cloister::boundary::v1::HostToEnclave;
using cloister::crypto::MessageKind;

constexpr char kModel[] = "m";       // loaded at start; inference targets it
constexpr char kFuzzLoad[] = "fz";   // the name a fuzzed load uploads under
const Bytes kLoadKey(32, 0x11);       // the key kFuzzLoad's ciphertext is made with

cloister::fuzzing::FuzzEnclave& TheFuzzEnclave() { return cloister::fuzzing::TheFuzzEnclave(); }

struct State {
  std::unique_ptr<cloister::testing::EnclaveTenant> tenant;
  std::string load_ciphertext;  // the tiny model under kLoadKey for handle Handle(kFuzzLoad)
  uint64_t next_call_id = 1;
};

void LoadTheModel(State& state) {
  HostToEnclave load = state.tenant->LoadCall(kModel, cloister::fuzzing::TinyModel());
  EnclaveToHost reply = TheFuzzEnclave().enclave->Handle(load);
  if (!state.tenant
           ->OpenReply(MessageKind::kLoadModel, load.load_model().request(),
                       reply.load_model().reply())
           .ok()) {
    std::abort();
  }
}

void WriteSeeds(const std::string& dir, const State& state) {
  const std::string model = cloister::fuzzing::TinyModel();
  auto write = [&](const std::string& name, uint8_t call, const std::string& plaintext) {
    std::ofstream(dir + "/" + name, std::ios::binary) << static_cast<char>(call) << plaintext;
  };
  cloister::api::v1::InferRequestPayload infer;
  auto* x = infer.add_inputs();
  x->set_name("x");
  x->set_datatype("FP32");
  x->add_shape(2);
  x->add_shape(4);
  x->set_raw(std::string(32, '\x3f'));
  write("infer_two_rows.bin", 0, infer.SerializeAsString());
  infer.add_outputs("z");
  write("infer_one_output.bin", 0, infer.SerializeAsString());
  x->set_shape(0, 3);
  write("infer_shape_mismatch.bin", 0, infer.SerializeAsString());
  x->set_datatype("INT64");
  write("infer_wrong_type.bin", 0, infer.SerializeAsString());
  write("list.bin", 1, cloister::api::v1::ListModelsRequest().SerializeAsString());
  cloister::api::v1::DeleteModelRequest remove;
  remove.set_name("no-such-model");
  write("delete_missing.bin", 2, remove.SerializeAsString());
  cloister::api::v1::LoadModelRequest load;
  load.set_name(kFuzzLoad);
  load.set_model_key(ToString(kLoadKey));
  load.set_plaintext_sha256(ToString(cloister::crypto::Sha256(AsBytes(model))));
  load.set_plaintext_size(model.size());
  write("load_valid.bin", 3, load.SerializeAsString());
  load.set_plaintext_size(model.size() + 1);
  write("load_wrong_size.bin", 3, load.SerializeAsString());
}

State& TheState() {
  static State* state = [] {
    auto* made = new State();
    auto& fuzz = TheFuzzEnclave();
    made->tenant = std::make_unique<cloister::testing::EnclaveTenant>(fuzz.enclave.get(), "fuzz",
                                                                        fuzz.policy);
    if (!made->tenant->Open().ok()) std::abort();
    LoadTheModel(*made);
    auto ciphertext = cloister::crypto::ChunkedEncrypt(
        kLoadKey,
        cloister::crypto::ModelEncryptionContext(made->tenant->Handle(kFuzzLoad)),
        AsBytes(cloister::fuzzing::TinyModel()));
    if (!ciphertext.ok()) std::abort();
    made->load_ciphertext = ToString(*ciphertext);
    if (const char* dir = std::getenv("CLOISTER_FUZZ_WRITE_SEEDS")) WriteSeeds(dir, *made);
    return made;
  }();
  return *state;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  State& state = TheState();
  cloister::testing::EnclaveTenant& tenant = *state.tenant;
  const cloister::ByteSpan plaintext(data + 1, size - 1);
  HostToEnclave call;
  call.set_call_id(state.next_call_id++);
  MessageKind kind;
  const cloister::boundary::v1::ForwardedRequest* item = nullptr;
  int items = 1;
  switch (data[0] % 4) {
    case 0: {
      kind = MessageKind::kInfer;
      auto* batch = call.mutable_infer_batch();
      batch->set_tenant_id(tenant.tenant());
      batch->set_model_handle(tenant.Handle(kModel));
      items = 1 + (data[0] / 4) % 3;
      for (int i = 0; i < items; ++i) {
        *batch->add_items() = tenant.SealBytes(kind, tenant.Handle(kModel), plaintext);
      }
      item = &batch->items(0);
      break;
    }
    case 1:
    case 2: {
      kind = data[0] % 4 == 1 ? MessageKind::kListModels : MessageKind::kDeleteModel;
      auto* sealed = kind == MessageKind::kListModels ? call.mutable_list_models()
                                                      : call.mutable_delete_model();
      sealed->set_tenant_id(tenant.tenant());
      *sealed->mutable_request() = tenant.SealBytes(kind, "", plaintext);
      item = &sealed->request();
      break;
    }
    default: {
      kind = MessageKind::kLoadModel;
      auto* load = call.mutable_load_model();
      load->set_tenant_id(tenant.tenant());
      *load->mutable_request() = tenant.SealBytes(kind, tenant.Handle(kFuzzLoad), plaintext);
      load->set_model_ciphertext(state.load_ciphertext);
      item = &load->request();
      break;
    }
  }
  const EnclaveToHost reply = TheFuzzEnclave().enclave->Handle(call);
  if (reply.call_id() != call.call_id()) __builtin_trap();  // every call gets its answer
  if (reply.status().code() != 0) return 0;  // refused as a whole (e.g. a failed transfer)

  const cloister::boundary::v1::EnclaveReply* sealed_reply = nullptr;
  switch (kind) {
    case MessageKind::kInfer:
      if (reply.infer_batch().replies_size() != items) __builtin_trap();
      // Every request of the batch gets its own answer in its own seal; the first is checked
      // further below.
      for (int i = 1; i < items; ++i) {
        const auto& other = reply.infer_batch().replies(i);
        if (other.status().code() != 0) continue;
        if (!tenant.OpenReplyEnvelope(kind, call.infer_batch().items(i), other).ok()) {
          __builtin_trap();
        }
      }
      sealed_reply = &reply.infer_batch().replies(0);
      break;
    case MessageKind::kLoadModel:
      sealed_reply = &reply.load_model().reply();
      break;
    case MessageKind::kListModels:
      sealed_reply = &reply.list_models().reply();
      break;
    default:
      sealed_reply = &reply.delete_model().reply();
      break;
  }
  // A sealed answer must open in the session; its status is the enclave's verdict on the
  // plaintext. (An unsealed refusal is the enclave's refusal of the call before opening it.)
  if (sealed_reply->status().code() != 0) return 0;
  const auto envelope = tenant.OpenReplyEnvelope(kind, *item, *sealed_reply);
  if (!envelope.ok()) __builtin_trap();
  const absl::Status answer(static_cast<absl::StatusCode>(envelope->code()), envelope->message());

  // Keep the inference target in place, and the fuzzed load's name free.
  if (kind == MessageKind::kDeleteModel && answer.ok()) LoadTheModel(state);
  if (kind == MessageKind::kLoadModel && answer.ok()) {
    cloister::api::v1::DeleteModelRequest remove;
    remove.set_name(kFuzzLoad);
    HostToEnclave undo;
    auto* del = undo.mutable_delete_model();
    del->set_tenant_id(tenant.tenant());
    *del->mutable_request() = tenant.Seal(MessageKind::kDeleteModel, "", remove);
    TheFuzzEnclave().enclave->Handle(undo);
  }
  return 0;
}

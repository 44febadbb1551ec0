// Fuzz target for the session handshake (enclave/session/session_manager.cc): the hello a
// client seals to the enclave's attested HPKE key. The seal is genuine, so the fuzzer reaches
// what the enclave does with the plaintext: parsing, the tenant check, the identity key, the
// transcript signature, the session table. Every opening must be answered for its call id, and
// a welcome must open with the keys the client derives (no session is ever half-made).
//
// Input: byte 0 picks how the rest becomes the hello:
//   0: the rest is the hello's plaintext as it is;
//   1: the rest is merged (protobuf merge) into a genuine hello, which is then signed again, so
//      inputs get past the signature check with whatever tenant and nonce they name;
//   2: merged into a genuine hello and sent with the genuine (now possibly stale) signature.
// With CLOISTER_FUZZ_WRITE_SEEDS=DIR the target first writes its seed inputs to DIR.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "cloister/api/v1/api.pb.h"
#include "tests/fuzz/fuzz_enclave.h"
#include "tests/support/enclave_tenant.h"

namespace {

using cloister::api::v1::SessionHello;
using cloister::boundary::v1::EnclaveToHost;

void WriteSeeds(const std::string& dir) {
  auto write = [&](const std::string& name, uint8_t mode, const std::string& rest) {
    std::ofstream(dir + "/" + name, std::ios::binary) << static_cast<char>(mode) << rest;
  };
  write("genuine.bin", 1, "");
  write("genuine_stale_signature_kept.bin", 2, "");
  SessionHello other;
  other.set_tenant_id("someone-else");
  write("other_tenant_signed.bin", 1, other.SerializeAsString());
  SessionHello nonce;
  nonce.set_client_nonce(std::string(32, '\x07'));
  write("new_nonce_unsigned.bin", 2, nonce.SerializeAsString());
  SessionHello short_key;
  short_key.set_identity_public_key("short");
  write("short_identity_key.bin", 2, short_key.SerializeAsString());
  write("raw_garbage.bin", 0, std::string("\x0a\xff\xff\xff\x0f", 5));
}

cloister::testing::EnclaveTenant& TheTenant() {
  static cloister::testing::EnclaveTenant* tenant = [] {
    auto& fuzz = cloister::fuzzing::TheFuzzEnclave();
    auto* made = new cloister::testing::EnclaveTenant(fuzz.enclave.get(), "fuzz", fuzz.policy);
    if (!made->attestation().ok()) std::abort();
    if (const char* dir = std::getenv("CLOISTER_FUZZ_WRITE_SEEDS")) WriteSeeds(dir);
    return made;
  }();
  return *tenant;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  cloister::testing::EnclaveTenant& tenant = TheTenant();
  const uint8_t mode = data[0] % 3;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto pending = tenant.StartOpen([&](SessionHello& hello, cloister::ByteSpan enc) {
    if (mode == 0) return rest;
    SessionHello merged = hello;
    if (!merged.MergeFromString(rest)) return hello.SerializeAsString();
    if (mode == 1 && !tenant.SignHello(merged, enc).ok()) __builtin_trap();
    return merged.SerializeAsString();
  });
  if (!pending.ok()) __builtin_trap();  // the tenant side itself must always work
  static uint64_t next_call_id = 1;
  pending->call.set_call_id(next_call_id++);
  const EnclaveToHost reply = cloister::fuzzing::TheFuzzEnclave().enclave->Handle(pending->call);
  if (reply.call_id() != pending->call.call_id()) __builtin_trap();
  // An opened session's welcome opens under the keys this client derives.
  if (reply.status().code() == 0 && !tenant.FinishOpen(*pending, reply).ok()) __builtin_trap();
  return 0;
}

#include "crypto/keys.h"

#include <sodium.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cloister::crypto {
namespace {

void EnsureSodium() {
  static const bool ready = sodium_init() >= 0;
  CLOISTER_CHECK(ready);
}

absl::Status CheckSize(absl::string_view what, ByteSpan value, size_t expected) {
  if (value.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be ", expected, " bytes, got ", value.size()));
  }
  return absl::OkStatus();
}

Bytes X25519PublicFromPrivate(ByteSpan private_key) {
  Bytes public_key(kX25519KeySize);
  // The base point has prime order and the scalar is clamped, so this cannot fail.
  CLOISTER_CHECK(crypto_scalarmult_base(public_key.data(), private_key.data()) == 0);
  return public_key;
}

}  // namespace

X25519KeyPair GenerateX25519() {
  EnsureSodium();
  X25519KeyPair pair;
  pair.private_key = SecretBytes(kX25519KeySize);
  randombytes_buf(pair.private_key.data(), pair.private_key.size());
  pair.public_key = X25519PublicFromPrivate(pair.private_key.span());
  return pair;
}

absl::StatusOr<X25519KeyPair> X25519FromPrivate(ByteSpan private_key) {
  RETURN_IF_ERROR(CheckSize("X25519 private key", private_key, kX25519KeySize));
  EnsureSodium();
  X25519KeyPair pair;
  pair.private_key = SecretBytes(private_key);
  pair.public_key = X25519PublicFromPrivate(private_key);
  return pair;
}

absl::StatusOr<SecretBytes> X25519(ByteSpan private_key, ByteSpan peer_public_key) {
  RETURN_IF_ERROR(CheckSize("X25519 private key", private_key, kX25519KeySize));
  RETURN_IF_ERROR(CheckSize("X25519 peer public key", peer_public_key, kX25519KeySize));
  EnsureSodium();
  SecretBytes shared(kX25519KeySize);
  // libsodium refuses (-1) an all-zero result; check it here as well so the rule does not
  // depend on the library version.
  if (crypto_scalarmult(shared.data(), private_key.data(), peer_public_key.data()) != 0 ||
      sodium_is_zero(shared.data(), shared.size())) {
    return absl::InvalidArgumentError(
        "X25519 shared secret is all zeros: the peer public key is a low-order point");
  }
  return shared;
}

Ed25519KeyPair GenerateEd25519() {
  EnsureSodium();
  SecretBytes seed(kEd25519SeedSize);
  randombytes_buf(seed.data(), seed.size());
  absl::StatusOr<Ed25519KeyPair> pair = Ed25519FromSeed(seed.span());
  CLOISTER_CHECK(pair.ok());
  return std::move(*pair);
}

absl::StatusOr<Ed25519KeyPair> Ed25519FromSeed(ByteSpan seed) {
  RETURN_IF_ERROR(CheckSize("Ed25519 seed", seed, kEd25519SeedSize));
  EnsureSodium();
  Ed25519KeyPair pair;
  pair.seed = SecretBytes(seed);
  pair.public_key.resize(kEd25519PublicKeySize);
  SecretBytes expanded(crypto_sign_SECRETKEYBYTES);
  CLOISTER_CHECK(crypto_sign_seed_keypair(pair.public_key.data(), expanded.data(), seed.data()) ==
                 0);
  return pair;
}

absl::StatusOr<Bytes> Ed25519Sign(ByteSpan seed, ByteSpan message) {
  RETURN_IF_ERROR(CheckSize("Ed25519 seed", seed, kEd25519SeedSize));
  EnsureSodium();
  uint8_t public_key[crypto_sign_PUBLICKEYBYTES];
  SecretBytes expanded(crypto_sign_SECRETKEYBYTES);
  CLOISTER_CHECK(crypto_sign_seed_keypair(public_key, expanded.data(), seed.data()) == 0);
  Bytes signature(kEd25519SignatureSize);
  CLOISTER_CHECK(crypto_sign_detached(signature.data(), nullptr, message.data(), message.size(),
                                      expanded.data()) == 0);
  return signature;
}

absl::Status Ed25519Verify(ByteSpan public_key, ByteSpan message, ByteSpan signature) {
  RETURN_IF_ERROR(CheckSize("Ed25519 public key", public_key, kEd25519PublicKeySize));
  RETURN_IF_ERROR(CheckSize("Ed25519 signature", signature, kEd25519SignatureSize));
  EnsureSodium();
  if (crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                  public_key.data()) != 0) {
    return absl::PermissionDeniedError("Ed25519 signature does not verify");
  }
  return absl::OkStatus();
}

}  // namespace cloister::crypto

#include "crypto/model_handle.h"

#include "crypto/hash.h"

namespace cloister::crypto {

std::string ModelHandle(ByteSpan owner_identity_public_key, std::string_view model_name) {
  Bytes input = ToBytes("cloister/v1 model handle");
  AppendLengthPrefixed(input, owner_identity_public_key);
  AppendLengthPrefixed(input, AsBytes(model_name));
  return HexEncode(Sha256(input)).substr(0, 32);
}

std::string PublishedModelHandle(std::string_view model_name) {
  Bytes input = ToBytes("cloister/v1 published model handle");
  AppendLengthPrefixed(input, AsBytes(model_name));
  return HexEncode(Sha256(input)).substr(0, 32);
}

bool IsValidModelHandle(std::string_view handle) {
  if (handle.size() != 32) return false;
  for (char c : handle) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Bytes ModelEncryptionContext(std::string_view handle) {
  Bytes context = ToBytes("cloister/v1 model");
  Append(context, AsBytes(handle));
  return context;
}

}  // namespace cloister::crypto

#include "sdk/model_dir.h"

#include "proto/checkpoint_dir.h"

namespace cloister::sdk {

absl::StatusOr<std::map<std::string, std::string>> ListModelDir(const std::string& dir) {
  return package::ListCheckpointDir(dir);
}

absl::StatusOr<Bytes> PackModelDir(const std::string& dir, uint64_t max_size) {
  return package::PackCheckpointDir(dir, max_size);
}

}  // namespace cloister::sdk

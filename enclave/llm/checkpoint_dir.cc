#include "proto/checkpoint_dir.h"

#include "base/status.h"
#include "enclave/llm/model.h"

namespace cloister::llm {

// Which files are the checkpoint is proto/checkpoint_dir.h's call, the same as for packing an
// upload: a folder the tools load is one `cloister upload` would pack.
absl::StatusOr<CheckpointFiles> ReadCheckpointDir(const std::string& dir,
                                                  std::vector<std::string>& storage) {
  ASSIGN_OR_RETURN(auto paths, package::ListCheckpointDir(dir));
  // No reallocation while the views are taken: a short string's bytes live inside the string
  // object, so moving it would leave its view dangling.
  storage.reserve(storage.size() + paths.size());
  CheckpointFiles files;
  for (const auto& [name, path] : paths) {
    ASSIGN_OR_RETURN(std::string bytes, package::ReadCheckpointFile(path, uint64_t{1} << 40));
    storage.push_back(std::move(bytes));
    files.emplace(name,
                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(storage.back().data()),
                                           storage.back().size()));
  }
  return files;
}

}  // namespace cloister::llm

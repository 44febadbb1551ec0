// ONNX Runtime as a benchmark peer: runs bench/ort_peer.js under node as a child process with
// onnxruntime-node (npm, CPU build) and talks to it over two pipes, one JSON request and one
// JSON reply per line. The peer keeps one session loaded, so the caller can interleave its own
// timed runs with the peer's on identical inputs. The peer times session.run() itself, so the
// pipe round trip is not part of its figures.
//
// Threading: not thread-safe; one owner drives the peer. Ownership: an OrtPeer owns its child
// process and stops it (quit request, then wait) on destruction.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "enclave/runtime/tensor.h"

namespace cloister::bench {

struct OrtPeerConfig {
  std::string node = "node";  // program name (searched on PATH) or path
  std::string script;         // bench/ort_peer.js
  // The node_modules folder that holds onnxruntime-node, or the npm project folder above it.
  std::string modules_dir;
};

// One input as the peer reads it: raw little-endian elements in `file`.
struct PeerInput {
  std::string name;
  runtime::DataType dtype = runtime::DataType::kFloat;
  std::vector<int64_t> shape;
  std::string file;
};

class OrtPeer {
 public:
  // Starts the peer and waits for its greeting. FailedPrecondition when node cannot be started
  // or onnxruntime-node does not load from `modules_dir` (the peer is not installed); Internal
  // when the pipes or the child cannot be set up.
  static absl::StatusOr<std::unique_ptr<OrtPeer>> Start(const OrtPeerConfig& config);
  ~OrtPeer();
  OrtPeer(const OrtPeer&) = delete;
  OrtPeer& operator=(const OrtPeer&) = delete;

  // onnxruntime-node's version, as its package.json says.
  const std::string& version() const { return version_; }

  // Creates a session for `model_path` (graph optimisation level all, `threads` intra-op
  // threads, one inter-op thread, sequential execution) fed with `inputs`. Returns the session
  // creation time in ms, or the peer's error (Internal, with its message).
  absl::StatusOr<double> Load(const std::string& model_path, int threads,
                              const std::vector<PeerInput>& inputs);
  // Runs the loaded session `iterations` times; returns each run's time in ms.
  absl::StatusOr<std::vector<double>> Time(int iterations);
  // Runs once and reads back every output (written to files in `dir`), in graph order.
  absl::StatusOr<std::vector<std::pair<std::string, runtime::Tensor>>> Outputs(
      const std::string& dir);

 private:
  OrtPeer(pid_t pid, int request_fd, std::FILE* replies)
      : pid_(pid), request_fd_(request_fd), replies_(replies) {}
  // Sends one request line and returns the reply line; Internal if the peer has gone away.
  absl::StatusOr<std::string> Exchange(const std::string& request);
  absl::StatusOr<std::string> ReadLine();

  pid_t pid_;
  int request_fd_;      // the child's stdin
  std::FILE* replies_;  // the child's stdout
  std::string version_;
};

// The ORT name of an element type ("float32", "int64", ...); empty when ORT has none.
std::string OrtTypeName(runtime::DataType dtype);
// The inverse; InvalidArgument for a name this benchmark does not read back.
absl::StatusOr<runtime::DataType> DataTypeFromOrtName(const std::string& name);

}  // namespace cloister::bench

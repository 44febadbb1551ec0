// The `cloister` tenant command line (DESIGN.md section 8): keygen, attest, upload, models,
// infer, generate and delete, as a function so tests can run it in-process. sdk/cli_main.cc is the
// program; RunCli is everything else.
//
// Contract: human-readable output by default and exactly one JSON document on stdout with
// --json; errors go to stderr as one line "cloister: <reason>"; the exit status is 0 for
// success, 1 for a failed attestation or an operation that was refused or failed, and 2 for
// bad usage or unreadable local input (unknown flag, missing file, malformed .npy, bad key,
// policy or token file). Every local input is read and checked before any connection.
// Threading: RunCli is not reentrant with respect to its streams; run one at a time per pair.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cloister/api/v1/api.pb.h"

namespace cloister::sdk {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRefused = 1;
inline constexpr int kExitUsage = 2;

struct CliIo {
  std::ostream& out;
  std::ostream& err;
  // The CLOISTER_* environment variables (the only ones read).
  std::map<std::string, std::string> env;
  // Show an upload progress line on `err` (only when it is a terminal).
  bool show_progress = false;
};

// Runs one command; `args` excludes the program name. Returns the exit status.
int RunCli(const std::vector<std::string>& args, CliIo& io);

// An output tensor name made safe as a file name: characters other than letters, digits,
// '.', '_' and '-' become '_', leading dots become '_', an empty name becomes "output".
std::string SanitizeOutputName(const std::string& name);

// {"name": ..., "datatype": ..., "shape": [...], "data": [...]} with the elements as JSON
// numbers (booleans for BOOL; non-finite floats as null). The tensor must be valid
// (ValidateTensor); InvalidArgument otherwise.
absl::StatusOr<std::string> TensorToJson(const cloister::api::v1::Tensor& tensor);

}  // namespace cloister::sdk

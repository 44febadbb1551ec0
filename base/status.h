// Error handling for all of Cloister: absl::Status / absl::StatusOr<T> with the two macros
// below. No exceptions cross our own interfaces; library errors (OpenSSL, libsodium, gRPC,
// CUDA) are converted in the one wrapper that calls each library.
// Thread-safe: these are macros and free functions only.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CLOISTER_CONCAT_INNER_(a, b) a##b
#define CLOISTER_CONCAT_(a, b) CLOISTER_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                     \
  do {                                            \
    ::absl::Status _cloister_status = (expr);     \
    if (!_cloister_status.ok()) return _cloister_status; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())`: evaluates F() (an absl::StatusOr<T>); on error returns the
// status from the enclosing function, otherwise moves the value into the declaration.
#define ASSIGN_OR_RETURN(lhs, expr) \
  CLOISTER_ASSIGN_OR_RETURN_IMPL_(CLOISTER_CONCAT_(_cloister_sor_, __LINE__), lhs, expr)
#define CLOISTER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(tmp).value()

// For a broken internal invariant (never for bad input): logs and aborts the process.
#define CLOISTER_CHECK(cond)                                                   \
  do {                                                                         \
    if (!(cond)) ::cloister::internal::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

namespace cloister::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition);
}  // namespace cloister::internal

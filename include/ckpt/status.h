// ckpt::Status and ckpt::Result<T>: the error model of every public ckpt API.
//
// A Status is either OK or carries a code and a human-readable message. Result<T>
// holds either a T or a non-OK Status. Neither throws; both are cheap to move.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace ckpt {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // the caller's input is wrong (bad name, rank out of range)
  kNotFound = 2,          // unknown checkpoint, tensor or path
  kAlreadyExists = 3,     // a checkpoint of that name is already loaded or loading
  kCorrupt = 4,           // a file or segment that does not follow its format
  kUnsupported = 5,       // a valid input this build cannot handle
  kResourceExhausted = 6, // memory budget, shm space, too many connections
  kFailedPrecondition = 7,// the system is not in a state that allows the call
  kUnavailable = 8,       // the daemon cannot be reached
  kIoError = 9,           // a system call failed
  kInternal = 10,         // a bug
  kPermissionDenied = 11, // the caller may not do this
  kDeadlineExceeded = 12, // a wait the caller bounded ran out (a peer that never came)
  kCancelled = 13,        // the caller cancelled the operation (nothing was published)
};

// Returns the stable lower-case name of `code` ("invalid_argument", ...), used on the wire.
const char* StatusCodeName(StatusCode code);
// Parses a name from StatusCodeName; unknown names map to kInternal.
StatusCode StatusCodeFromName(const std::string& name);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "code_name: message", or "ok".
  std::string ToString() const;

  // Returns a copy whose message is "context: message"; OK stays OK.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status AlreadyExists(std::string message);
Status Corrupt(std::string message);
Status Unsupported(std::string message);
Status ResourceExhausted(std::string message);
Status FailedPrecondition(std::string message);
Status Unavailable(std::string message);
Status IoError(std::string message);
Status Internal(std::string message);
Status PermissionDenied(std::string message);
Status DeadlineExceeded(std::string message);
Status Cancelled(std::string message);
// The one errno mapping, "what: strerror(err)": ResourceExhausted for EMFILE ENFILE ENOSPC EDQUOT, PermissionDenied for EACCES EPERM EROFS, else IoError.
Status ErrnoError(const std::string& what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result needs a value or an error");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error; an OK Status when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // Precondition: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ckpt

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define CKPT_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::ckpt::Status ckpt_status_ = (expr);       \
    if (!ckpt_status_.ok()) return ckpt_status_; \
  } while (0)

#define CKPT_CONCAT_INNER_(a, b) a##b
#define CKPT_CONCAT_(a, b) CKPT_CONCAT_INNER_(a, b)
// Declares `lhs` from the value of Result `rexpr`, or returns its error.
#define CKPT_ASSIGN_OR_RETURN(lhs, rexpr)                                \
  auto CKPT_CONCAT_(ckpt_result_, __LINE__) = (rexpr);                   \
  if (!CKPT_CONCAT_(ckpt_result_, __LINE__).ok())                        \
    return CKPT_CONCAT_(ckpt_result_, __LINE__).status();                \
  lhs = std::move(CKPT_CONCAT_(ckpt_result_, __LINE__)).value()

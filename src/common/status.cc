#include "ckpt/status.h"

#include <cerrno>
#include <cstring>

namespace ckpt {
namespace {
constexpr const char* kNames[] = {
    "ok",        "invalid_argument",   "not_found",   "already_exists",
    "corrupt",   "unsupported",        "resource_exhausted", "failed_precondition",
    "unavailable", "io_error",         "internal",    "permission_denied",
    "deadline_exceeded", "cancelled",
};
constexpr int kNameCount = sizeof(kNames) / sizeof(kNames[0]);
}  // namespace

const char* StatusCodeName(StatusCode code) {
  int i = static_cast<int>(code);
  return (i >= 0 && i < kNameCount) ? kNames[i] : "internal";
}

StatusCode StatusCodeFromName(const std::string& name) {
  for (int i = 0; i < kNameCount; ++i) {
    if (name == kNames[i]) return static_cast<StatusCode>(i);
  }
  return StatusCode::kInternal;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

Status ErrnoError(const std::string& what, int err) {
  const std::string text = what + ": " + std::strerror(err);
  switch (err) {
    // Out of descriptors, space or quota: a resource limit, never an I/O (or data) problem.
    case EMFILE:
    case ENFILE:
    case ENOSPC:
    case EDQUOT:
      return ResourceExhausted(text);
    // Refused by permissions or a read-only file system: the caller may act on it.
    case EACCES:
    case EPERM:
    case EROFS:
      return PermissionDenied(text);
    default:
      return IoError(text);
  }
}

}  // namespace ckpt

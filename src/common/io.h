// Small POSIX I/O helpers that retry on EINTR and report errors as Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/status.h"
#include "common/unique_fd.h"

namespace ckpt {

// Opens `path` read-only (flags are OR-ed in). NotFound if it does not exist.
Result<UniqueFd> OpenForRead(const std::string& path, int extra_flags = 0);
// Size of the regular file open at `fd`; FailedPrecondition if it is not a regular file.
Result<uint64_t> RegularFileSize(int fd, const std::string& path_for_errors);
// Reads exactly `size` bytes at `offset`. Corrupt if the file ends first.
Status PreadFull(int fd, void* buf, size_t size, uint64_t offset, const std::string& path_for_errors);
// Writes all of `size` bytes to a socket or pipe, without raising SIGPIPE.
Status SendAll(int fd, const void* buf, size_t size);
// Reads exactly `size` bytes from a stream. Unavailable("connection closed") on EOF.
Status RecvAll(int fd, void* buf, size_t size);

}  // namespace ckpt

#include "common/io.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace ckpt {

Result<UniqueFd> OpenForRead(const std::string& path, int extra_flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("no such file: " + path);
    return ErrnoError("cannot open " + path, errno);
  }
  return UniqueFd(fd);
}

Result<uint64_t> RegularFileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return FailedPrecondition(path + " is not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

Status PreadFull(int fd, void* buf, size_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read of " + path + " failed", errno);
    }
    if (n == 0) return Corrupt(path + " ends early at byte " + std::to_string(offset));
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status SendAll(int fd, const void* buf, size_t size) {
  const auto* p = static_cast<const char*>(buf);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("send failed", errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* buf, size_t size) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("receive failed", errno);
    }
    if (n == 0) return Unavailable("connection closed by peer");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace ckpt

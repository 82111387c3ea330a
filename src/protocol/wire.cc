#include "protocol/wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>

#include "common/io.h"

namespace ckpt::protocol {

using nlohmann::json;

namespace {
std::string Encode(const json& message) {
  std::string body = message.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string frame(4 + body.size(), '\0');
  uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(frame.data() + 4, body.data(), body.size());
  return frame;
}

// Waits until `fd` is ready for `events` or `deadline` passes (DeadlineExceeded).
Status WaitReady(int fd, short events, Deadline deadline) {
  if (deadline == kNoDeadline) return Status::Ok();
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return DeadlineExceeded("the peer did not complete a frame in time");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 60000)));
    if (n < 0 && errno != EINTR) return ErrnoError("poll", errno);
    if (n > 0) return Status::Ok();  // ready, or hung up (the next call reports it)
  }
}

// Sends all of `size` bytes by `deadline`, without raising SIGPIPE.
Status SendAllUntil(int fd, const char* p, size_t size, Deadline deadline) {
  const int flags = MSG_NOSIGNAL | (deadline == kNoDeadline ? 0 : MSG_DONTWAIT);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        CKPT_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline));
        continue;
      }
      return ErrnoError("send failed", errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads exactly `size` bytes with recvmsg by `deadline`, keeping the first descriptor
// passed with them. Sets *truncated (if given) when the kernel dropped descriptors sent
// with them (MSG_CTRUNC: this process had no free descriptor).
Status RecvAllWithFd(int fd, void* buf, size_t size, UniqueFd* received_fd, Deadline deadline,
                     bool* truncated = nullptr) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    CKPT_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline));
    iovec iov{p, size};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | (deadline == kNoDeadline ? 0 : MSG_DONTWAIT));
    if (n < 0) {
      if (errno == EINTR || (deadline != kNoDeadline && (errno == EAGAIN || errno == EWOULDBLOCK))) continue;
      return ErrnoError("receive failed", errno);
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0 && truncated != nullptr) *truncated = true;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (received_fd != nullptr && !received_fd->valid()) {
          received_fd->reset(passed);
        } else {
          ::close(passed);
        }
      }
    }
    if (n == 0) return Unavailable("connection closed by peer");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}
}  // namespace

Deadline DeadlineIn(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

Status WriteFrame(int fd, const json& message, Deadline deadline) {
  std::string frame = Encode(message);
  if (frame.size() - 4 > kMaxResponseBytes) return ResourceExhausted("message too large to send");
  return SendAllUntil(fd, frame.data(), frame.size(), deadline);
}

bool PeerClosedOrReadable(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  int n;
  do {
    n = ::poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  return n > 0 && p.revents != 0;
}

Status WriteFrameWithFd(int fd, const json& message, int pass_fd, Deadline deadline) {
  std::string frame = Encode(message);
  if (frame.size() - 4 > kMaxResponseBytes) return ResourceExhausted("message too large to send");
  iovec iov{frame.data(), 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  ssize_t n;
  for (;;) {
    n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (deadline == kNoDeadline ? 0 : MSG_DONTWAIT));
    if (n >= 0 || errno == EINTR) {
      if (n >= 0) break;
      continue;
    }
    if (deadline != kNoDeadline && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      CKPT_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline));
      continue;
    }
    return ErrnoError("send failed", errno);
  }
  return SendAllUntil(fd, frame.data() + 1, frame.size() - 1, deadline);
}

Result<json> ReadFrame(int fd, uint32_t max_bytes, UniqueFd* received_fd, Deadline deadline) {
  unsigned char len[4];
  bool truncated = false;
  CKPT_RETURN_IF_ERROR(RecvAllWithFd(fd, len, 4, received_fd, deadline, &truncated));
  uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  if (n > max_bytes) {
    return Corrupt("frame of " + std::to_string(n) + " bytes exceeds the limit of " +
                   std::to_string(max_bytes));
  }
  std::string body(n, '\0');
  Status st = RecvAllWithFd(fd, body.data(), n, nullptr, deadline);
  if (st.code() == StatusCode::kDeadlineExceeded) return st;
  if (!st.ok()) return Corrupt("frame cut short: " + st.message());
  json message = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object()) return Corrupt("frame is not a JSON object");
  if (truncated && received_fd != nullptr && !received_fd->valid()) {
    // The frame was read whole (the connection stays in step); only its descriptor is lost.
    return ResourceExhausted("the descriptor sent with this message was dropped: the receiving process has no "
                             "free file descriptor (RLIMIT_NOFILE)");
  }
  return message;
}

json OkResponse(json body) {
  body["v"] = kProtocolVersion;
  body["ok"] = true;
  return body;
}

json ErrorResponse(const Status& status) {
  return json{{"v", kProtocolVersion},
              {"ok", false},
              {"code", StatusCodeName(status.code())},
              {"error", status.message()}};
}

Status StatusOf(const json& response) {
  auto ok = response.find("ok");
  if (ok == response.end() || !ok->is_boolean()) return Corrupt("response without 'ok'");
  if (ok->get<bool>()) return Status::Ok();
  std::string code = response.value("code", "internal");
  std::string error = response.value("error", "unknown error");
  return Status(StatusCodeFromName(code), error);
}

namespace {
Result<sockaddr_un> AddressOf(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path must be 1 to " + std::to_string(sizeof(addr.sun_path) - 1) +
                           " bytes: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}
}  // namespace

std::string DefaultSocketPath() {
  const char* env = std::getenv("CKPTD_SOCKET");
  return (env != nullptr && *env != '\0') ? env : "/run/ckptd/ckptd.sock";
}

Result<UniqueFd> ConnectUnix(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(sockaddr_un addr, AddressOf(path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket", errno);
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    return Unavailable("cannot reach ckptd at " + path + ": " + std::strerror(err) +
                       " (is the daemon running?)");
  }
  return fd;
}

Result<UniqueFd> ListenUnix(const std::string& path, uint32_t mode) {
  CKPT_ASSIGN_OR_RETURN(sockaddr_un addr, AddressOf(path));
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return AlreadyExists(path + " exists and is not a socket");
    if (ConnectUnix(path).ok()) return AlreadyExists("a daemon already listens on " + path);
    ::unlink(path.c_str());  // stale, from a daemon that died
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket", errno);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoError("cannot bind " + path, errno);
  }
  if (::chmod(path.c_str(), mode) != 0) return ErrnoError("chmod " + path, errno);
  if (::listen(fd.get(), 128) != 0) return ErrnoError("listen on " + path, errno);
  return fd;
}

}  // namespace ckpt::protocol

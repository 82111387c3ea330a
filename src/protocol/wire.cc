#include "protocol/wire.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/io.h"

namespace ckpt::protocol {

using nlohmann::json;

Status WriteFrame(int fd, const json& message) {
  std::string body = message.dump(-1, ' ', false, json::error_handler_t::replace);
  if (body.size() > kMaxResponseBytes) return ResourceExhausted("message too large to send");
  std::string frame(4 + body.size(), '\0');
  uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(frame.data() + 4, body.data(), body.size());
  return SendAll(fd, frame.data(), frame.size());
}

namespace {
std::string Encode(const json& message) {
  std::string body = message.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string frame(4 + body.size(), '\0');
  uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(frame.data() + 4, body.data(), body.size());
  return frame;
}

// Reads exactly `size` bytes with recvmsg, keeping the first descriptor passed with them.
Status RecvAllWithFd(int fd, void* buf, size_t size, UniqueFd* received_fd) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    iovec iov{p, size};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("receive failed", errno);
    }
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

Status WriteFrameWithFd(int fd, const json& message, int pass_fd) {
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
  do {
    n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError("send failed", errno);
  return SendAll(fd, frame.data() + 1, frame.size() - 1);
}

Result<json> ReadFrame(int fd, uint32_t max_bytes, UniqueFd* received_fd) {
  unsigned char len[4];
  CKPT_RETURN_IF_ERROR(RecvAllWithFd(fd, len, 4, received_fd));
  uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  if (n > max_bytes) {
    return Corrupt("frame of " + std::to_string(n) + " bytes exceeds the limit of " +
                   std::to_string(max_bytes));
  }
  std::string body(n, '\0');
  Status st = RecvAll(fd, body.data(), n);
  if (!st.ok()) return Corrupt("frame cut short: " + st.message());
  json message = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object()) return Corrupt("frame is not a JSON object");
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

#include "common/pause_point.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/unique_fd.h"

namespace ckpt {
namespace {

const std::string& PauseDir() {
  static const std::string dir = [] {
    const char* env = secure_getenv("CKPT_PAUSE_DIR");
    return std::string(env != nullptr ? env : "");
  }();
  return dir;
}

bool IsFifo(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

int OpenRetrying(const std::string& path, int flags) {
  int fd;
  do fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW);
  while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

void PausePoint(const char* name) {
  const std::string& dir = PauseDir();
  if (dir.empty()) return;
  const std::string base = dir + "/" + name;
  if (!IsFifo(base + ".reached") || !IsFifo(base + ".resume")) return;
  {
    UniqueFd reached(OpenRetrying(base + ".reached", O_WRONLY));
    if (!reached.valid()) return;
    const char byte = 1;
    while (::write(reached.get(), &byte, 1) < 0 && errno == EINTR) {
    }
  }
  UniqueFd resume(OpenRetrying(base + ".resume", O_RDONLY));
  if (!resume.valid()) return;
  char buf[64];
  for (;;) {
    const ssize_t n = ::read(resume.get(), buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
}

}  // namespace ckpt

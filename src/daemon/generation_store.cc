#include "daemon/generation_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace ckpt::daemon {

namespace {
constexpr char kFile[] = "generation";
}  // namespace

Result<std::unique_ptr<GenerationStore>> GenerationStore::Open(const std::string& state_dir) {
  const std::string what = "state directory " + state_dir;
  if (state_dir.empty() || state_dir[0] != '/') return InvalidArgument("the state directory must be an absolute path");
  if (::mkdir(state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError("creating " + what + " (set --state-dir to a directory ckptd may write)", errno);
  }
  UniqueFd dir(::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) {
    if (errno == ENOTDIR) return FailedPrecondition(what + " is not a directory");
    return ErrnoError("opening " + what, errno);
  }
  struct stat st;
  if (::fstat(dir.get(), &st) != 0) return ErrnoError("fstat of " + what, errno);
  if (st.st_uid != ::geteuid()) {
    return FailedPrecondition(what + " is owned by uid " + std::to_string(st.st_uid) + ", not by ckptd's uid " +
                              std::to_string(::geteuid()));
  }
  if (st.st_mode & 022) return FailedPrecondition(what + " is writable by group or others; make it 0700 or 0750");
  // Probe that we can write here now rather than at the first load.
  if (::faccessat(dir.get(), ".", W_OK, AT_EACCESS) != 0) return ErrnoError(what + " is not writable", errno);
  if (::flock(dir.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return FailedPrecondition(what + " is in use by another ckptd");
    return ErrnoError("locking " + what, errno);
  }
  uint64_t last = 0;
  auto read = ReadStateFile(dir.get(), state_dir, kFile, 64);
  if (read.ok()) {
    std::string text = *read;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    bool ok = !text.empty() && text.size() <= 20;
    for (char c : text) {
      if (c < '0' || c > '9' || __builtin_mul_overflow(last, 10, &last) ||
          __builtin_add_overflow(last, static_cast<uint64_t>(c - '0'), &last)) {
        ok = false;
        break;
      }
    }
    if (!ok) {
      return Corrupt(state_dir + "/" + kFile + " does not hold a generation number; it records the highest "
                     "generation ever handed out (remove it only if no segment and no client of this daemon remains)");
    }
  } else if (read.status().code() == StatusCode::kCorrupt) {
    return Corrupt(state_dir + "/" + kFile + " is not a generation file");
  } else if (read.status().code() != StatusCode::kNotFound) {
    return read.status();
  }
  return std::unique_ptr<GenerationStore>(new GenerationStore(state_dir, std::move(dir), last));
}

Status GenerationStore::Persist(uint64_t generation) {
  if (generation <= last_) return Status::Ok();
  CKPT_RETURN_IF_ERROR(WriteStateFile(dir_.get(), path_, kFile, std::to_string(generation) + "\n"));
  last_ = generation;
  return Status::Ok();
}

Result<std::string> ReadStateFile(int dir_fd, const std::string& dir_path, const std::string& name,
                                  size_t max_bytes) {
  const std::string what = dir_path + "/" + name;
  UniqueFd f(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!f.valid()) {
    if (errno == ENOENT) return NotFound("no " + what);
    if (errno == ELOOP) return Corrupt(what + " is a symbolic link");
    return ErrnoError("opening " + what, errno);
  }
  struct stat st;
  if (::fstat(f.get(), &st) != 0) return ErrnoError("fstat of " + what, errno);
  if (!S_ISREG(st.st_mode) || st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Corrupt(what + " is not a regular file of at most " + std::to_string(max_bytes) + " bytes");
  }
  std::string text(max_bytes + 1, '\0');
  const ssize_t n = ::pread(f.get(), text.data(), text.size(), 0);
  if (n < 0) return ErrnoError("reading " + what, errno);
  if (static_cast<size_t>(n) > max_bytes) return Corrupt(what + " is larger than " + std::to_string(max_bytes) + " bytes");
  text.resize(static_cast<size_t>(n));
  return text;
}

Status WriteStateFile(int dir_fd, const std::string& dir_path, const std::string& name, const std::string& text) {
  const std::string what = dir_path + "/" + name;
  const std::string tmp = name + ".tmp";
  (void)::unlinkat(dir_fd, tmp.c_str(), 0);
  UniqueFd f(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!f.valid()) return ErrnoError("writing " + what, errno);
  const ssize_t n = ::write(f.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    const int err = n < 0 ? errno : ENOSPC;
    (void)::unlinkat(dir_fd, tmp.c_str(), 0);
    return ErrnoError("writing " + what, err);
  }
  if (::fsync(f.get()) != 0) {
    const int err = errno;
    (void)::unlinkat(dir_fd, tmp.c_str(), 0);
    return ErrnoError("fsync of " + what, err);
  }
  f.reset();
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    const int err = errno;
    (void)::unlinkat(dir_fd, tmp.c_str(), 0);
    return ErrnoError("renaming into " + what, err);
  }
  if (::fsync(dir_fd) != 0) return ErrnoError("fsync of " + dir_path, errno);
  return Status::Ok();
}

}  // namespace ckpt::daemon

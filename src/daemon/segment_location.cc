#include "daemon/segment_location.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <spdlog/spdlog.h>

#include "daemon/generation_store.h"
#include "shm/segment_name.h"

namespace ckpt::daemon {

namespace {

constexpr int kNewNameTries = 8;
constexpr size_t kRecordMaxBytes = 256;

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

const char* KindOf(const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISREG(st.st_mode)) return "a file";
  return "a special file";
}

// "<prefix>.<32 lower-hex>": a name scheme 2 made for `prefix`.
bool IsRandomName(const std::string& name, const std::string& prefix) {
  const std::string lead = prefix + ".";
  return name.size() == lead.size() + 2 * shm::kSegmentIdBytes && name.compare(0, lead.size(), lead) == 0 &&
         shm::ParseSegmentIdHex(name.substr(lead.size())).has_value();
}

std::string Trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The recorded directory name if it is one of ours to open, "" otherwise (logged).
std::string RecordedName(const SegmentLocationOptions& o) {
  auto record = ReadStateFile(o.state_dir_fd, o.state_dir, kSegmentDirectoryRecord, kRecordMaxBytes);
  if (!record.ok()) {
    if (record.status().code() != StatusCode::kNotFound) {
      spdlog::warn("ignoring {}: a new segment directory is made", record.status().message());
    }
    return "";
  }
  const std::string name = Trimmed(*record);
  if (!IsRandomName(name, o.shm_prefix)) {
    spdlog::warn("{}/{} names '{}', not a segment directory of shm-prefix '{}': ignored, a new one is made",
                 o.state_dir, kSegmentDirectoryRecord, name, o.shm_prefix);
    return "";
  }
  return name;
}

// Scheme 2: the recorded /dev/shm/<prefix>.<random> while it is ours, else a new one.
Result<std::unique_ptr<shm::SegmentDirectory>> OpenRandomDirectory(const SegmentLocationOptions& o,
                                                                   std::string* fixed) {
  const uid_t euid = ::geteuid();
  if (const std::string name = RecordedName(o); !name.empty()) {
    const std::string path = o.shm_root + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode) && st.st_uid == euid) {
        // Ours: open it (or fail, e.g. a lock held) -- its segments are re-adopted.
        return shm::SegmentDirectory::Open(path, {o.group, true, shm::SegmentDirectoryOptions::Create::kMustExist},
                                           fixed);
      }
      spdlog::warn("the recorded segment directory {} is now {} of uid {}, not a directory of ckptd's: another user "
                   "planted it after the directory was gone; it is never opened, and a new directory is made",
                   path, KindOf(st), st.st_uid);
    } else if (errno == ENOENT) {
      spdlog::info("the recorded segment directory {} is gone (a reboot, or a stop with --cleanup-on-exit): "
                   "a new one is made", path);
    } else {
      return ErrnoError("lstat of the recorded segment directory " + path, errno);
    }
  }
  const std::string legacy = o.shm_root + "/" + o.shm_prefix;
  struct stat old;
  if (::lstat(legacy.c_str(), &old) == 0 && S_ISDIR(old.st_mode) && old.st_uid == euid) {
    spdlog::warn("{} (the segment directory of an older ckptd) is no longer used and its segments are not "
                 "adopted: remove it (rm -r {}) once no client uses them", legacy, legacy);
  }
  for (int attempt = 0; attempt < kNewNameTries; ++attempt) {
    CKPT_ASSIGN_OR_RETURN(shm::SegmentId id, shm::RandomSegmentId());
    const std::string name = o.shm_prefix + "." + shm::SegmentIdHex(id);
    auto dir = shm::SegmentDirectory::Open(o.shm_root + "/" + name,
                                           {o.group, true, shm::SegmentDirectoryOptions::Create::kMustCreate}, fixed);
    if (dir.status().code() == StatusCode::kAlreadyExists) continue;
    if (!dir.ok()) return dir.status();
    if (Status recorded = WriteStateFile(o.state_dir_fd, o.state_dir, kSegmentDirectoryRecord, name + "\n");
        !recorded.ok()) {
      (void)(*dir)->RemoveIfEmpty();
      return recorded;
    }
    spdlog::info("created segment directory {} (its name is recorded in {}/{})", (*dir)->path(), o.state_dir,
                 kSegmentDirectoryRecord);
    return dir;
  }
  return IoError("cannot create a segment directory of a new random name in " + o.shm_root + " (" +
                 std::to_string(kNewNameTries) + " names taken)");
}

}  // namespace

Result<std::string> CheckSegmentDirPlace(const std::string& segment_dir) {
  const std::string key = "segment-dir '" + segment_dir + "'";
  std::string path = segment_dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.empty() || path[0] != '/') return FailedPrecondition(key + " is not an absolute path");
  const size_t slash = path.rfind('/');
  const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  const std::string base = path.substr(slash + 1);
  if (!shm::IsPlainFileName(base)) return FailedPrecondition(key + " does not name a directory");
  char resolved[PATH_MAX];
  if (::realpath(parent.c_str(), resolved) == nullptr) {
    return FailedPrecondition(key + ": its parent " + parent + " cannot be resolved as ckptd sees it (" +
                              std::strerror(errno) + "): create it, or choose another segment-dir");
  }
  const std::string real_parent = resolved;
  const uid_t euid = ::geteuid();
  // Every directory from / down to the parent.
  for (size_t end = 0; end != std::string::npos;) {
    end = real_parent.find('/', end + 1);
    std::string dir = real_parent.substr(0, end);
    if (dir.empty()) dir = "/";
    const bool is_parent = end == std::string::npos;
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) return ErrnoError("lstat of " + dir + " (the place of " + key + ")", errno);
    if (!S_ISDIR(st.st_mode)) return FailedPrecondition(key + ": " + dir + " is not a directory");
    if (st.st_uid != 0 && st.st_uid != euid) {
      return FailedPrecondition(key + ": " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                                ", who could replace what is in it; choose a segment-dir whose parents belong to "
                                "root or ckptd, such as /run/ckptd-segments (which the unit mounts)");
    }
    const bool others_write = (st.st_mode & 022) != 0;
    if (others_write && (is_parent || !(st.st_mode & S_ISVTX))) {
      return FailedPrecondition(key + ": " + dir + " is writable by group or others (mode " + Octal(st.st_mode) +
                                "), so another user could create or replace " + path +
                                " before ckptd does; choose a segment-dir whose parents only root or ckptd can "
                                "write, such as /run/ckptd-segments (which the unit mounts)");
    }
  }
  return (real_parent == "/" ? std::string() : real_parent) + "/" + base;
}

Result<std::unique_ptr<shm::SegmentDirectory>> OpenSegmentLocation(const SegmentLocationOptions& options,
                                                                   std::string* fixed) {
  if (!options.segment_dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(const std::string path, CheckSegmentDirPlace(options.segment_dir));
    auto dir = shm::SegmentDirectory::Open(path, {options.group, true, shm::SegmentDirectoryOptions::Create::kIfMissing},
                                           fixed);
    if (dir.status().code() != StatusCode::kPermissionDenied) return dir;
    spdlog::warn("{}: segments go to a directory of a random name in {} instead (under the unit, the "
                 "ExecStartPre= that mounts segment-dir failed: its message is in the journal)",
                 dir.status().message(), options.shm_root);
  }
  return OpenRandomDirectory(options, fixed);
}

}  // namespace ckpt::daemon

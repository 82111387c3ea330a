// ckpt::Persist: an attached generation written to a folder as (sharded) safetensors,
// straight from the read-only mapping, into a temporary folder renamed into place.
#include "ckpt/persist.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>
#include <set>

#include "client/persist_json.h"
#include "common/hex.h"
#include "common/progress_throttle.h"
#include "common/side_file_name.h"
#include "common/unique_fd.h"
#include "format/safetensors_writer.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// Bytes handed to one write(2) call (progress and cancel are checked between calls).
constexpr uint64_t kWriteChunk = 16ull << 20;
// Written-back window: dirty pages of a file are pushed to the disk and dropped from the
// page cache window by window, so persisting N GiB does not leave N GiB of page cache.
constexpr uint64_t kWritebackWindow = 64ull << 20;

// Progress reports at most every kProgressInterval (and at the end); remembers a cancel and
// an exception thrown by the callback.
class Progress {
 public:
  Progress(const CancellableProgress& callback, uint64_t total) : callback_(callback), total_(total) {}
  // Adds `bytes`; false once cancelled.
  bool Add(uint64_t bytes) {
    done_ += bytes;
    return Report(false);
  }
  bool Report(bool force) {
    if (cancelled_) return false;
    if (!callback_) return true;
    if (!throttle_.Due(force)) return true;
    try {
      if (!callback_(std::min(done_, total_), total_)) cancelled_ = true;
    } catch (...) {
      error_ = std::current_exception();
      cancelled_ = true;
    }
    return !cancelled_;
  }
  bool cancelled() const { return cancelled_; }
  std::exception_ptr error() const { return error_; }
  uint64_t done() const { return done_; }

 private:
  const CancellableProgress& callback_;
  uint64_t total_;
  uint64_t done_ = 0;
  ProgressThrottle throttle_;
  bool cancelled_ = false;
  std::exception_ptr error_;
};

// The temporary folder beside DIR. Removes what it holds unless Keep() was called.
class StagingDir {
 public:
  static Result<std::unique_ptr<StagingDir>> Create(int parent_fd, const std::string& parent_path,
                                                    const std::string& base) {
    for (int attempt = 0; attempt < 16; ++attempt) {
      uint64_t random = 0;
      if (::getrandom(&random, sizeof(random), 0) != sizeof(random)) return ErrnoError("getrandom", errno);
      const std::string suffix = Hex64(random).substr(4);  // 12 hex digits
      std::string name = "." + base + ".persist-" + suffix;
      if (name.size() > 255) name = ".ckpt-persist-" + suffix;
      // 0777 less the umask: the folder ends up with the mode a plain mkdir would give.
      if (::mkdirat(parent_fd, name.c_str(), 0777) != 0) {
        if (errno == EEXIST) continue;
        return ErrnoError("cannot create a folder beside the destination in '" + parent_path + "'", errno);
      }
      UniqueFd fd(::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid()) {
        const int err = errno;
        (void)::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR);
        return ErrnoError("cannot open '" + name + "' in '" + parent_path + "'", err);
      }
      return std::unique_ptr<StagingDir>(new StagingDir(parent_fd, std::move(name), std::move(fd)));
    }
    return IoError("cannot find a free temporary name in '" + parent_path + "'");
  }
  ~StagingDir() {
    if (!keep_) RemoveFolder(parent_fd_, name_);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  int fd() const { return fd_.get(); }
  const std::string& name() const { return name_; }
  void Keep() { keep_ = true; }

  // Removes folder `name` of `parent_fd` with the regular files (and symlinks) in it;
  // leaves it if it holds anything else. Never throws.
  static void RemoveFolder(int parent_fd, const std::string& name) noexcept {
    int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      if (DIR* d = ::fdopendir(fd)) {
        std::vector<std::string> names;
        while (dirent* e = ::readdir(d)) {
          if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
        }
        for (const std::string& n : names) (void)::unlinkat(::dirfd(d), n.c_str(), 0);
        ::closedir(d);
      } else {
        ::close(fd);
      }
    }
    (void)::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR);
  }

 private:
  StagingDir(int parent_fd, std::string name, UniqueFd fd) : parent_fd_(parent_fd), name_(std::move(name)), fd_(std::move(fd)) {}
  int parent_fd_;
  std::string name_;
  UniqueFd fd_;
  bool keep_ = false;
};

// What DIR is now.
enum class Existing { kAbsent, kEmpty, kFiles };

Result<Existing> InspectDestination(int parent_fd, const std::string& base, const std::string& dir, bool replace,
                                    mode_t* mode) {
  struct stat st {};
  if (::fstatat(parent_fd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Existing::kAbsent;
    return ErrnoError("cannot inspect '" + dir + "'", errno);
  }
  if (S_ISLNK(st.st_mode)) return FailedPrecondition("'" + dir + "' is a symbolic link: give the folder itself");
  if (!S_ISDIR(st.st_mode)) return FailedPrecondition("'" + dir + "' exists and is not a folder");
  *mode = st.st_mode & 07777;
  int fd = ::openat(parent_fd, base.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open '" + dir + "'", errno);
  DIR* d = ::fdopendir(fd);
  if (!d) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("cannot list '" + dir + "'", err);
  }
  std::vector<std::string> others;
  bool any = false;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    any = true;
    struct stat f {};
    if (::fstatat(::dirfd(d), e->d_name, &f, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(f.st_mode)) {
      others.emplace_back(e->d_name);
    }
  }
  ::closedir(d);
  if (!any) return Existing::kEmpty;
  if (!replace) {
    return AlreadyExists("'" + dir + "' exists and is not empty (replace it with --replace / replace=True)");
  }
  if (!others.empty()) {
    return FailedPrecondition("'" + dir + "' holds '" + others.front() +
                              "', which is not a regular file: only a folder of files is replaced");
  }
  return Existing::kFiles;
}

// The file groups of transformers' sharding rule (shard_checkpoint / split_torch_state_dict_into_shards).
std::vector<std::vector<size_t>> PlanFiles(const std::vector<TensorInfo>& tensors, uint64_t max_bytes) {
  std::vector<std::vector<size_t>> files;
  uint64_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = tensors[i].nbytes;
    if (files.empty() || (current > 0 && (n > max_bytes - std::min(max_bytes, current)))) {
      files.emplace_back();
      current = 0;
    }
    files.back().push_back(i);
    current += n;  // the caller checked the total fits in 64 bits
  }
  if (files.empty()) files.emplace_back();
  return files;
}

std::string ShardName(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// The metadata written: the generation's own, "total_size" dropped (an index's, recomputed),
// and "format": "pt" when absent (transformers refuses safetensors metadata without it).
std::map<std::string, std::string> FileMetadata(const std::map<std::string, std::string>& kept) {
  std::map<std::string, std::string> m = kept;
  m.erase("total_size");
  m.emplace("format", "pt");
  return m;
}

// The first bytes of the safetensors file of `group` (format::SafetensorsPrefix).
Result<std::string> Prefix(const std::vector<TensorInfo>& tensors, const std::vector<size_t>& group,
                           const std::map<std::string, std::string>& metadata, uint64_t* data_bytes) {
  std::vector<TensorInfo> entries;
  entries.reserve(group.size());
  for (size_t i : group) entries.push_back(tensors[i]);
  return format::SafetensorsPrefix(entries, metadata, data_bytes);
}

// Writes all of [data, data + size) at the file's current end, reporting progress;
// `written` is the file's length so far (for write-back). Cancelled if progress says so.
Status WriteAll(int fd, const std::byte* data, uint64_t size, const std::string& path, Progress* progress,
                bool count, uint64_t* written, uint64_t* flushed) {
  while (size > 0) {
    const size_t n = static_cast<size_t>(std::min(size, kWriteChunk));
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) {
        if (!progress->Report(true)) return Cancelled("persist cancelled");
        continue;
      }
      return ErrnoError("cannot write '" + path + "'", errno);
    }
    if (w == 0) return IoError("cannot write '" + path + "': no progress");
    data += w;
    size -= static_cast<uint64_t>(w);
    *written += static_cast<uint64_t>(w);
    // Push finished windows to the disk and drop them from the page cache; the window
    // before is waited for first, so at most two windows of the file are dirty.
    while (*written - *flushed >= kWritebackWindow) {
      (void)::sync_file_range(fd, static_cast<off_t>(*flushed), kWritebackWindow, SYNC_FILE_RANGE_WRITE);
      if (*flushed >= kWritebackWindow) {
        const off_t prev = static_cast<off_t>(*flushed - kWritebackWindow);
        (void)::sync_file_range(fd, prev, kWritebackWindow,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        (void)::posix_fadvise(fd, prev, kWritebackWindow, POSIX_FADV_DONTNEED);
      }
      *flushed += kWritebackWindow;
    }
    if (count ? !progress->Add(static_cast<uint64_t>(w)) : !progress->Report(false)) {
      return Cancelled("persist cancelled");
    }
  }
  return Status::Ok();
}

// Creates `name` in the staging folder, reserves `size` bytes (an early, clean ENOSPC),
// and returns its descriptor.
Result<UniqueFd> CreateFile(int dir_fd, const std::string& name, uint64_t size) {
  UniqueFd fd(::openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
  if (!fd.valid()) return ErrnoError("cannot create '" + name + "'", errno);
  if (size > 0 && size <= static_cast<uint64_t>(INT64_MAX) && ::fallocate(fd.get(), 0, 0, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS && err != EINVAL) return ErrnoError("cannot reserve space for '" + name + "'", err);
  }
  return fd;
}

Status FinishFile(UniqueFd fd, const std::string& name, uint64_t written, uint64_t expected) {
  if (written != expected) return Internal("'" + name + "': wrote " + std::to_string(written) + " bytes, planned " + std::to_string(expected));
  if (::ftruncate(fd.get(), static_cast<off_t>(written)) != 0) return ErrnoError("cannot size '" + name + "'", errno);
  if (::fsync(fd.get()) != 0) return ErrnoError("cannot fsync '" + name + "'", errno);
  const int raw = fd.release();
  if (::close(raw) != 0) return ErrnoError("cannot close '" + name + "'", errno);
  return Status::Ok();
}

Status WriteSmallFile(int dir_fd, const std::string& name, std::string_view bytes, Progress* progress) {
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, CreateFile(dir_fd, name, bytes.size()));
  uint64_t written = 0, flushed = 0;
  CKPT_RETURN_IF_ERROR(WriteAll(fd.get(), reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), name,
                                progress, true, &written, &flushed));
  return FinishFile(std::move(fd), name, written, bytes.size());
}

// Splits DIR into its parent folder and last component ("a/b/" -> "a", "b").
Status SplitDir(const std::string& dir, std::string* parent, std::string* base) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (d.empty() || d == "/") return InvalidArgument("persist needs a folder path other than '/'");
  const size_t slash = d.rfind('/');
  *base = slash == std::string::npos ? d : d.substr(slash + 1);
  *parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : d.substr(0, slash));
  if (*base == "." || *base == "..") return InvalidArgument("'" + dir + "': name the folder itself, not '.' or '..'");
  return Status::Ok();
}

// One safetensors file of the plan.
struct PlannedFile {
  std::string name;
  std::string prefix;  // the length and the header
  uint64_t data_bytes = 0;
};

// What persist writes, decided before anything is created: the tensor files (one per
// group), the index of a sharded checkpoint, the side files, and the bytes of it all.
struct PersistPlan {
  uint64_t data_total = 0;  // the tensors' bytes
  std::vector<std::vector<size_t>> groups;
  bool sharded = false;
  std::vector<PlannedFile> files;  // one per group
  std::string index;               // sharded only
  std::vector<std::string> side_names;
  std::vector<std::string_view> side_bytes;
  uint64_t total = 0;  // every byte written
};

// Plans the tensor files: the groups, each file's name and prefix, the sizes (checked)
// and the index's weight map. Refuses a tensor named '__metadata__'.
Status PlanTensorFiles(const Checkpoint& checkpoint, const PersistOptions& options,
                       const std::map<std::string, std::string>& metadata, PersistPlan& plan,
                       nlohmann::ordered_json& weight_map) {
  const std::vector<TensorInfo>& tensors = checkpoint.tensors();
  for (const TensorInfo& t : tensors) {
    if (__builtin_add_overflow(plan.data_total, t.nbytes, &plan.data_total)) {
      return InvalidArgument("tensor sizes overflow 64 bits");
    }
    if (t.name == "__metadata__") {
      return Corrupt("'" + checkpoint.name() + "' has a tensor named '__metadata__', which safetensors reserves");
    }
  }
  plan.groups = PlanFiles(tensors, options.max_shard_bytes);
  plan.sharded = plan.groups.size() > 1;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    PlannedFile f;
    f.name = plan.sharded ? ShardName(g, plan.groups.size()) : kSingleFile;
    CKPT_ASSIGN_OR_RETURN(f.prefix, Prefix(tensors, plan.groups[g], metadata, &f.data_bytes));
    for (size_t i : plan.groups[g]) weight_map[tensors[i].name] = f.name;
    uint64_t size = f.prefix.size();
    if (__builtin_add_overflow(size, f.data_bytes, &size) || __builtin_add_overflow(plan.total, size, &plan.total)) {
      return InvalidArgument("file sizes overflow 64 bits");
    }
    plan.files.push_back(std::move(f));
  }
  return Status::Ok();
}

// The index of a sharded checkpoint: its metadata with "total_size", and the weight map.
Status PlanIndex(const std::map<std::string, std::string>& metadata, const nlohmann::ordered_json& weight_map,
                 PersistPlan& plan) {
  nlohmann::ordered_json md = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) md[k] = v;
  md["total_size"] = plan.data_total;
  nlohmann::ordered_json doc = {{"metadata", md}, {"weight_map", weight_map}};
  try {
    plan.index = doc.dump(2, ' ', false, nlohmann::json::error_handler_t::strict) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(std::string("a tensor name or metadata value is not valid UTF-8: ") + e.what());
  }
  plan.total += plan.index.size();
  return Status::Ok();
}

// The side files: named by publish's rule, none named like another file of the folder.
Status PlanSideFiles(const Checkpoint& checkpoint, PersistPlan& plan) {
  std::set<std::string> taken;
  for (const PlannedFile& f : plan.files) taken.insert(f.name);
  if (plan.sharded) taken.insert(kIndexFile);
  plan.side_names = checkpoint.side_files();
  for (const std::string& n : plan.side_names) {
    if (Status named = CheckSideFileName(n); !named.ok()) {  // the rule publish applies
      return Corrupt("'" + checkpoint.name() + "' cannot be written beside its tensors: " + named.message());
    }
    if (!taken.insert(n).second) {
      return Corrupt("'" + checkpoint.name() + "' has two side files named '" + n + "'");
    }
    CKPT_ASSIGN_OR_RETURN(std::string_view bytes, checkpoint.SideFile(n));
    plan.side_bytes.push_back(bytes);
    plan.total += bytes.size();
  }
  return Status::Ok();
}

// The whole plan, in that order (files, index, side files).
Result<PersistPlan> PlanPersist(const Checkpoint& checkpoint, const PersistOptions& options) {
  PersistPlan plan;
  const std::map<std::string, std::string> metadata = FileMetadata(checkpoint.metadata());
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  CKPT_RETURN_IF_ERROR(PlanTensorFiles(checkpoint, options, metadata, plan, weight_map));
  if (plan.sharded) CKPT_RETURN_IF_ERROR(PlanIndex(metadata, weight_map, plan));
  CKPT_RETURN_IF_ERROR(PlanSideFiles(checkpoint, plan));
  return plan;
}

// Writes the planned files into the staging folder (tensor files, index, side files, each
// fsynced) and fsyncs the folder, listing each file in `result` once written.
Status WritePlannedFiles(const Checkpoint& checkpoint, const PersistPlan& plan, const StagingDir& staging,
                         Progress* progress, PersistResult& result) {
  const std::vector<TensorInfo>& tensors = checkpoint.tensors();
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const PlannedFile& f = plan.files[g];
    const uint64_t size = f.prefix.size() + f.data_bytes;
    CKPT_ASSIGN_OR_RETURN(UniqueFd fd, CreateFile(staging.fd(), f.name, size));
    uint64_t written = 0, flushed = 0;
    CKPT_RETURN_IF_ERROR(WriteAll(fd.get(), reinterpret_cast<const std::byte*>(f.prefix.data()), f.prefix.size(),
                                  f.name, progress, true, &written, &flushed));
    for (size_t i : plan.groups[g]) {
      CKPT_ASSIGN_OR_RETURN(const std::byte* data, checkpoint.TensorData(tensors[i].name));
      CKPT_RETURN_IF_ERROR(WriteAll(fd.get(), data, tensors[i].nbytes, f.name, progress, true, &written, &flushed));
    }
    CKPT_RETURN_IF_ERROR(FinishFile(std::move(fd), f.name, written, size));
    result.files.push_back(f.name);
    if (!progress->Report(true)) return Cancelled("persist cancelled");  // each file done, whatever the clock
  }
  if (plan.sharded) {
    CKPT_RETURN_IF_ERROR(WriteSmallFile(staging.fd(), kIndexFile, plan.index, progress));
    result.files.push_back(kIndexFile);
  }
  for (size_t s = 0; s < plan.side_names.size(); ++s) {
    CKPT_RETURN_IF_ERROR(WriteSmallFile(staging.fd(), plan.side_names[s], plan.side_bytes[s], progress));
    result.side_files.push_back(plan.side_names[s]);
  }
  if (::fsync(staging.fd()) != 0) return ErrnoError("cannot fsync '" + staging.name() + "'", errno);
  return Status::Ok();
}

// Into place: a new name, or an atomic exchange with the folder that is there (checked
// again: it may have appeared, or changed, while we wrote). The staging folder is gone
// (removed, or renamed to `dir`) when this returns Ok.
Status MoveIntoPlace(int parent_fd, const std::string& parent, const std::string& base, const std::string& dir,
                     const PersistOptions& options, std::unique_ptr<StagingDir>& staging) {
  mode_t old_mode = 0;
  CKPT_ASSIGN_OR_RETURN(Existing now, InspectDestination(parent_fd, base, dir, options.replace, &old_mode));
  if (now == Existing::kAbsent) {
    if (::renameat2(parent_fd, staging->name().c_str(), parent_fd, base.c_str(), RENAME_NOREPLACE) != 0) {
      return ErrnoError("cannot rename the new folder to '" + dir + "'", errno);
    }
    staging->Keep();
  } else {
    if (::renameat2(parent_fd, staging->name().c_str(), parent_fd, base.c_str(), RENAME_EXCHANGE) != 0) {
      return ErrnoError("cannot exchange the new folder with '" + dir + "'", errno);
    }
    // The staging name now holds the old files: its destructor removes them.
  }
  if (::fsync(parent_fd) != 0) return ErrnoError("cannot fsync '" + parent + "'", errno);
  staging.reset();
  if (now != Existing::kAbsent) (void)::fsync(parent_fd);
  return Status::Ok();
}

Result<PersistResult> PersistImpl(const Checkpoint& checkpoint, const std::string& dir, const PersistOptions& options,
                                  Progress** progress_out, std::unique_ptr<Progress>* progress_owner) {
  const auto start = Clock::now();
  if (options.max_shard_bytes == 0) return InvalidArgument("max_shard_bytes must be > 0");
  if (options.expected_generation != 0 && checkpoint.generation() != options.expected_generation) {
    return FailedPrecondition("'" + checkpoint.name() + "' is now at generation " +
                              std::to_string(checkpoint.generation()) + ", not " +
                              std::to_string(options.expected_generation));
  }
  std::string parent, base;
  CKPT_RETURN_IF_ERROR(SplitDir(dir, &parent, &base));
  UniqueFd parent_fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent_fd.valid()) return ErrnoError("cannot open the folder '" + parent + "'", errno);
  mode_t old_mode = 0;
  CKPT_ASSIGN_OR_RETURN(Existing existing, InspectDestination(parent_fd.get(), base, dir, options.replace, &old_mode));
  CKPT_ASSIGN_OR_RETURN(const PersistPlan plan, PlanPersist(checkpoint, options));

  *progress_owner = std::make_unique<Progress>(options.progress, plan.total);
  Progress* progress = progress_owner->get();
  *progress_out = progress;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StagingDir> staging, StagingDir::Create(parent_fd.get(), parent, base));
  if (existing != Existing::kAbsent && ::fchmod(staging->fd(), old_mode) != 0) {
    return ErrnoError("cannot set the mode of '" + staging->name() + "'", errno);
  }
  if (!progress->Report(true)) return Cancelled("persist cancelled");

  PersistResult result;
  result.name = checkpoint.name();
  result.generation = checkpoint.generation();
  result.dir = dir;
  result.tensor_count = checkpoint.tensors().size();
  result.data_bytes = plan.data_total;
  CKPT_RETURN_IF_ERROR(WritePlannedFiles(checkpoint, plan, *staging, progress, result));
  if (!progress->Report(true)) return Cancelled("persist cancelled");
  CKPT_RETURN_IF_ERROR(MoveIntoPlace(parent_fd.get(), parent, base, dir, options, staging));
  result.bytes_written = progress->done();
  progress->Report(true);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace

Result<PersistResult> Persist(const Checkpoint& checkpoint, const std::string& dir, const PersistOptions& options) {
  Progress* progress = nullptr;
  std::unique_ptr<Progress> owner;
  Result<PersistResult> r = PersistImpl(checkpoint, dir, options, &progress, &owner);
  // Everything is cleaned up by now; an exception from the callback goes to the caller.
  if (progress && progress->error()) std::rethrow_exception(progress->error());
  return r;
}

Result<PersistResult> Persist(Client& client, const std::string& name, const std::string& dir,
                              const PersistOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, client.Attach(name));
  return Persist(*checkpoint, dir, options);
}

}  // namespace ckpt

namespace ckpt {

nlohmann::json EncodePersistResult(const PersistResult& r) {
  return {{"name", r.name},
          {"generation", r.generation},
          {"dir", r.dir},
          {"files", r.files},
          {"side_files", r.side_files},
          {"tensor_count", r.tensor_count},
          {"data_bytes", r.data_bytes},
          {"bytes_written", r.bytes_written},
          {"seconds", r.seconds}};
}

}  // namespace ckpt

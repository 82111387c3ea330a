#include "format/checkpoint_formats.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/io.h"
#include "format/pytorch_zip.h"
#include "format/safetensors.h"
#include "format/sharded_index.h"

namespace ckpt::format {
namespace {

enum class Kind { kSafetensors, kZip, kLegacyPickle, kJson, kUnknown };

Kind Sniff(const unsigned char* head, size_t n) {
  if (n >= 9 && head[8] == '{') return Kind::kSafetensors;
  if (n >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return Kind::kZip;
  // Legacy torch.save: a pickle (PROTO 2..5) whose first object is the LONG1 magic number.
  if (n >= 3 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5 && head[2] == 0x8a) return Kind::kLegacyPickle;
  size_t i = 0;
  while (i < n && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t')) ++i;
  if (i < n && head[i] == '{') return Kind::kJson;
  return Kind::kUnknown;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<Kind> SniffFile(const std::string& path, uint64_t size) {
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, OpenForRead(path));
  unsigned char head[16] = {};
  const size_t n = std::min<uint64_t>(sizeof(head), size);
  CKPT_RETURN_IF_ERROR(PreadFull(fd.get(), head, n, 0, path));
  return Sniff(head, n);
}

// Plans one shard of a sharded checkpoint, which must be a single-file format.
Status PlanShard(const std::string& path, LoadPlan* plan) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return NotFound("shard " + path + " does not exist");
  if (!S_ISREG(st.st_mode)) return Corrupt("shard " + path + " is not a regular file");
  CKPT_ASSIGN_OR_RETURN(Kind kind, SniffFile(path, static_cast<uint64_t>(st.st_size)));
  if (kind == Kind::kZip) return PlanPyTorchZipFile(path, plan);
  if (kind == Kind::kLegacyPickle) return Unsupported(path + ": legacy (non-zip) torch.save format is not supported");
  return PlanSafetensorsFile(path, plan);
}

Result<LoadPlan> PlanFile(const std::string& path, uint64_t size, const FileGate& may_open) {
  if (may_open) CKPT_RETURN_IF_ERROR(may_open(path));
  CKPT_ASSIGN_OR_RETURN(Kind kind, SniffFile(path, size));
  // A JSON index may start with bytes that also look like a safetensors length prefix.
  if (EndsWith(path, ".json") && kind == Kind::kSafetensors) {
    CKPT_ASSIGN_OR_RETURN(UniqueFd fd, OpenForRead(path));
    char first = 0;
    CKPT_RETURN_IF_ERROR(PreadFull(fd.get(), &first, 1, 0, path));
    if (first == '{') kind = Kind::kJson;
  }
  LoadPlan plan;
  switch (kind) {
    case Kind::kSafetensors:
      CKPT_RETURN_IF_ERROR(PlanSafetensorsFile(path, &plan));
      return plan;
    case Kind::kZip:
      CKPT_RETURN_IF_ERROR(PlanPyTorchZipFile(path, &plan));
      return plan;
    case Kind::kLegacyPickle:
      return Unsupported(path + ": legacy (non-zip) torch.save format is not supported; re-save it with a "
                                "PyTorch >= 1.6 torch.save (zip) or as safetensors");
    case Kind::kJson:
      CKPT_RETURN_IF_ERROR(PlanShardedCheckpoint(
          path,
          [&may_open](const std::string& shard, LoadPlan* p) {
            if (may_open) CKPT_RETURN_IF_ERROR(may_open(shard));
            return PlanShard(shard, p);
          },
          &plan));
      plan.format += "-sharded";
      return plan;
    case Kind::kUnknown:
      break;
  }
  if (size < 9) return Corrupt(path + ": too short to be a checkpoint (" + std::to_string(size) + " bytes)");
  // Looks like nothing known: report it as a safetensors problem if the name says so.
  if (EndsWith(path, ".safetensors")) {
    CKPT_RETURN_IF_ERROR(PlanSafetensorsFile(path, &plan));
    return plan;
  }
  return Unsupported(path + ": unrecognised checkpoint format");
}

}  // namespace

Result<LoadPlan> PlanCheckpoint(const std::string& path, const FileGate& may_open) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound("no such file or directory: " + path);
    return ErrnoError("cannot stat " + path, errno);
  }
  if (!S_ISDIR(st.st_mode)) return PlanFile(path, static_cast<uint64_t>(st.st_size), may_open);

  static const char* const kCandidates[] = {"model.safetensors", "model.safetensors.index.json",
                                            "pytorch_model.bin", "pytorch_model.bin.index.json"};
  const std::string dir = EndsWith(path, "/") ? path : path + "/";
  std::string looked;
  for (const char* name : kCandidates) {
    struct stat f;
    if (::stat((dir + name).c_str(), &f) == 0 && S_ISREG(f.st_mode)) {
      return PlanFile(dir + name, static_cast<uint64_t>(f.st_size), may_open);
    }
    looked += looked.empty() ? name : std::string(", ") + name;
  }
  return NotFound(path + " is a directory without a checkpoint: looked for " + looked);
}

}  // namespace ckpt::format

#include "format/checkpoint_formats.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/io.h"
#include "format/safetensors.h"

namespace ckpt::format {
namespace {

enum class Kind { kSafetensors, kZip, kLegacyPickle, kUnknown };

Kind Sniff(const unsigned char* head, size_t n) {
  if (n >= 9 && head[8] == '{') return Kind::kSafetensors;
  if (n >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return Kind::kZip;
  // Legacy torch.save: a pickle (PROTO 2..5) whose first object is the LONG1 magic number.
  if (n >= 3 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5 && head[2] == 0x8a) return Kind::kLegacyPickle;
  return Kind::kUnknown;
}

}  // namespace

Result<LoadPlan> PlanCheckpoint(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFound("no such file or directory: " + path);
    return ErrnoError("cannot stat " + path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    return Unsupported(path + " is a directory; model folders are not supported yet, name a file");
  }
  CKPT_ASSIGN_OR_RETURN(UniqueFd fd, OpenForRead(path));
  unsigned char head[16] = {};
  const size_t n = std::min<uint64_t>(sizeof(head), static_cast<uint64_t>(st.st_size));
  CKPT_RETURN_IF_ERROR(PreadFull(fd.get(), head, n, 0, path));
  LoadPlan plan;
  switch (Sniff(head, n)) {
    case Kind::kSafetensors:
      CKPT_RETURN_IF_ERROR(PlanSafetensorsFile(path, &plan));
      return plan;
    case Kind::kZip:
      return Unsupported(path + ": PyTorch zip checkpoints (torch.save) are not supported yet");
    case Kind::kLegacyPickle:
      return Unsupported(path + ": legacy (non-zip) torch.save format is not supported");
    case Kind::kUnknown:
      break;
  }
  if (n < 9) return Corrupt(path + ": too short to be a checkpoint (" + std::to_string(n) + " bytes)");
  // Looks like nothing known: report it as a safetensors problem if the name says so.
  if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) {
    CKPT_RETURN_IF_ERROR(PlanSafetensorsFile(path, &plan));
    return plan;
  }
  return Unsupported(path + ": unrecognised checkpoint format");
}

}  // namespace ckpt::format

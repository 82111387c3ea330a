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

Result<Kind> SniffFile(const OpenedFile& file) {
  unsigned char head[16] = {};
  const size_t n = std::min<uint64_t>(sizeof(head), file.identity.size);
  CKPT_RETURN_IF_ERROR(PreadFull(file.fd.get(), head, n, 0, file.path));
  return Sniff(head, n);
}

// Plans one shard of a sharded checkpoint, which must be a single-file format.
Status PlanShard(const std::shared_ptr<const OpenedFile>& file, LoadPlan* plan) {
  CKPT_ASSIGN_OR_RETURN(Kind kind, SniffFile(*file));
  if (kind == Kind::kZip) return PlanPyTorchZipFile(file, plan);
  if (kind == Kind::kLegacyPickle) return Unsupported(file->path + ": legacy (non-zip) torch.save format is not supported");
  return PlanSafetensorsFile(file, plan);
}

Status PlanFile(const CheckpointLocation& loc, const std::shared_ptr<const OpenedFile>& file, LoadPlan* plan) {
  const std::string& path = file->path;
  const uint64_t size = file->identity.size;
  CKPT_ASSIGN_OR_RETURN(Kind kind, SniffFile(*file));
  // A JSON index may start with bytes that also look like a safetensors length prefix.
  if (EndsWith(path, ".json") && kind == Kind::kSafetensors) {
    char first = 0;
    CKPT_RETURN_IF_ERROR(PreadFull(file->fd.get(), &first, 1, 0, path));
    if (first == '{') kind = Kind::kJson;
  }
  switch (kind) {
    case Kind::kSafetensors:
      return PlanSafetensorsFile(file, plan);
    case Kind::kZip:
      return PlanPyTorchZipFile(file, plan);
    case Kind::kLegacyPickle:
      return Unsupported(path + ": legacy (non-zip) torch.save format is not supported; re-save it with a "
                                "PyTorch >= 1.6 torch.save (zip) or as safetensors");
    case Kind::kJson:
      CKPT_RETURN_IF_ERROR(PlanShardedCheckpoint(
          *file,
          [&loc](const std::string& shard, LoadPlan* p) -> Status {
            auto opened = loc.OpenMember(shard);
            if (!opened.ok()) return opened.status().WithContext("shard " + shard);
            return PlanShard(*opened, p);
          },
          plan));
      plan->format += "-sharded";
      return Status::Ok();
    case Kind::kUnknown:
      break;
  }
  if (size < 9) return Corrupt(path + ": too short to be a checkpoint (" + std::to_string(size) + " bytes)");
  // Looks like nothing known: report it as a safetensors problem if the name says so.
  if (EndsWith(path, ".safetensors")) return PlanSafetensorsFile(file, plan);
  return Unsupported(path + ": unrecognised checkpoint format");
}

// Reads the folder's side files into plan->side_files (see PlanCheckpoint).
Status ReadSideFiles(const CheckpointLocation& loc, LoadPlan* plan) {
  for (const char* name : kSideFileNames) {
    auto file = loc.OpenMember(name);
    if (!file.ok()) {
      if (file.status().code() != StatusCode::kNotFound) {
        plan->notes.push_back(std::string("side file ") + name + " skipped: " + file.status().message());
      }
      continue;
    }
    const OpenedFile& f = **file;
    if (f.identity.size > kMaxSideFileBytes) {
      plan->notes.push_back(std::string("side file ") + name + " skipped: " + std::to_string(f.identity.size) +
                            " bytes, more than the limit of " + std::to_string(kMaxSideFileBytes));
      continue;
    }
    SideFile side;
    side.name = name;
    side.bytes.resize(f.identity.size);
    CKPT_RETURN_IF_ERROR(PreadFull(f.fd.get(), side.bytes.data(), side.bytes.size(), 0, f.path));
    CKPT_RETURN_IF_ERROR(f.CheckUnchanged());
    plan->side_files.push_back(std::move(side));
  }
  return Status::Ok();
}

}  // namespace

Result<LoadPlan> PlanCheckpoint(const CheckpointLocation& location) {
  LoadPlan plan;
  if (location.file) {
    CKPT_RETURN_IF_ERROR(PlanFile(location, location.file, &plan));
  } else {
    static const char* const kCandidates[] = {"model.safetensors", "model.safetensors.index.json",
                                              "pytorch_model.bin", "pytorch_model.bin.index.json"};
    std::string looked;
    bool planned = false;
    for (const char* name : kCandidates) {
      auto file = location.OpenMember(name);
      if (file.ok()) {
        CKPT_RETURN_IF_ERROR(PlanFile(location, *file, &plan));
        planned = true;
        break;
      }
      if (file.status().code() != StatusCode::kNotFound) return file.status();
      looked += looked.empty() ? name : std::string(", ") + name;
    }
    if (!planned) return NotFound(location.path + " is a directory without a checkpoint: looked for " + looked);
  }
  CKPT_RETURN_IF_ERROR(ReadSideFiles(location, &plan));
  CKPT_RETURN_IF_ERROR(ValidatePlan(plan));
  return plan;
}

Result<LoadPlan> PlanCheckpoint(const std::string& path) {
  auto location = LocateUnrestricted(path);
  if (!location.ok()) {
    if (location.status().code() == StatusCode::kNotFound) return NotFound("no such file or directory: " + path);
    return location.status();
  }
  return PlanCheckpoint(*location);
}

}  // namespace ckpt::format

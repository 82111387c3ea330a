// What a checkpoint format parser produces: which bytes of which files hold each tensor.
// The loader turns a LoadPlan into a shared-memory segment; parsers never allocate data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"
#include "common/opened_file.h"

namespace ckpt::format {

struct PlannedTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint32_t file_index = 0;   // into LoadPlan::files
  uint64_t file_offset = 0;  // first byte of the tensor in that file
  uint64_t nbytes = 0;       // bytes of the tensor (contiguous, row-major) in the segment
  // A non-contiguous view (PyTorch): when `strides` is non-empty (one per dim, in
  // elements, >= 0), the tensor's elements are at file_offset + sum(i_d * strides[d]) *
  // dtype size; the loader reads the `source_bytes` bytes at file_offset that cover them
  // and gathers them into row-major order. Empty: the nbytes at file_offset are the tensor.
  std::vector<int64_t> strides;
  uint64_t source_bytes = 0;
  // Index into LoadPlan::tensors of an earlier tensor with the same dtype, shape and
  // bytes (tied weights): this one is stored once, sharing that tensor's data. -1: none.
  int64_t alias_of = -1;
};

// A small file kept beside the tensors (config.json, ...): its name in the model folder
// and its whole content, read through its descriptor at plan time.
struct SideFile {
  std::string name;
  std::string bytes;
};

// Side files taken from a checkpoint's folder, in this order, when present as regular
// files (never through a symlink) of at most kMaxSideFileBytes each.
inline constexpr const char* kSideFileNames[] = {"config.json", "generation_config.json", "tokenizer_config.json",
                                                 "special_tokens_map.json", "preprocessor_config.json"};
inline constexpr uint64_t kMaxSideFileBytes = 1ull << 20;

// Default limit on bytes in shared memory per byte of checkpoint file (see CheckExpansion).
inline constexpr double kDefaultMaxExpansion = 16.0;
// Expansion below this many bytes beyond the files' size is always allowed.
inline constexpr uint64_t kExpansionSlackBytes = 64ull << 20;

// A byte range of a plan's file whose CRC-32 is known (a zip member: PyTorch checkpoints):
// the loader computes it over the bytes it read and fails the load, naming `member`, if it
// differs. Ranges are disjoint.
struct CrcCheck {
  uint32_t file_index = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
  std::string member;  // the zip member's name, for the error
};

struct LoadPlan {
  std::string format;  // "safetensors", ...
  // Every file the tensors are read from, opened once; the loader reads only these
  // descriptors and checks each file's identity after reading (OpenedFile::CheckUnchanged).
  std::vector<std::shared_ptr<const OpenedFile>> files;
  std::vector<PlannedTensor> tensors;
  std::vector<SideFile> side_files;             // kSideFileNames found in the folder
  std::map<std::string, std::string> metadata;  // safetensors __metadata__, an index's "metadata"
  std::vector<std::string> notes;               // side files skipped and why, for the log
  std::vector<CrcCheck> crc_checks;             // checked while the tensors' bytes are read

  // Bytes stored (aliases counted once); InvalidArgument if the sum overflows 64 bits.
  Result<uint64_t> StoredBytes() const;
  // StoredBytes(), or UINT64_MAX if it overflows (for reports; use StoredBytes to decide).
  uint64_t TotalBytes() const;
  // Sum of the files' sizes at open (saturating).
  uint64_t FileBytes() const;
};

// Is `s` well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF)?
bool IsValidUtf8(const std::string& s);

// The checks every plan passes before a segment is created, whatever its format: each
// tensor name is 1 to shm::kMaxNameBytes bytes of valid UTF-8 without NUL, names are
// unique, file indexes and aliases are in range, each tensor's nbytes matches its shape
// and dtype and (with strides) its view stays within source_bytes, computed with checked
// arithmetic, and the stored total does not overflow. InvalidArgument naming the first
// offending tensor (its name escaped when it is not printable).
Status ValidatePlan(const LoadPlan& plan);

// Refuses an absurd expansion: more than `max_expansion` bytes stored in shared memory per
// byte of file and more than kExpansionSlackBytes beyond the files' size (stride-0 views
// repeat one element many times; aliases count once). max_expansion <= 0 disables it.
// InvalidArgument saying how to allow it otherwise.
Status CheckExpansion(const LoadPlan& plan, double max_expansion);

// `name` with bytes outside printable ASCII written as \xNN, cut to about 200 bytes.
std::string EscapedName(const std::string& name);

}  // namespace ckpt::format

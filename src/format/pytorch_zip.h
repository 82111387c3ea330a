// Parser for PyTorch zip checkpoints (torch.save, the default since PyTorch 1.6): a zip
// archive of <archive>/data.pkl (the pickled state dict), <archive>/data/<key> (raw
// storage bytes, one record per storage), <archive>/byteorder and <archive>/version.
// The plan points at the storages' byte ranges inside the archive; nothing is copied.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ckpt/status.h"
#include "format/load_plan.h"
#include "format/zip_reader.h"

namespace ckpt::format {

// Largest data.pkl read (the pickle holds only metadata).
inline constexpr uint64_t kMaxPickleBytes = 256ull << 20;

// Reads the PyTorch zip checkpoint at `path` and appends its tensors to `plan` (and the
// file to plan->files) only if the whole checkpoint is valid; `plan` is unchanged on error.
// Contiguous tensors point straight at their bytes; views get strides and source_bytes;
// tensors that are the same view of the same storage (tied weights) become aliases of
// the first one. Errors: NotFound/IoError for the file; Corrupt for a malformed archive,
// a missing storage record, a view beyond its storage, or a data.pkl or byteorder whose
// bytes disagree with their CRC-32 (the storages' CRCs go to plan->crc_checks: the loader
// checks them while it reads); Unsupported for a big-endian
// checkpoint, compressed entries, a pickle that is not a flat state dict or that names a
// global outside the allow-list (see unpickler.h).
Status PlanPyTorchZipFile(const std::shared_ptr<const OpenedFile>& file, LoadPlan* plan);

// The one message for a zip member whose bytes disagree with their CRC-32 (plan time and load time).
std::string CrcMismatch(const std::string& path, const std::string& member, uint32_t computed, uint32_t stored);
// The same for `path`, opened without following a final symlink (tests and tools).
Status PlanPyTorchZipFile(const std::string& path, LoadPlan* plan);

}  // namespace ckpt::format

// ZipReader: the central directory of a zip archive as PyTorch's torch.save writes it
// (entries STORED, uncompressed, data 64-byte aligned; ZIP64 for large archives). It only
// locates entries: each entry's data is a byte range of the archive that callers pread
// themselves. Nothing is decompressed: callers refuse the entries they need that are not
// stored() (compressed or encrypted), and can ignore the others.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/status.h"

namespace ckpt::format {

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;  // first byte of the entry's data in the archive
  uint64_t size = 0;         // bytes of data in the archive (compressed size if compressed)
  uint16_t method = 0;       // zip compression method (0: STORED)
  uint32_t crc32 = 0;        // the CRC-32 of the content, from the central directory
  bool encrypted = false;
  // True if the data bytes are the content itself (STORED, not encrypted).
  bool stored() const { return method == 0 && !encrypted; }
};

class ZipReader {
 public:
  // Reads exactly `size` bytes at `offset` of the archive into `buf`; Corrupt past the end.
  using ReadAt = std::function<Status(void* buf, size_t size, uint64_t offset)>;

  // Most entries accepted and largest central directory read (bounds for hostile files).
  static constexpr uint64_t kMaxEntries = 1u << 20;
  static constexpr uint64_t kMaxDirectoryBytes = 256ull << 20;

  // Parses the end-of-central-directory record (ZIP64 aware), the central directory and
  // every entry's local header, through `read` over an archive of `archive_bytes` bytes.
  // Errors: Corrupt for anything malformed (truncated records, ranges beyond the archive,
  // overlapping data, duplicate names), Unsupported for multi-disk archives, naming
  // `label` (a path, for messages). `read` is not kept.
  static Result<std::unique_ptr<ZipReader>> Create(const ReadAt& read, uint64_t archive_bytes,
                                                   const std::string& label);

  // Entries in central-directory order.
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // The entry named `name`, or nullptr.
  const ZipEntry* Find(const std::string& name) const;

 private:
  ZipReader() = default;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace ckpt::format

#include "format/zip_reader.h"

#include <algorithm>
#include <cstring>

namespace ckpt::format {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr size_t kEocdBytes = 22;
constexpr size_t kCentralBytes = 46;
constexpr size_t kLocalBytes = 30;

uint16_t U16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t U32(const unsigned char* p) { return U16(p) | (static_cast<uint32_t>(U16(p + 2)) << 16); }
uint64_t U64(const unsigned char* p) { return U32(p) | (static_cast<uint64_t>(U32(p + 4)) << 32); }

Status Bad(const std::string& label, const std::string& what) { return Corrupt(label + ": zip archive: " + what); }
Status MultiDisk(const std::string& label) { return Unsupported(label + ": multi-disk zip archives are not supported"); }

// Where the central directory is and how many entries it holds (from the EOCD or its
// ZIP64 record), not yet checked against the archive.
struct DirectoryLocation {
  uint64_t count, dir_size, dir_offset;
};

// Reads the ZIP64 EOCD record through the 20-byte locator right before the EOCD at
// `eocd_offset`, and takes the directory's location from it.
Status ReadZip64Location(const ZipReader::ReadAt& read, uint64_t eocd_offset, const std::string& label,
                         DirectoryLocation& at) {
  if (eocd_offset < 20) return Bad(label, "ZIP64 locator missing");
  unsigned char loc[20];
  CKPT_RETURN_IF_ERROR(read(loc, sizeof(loc), eocd_offset - 20));
  if (U32(loc) != kZip64LocatorSig) return Bad(label, "ZIP64 locator missing");
  const uint64_t rec_offset = U64(loc + 8);
  if (rec_offset > eocd_offset || eocd_offset - rec_offset < 56) return Bad(label, "ZIP64 record out of range");
  unsigned char rec[56];
  CKPT_RETURN_IF_ERROR(read(rec, sizeof(rec), rec_offset));
  if (U32(rec) != kZip64EocdSig) return Bad(label, "bad ZIP64 end-of-directory signature");
  if (U32(rec + 16) != 0 || U32(rec + 20) != 0) return MultiDisk(label);
  at.count = U64(rec + 32);
  at.dir_size = U64(rec + 40);
  at.dir_offset = U64(rec + 48);
  return Status::Ok();
}

// Finds the EOCD record (the last 22 bytes plus a comment of up to 64 KiB: scanned
// backwards), follows it to ZIP64 when its fields are saturated, and checks the
// directory's location against the limits and the archive.
Result<DirectoryLocation> LocateDirectory(const ZipReader::ReadAt& read, uint64_t archive_bytes,
                                          const std::string& label) {
  if (archive_bytes < kEocdBytes) return Bad(label, "too short for an end-of-directory record");
  const uint64_t tail_bytes = std::min<uint64_t>(archive_bytes, kEocdBytes + 0xffff);
  std::vector<unsigned char> tail(tail_bytes);
  CKPT_RETURN_IF_ERROR(read(tail.data(), tail.size(), archive_bytes - tail_bytes));
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail_bytes - kEocdBytes); i >= 0; --i) {
    if (U32(&tail[i]) == kEocdSig && U16(&tail[i + 20]) == tail_bytes - i - kEocdBytes) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) return Bad(label, "no end-of-central-directory record");
  const unsigned char* e = &tail[eocd];
  const uint64_t eocd_offset = archive_bytes - tail_bytes + eocd;
  if (U16(e + 4) != 0 || U16(e + 6) != 0) return MultiDisk(label);
  DirectoryLocation at{U16(e + 10), U32(e + 12), U32(e + 16)};
  if (at.count == 0xffff || at.dir_size == 0xffffffff || at.dir_offset == 0xffffffff) {
    CKPT_RETURN_IF_ERROR(ReadZip64Location(read, eocd_offset, label, at));
  }
  if (at.count > ZipReader::kMaxEntries) return Bad(label, std::to_string(at.count) + " entries, more than the limit");
  if (at.dir_size > ZipReader::kMaxDirectoryBytes) return Bad(label, "central directory larger than the limit");
  if (at.dir_offset > archive_bytes || at.dir_size > archive_bytes - at.dir_offset) {
    return Bad(label, "central directory out of range");
  }
  if (at.count > at.dir_size / kCentralBytes) return Bad(label, "central directory too small for its entry count");
  return at;
}

// Applies the ZIP64 extended information of an entry's extra field `x` (only the fields
// that are all-ones, in this order: uncompressed size, compressed size, local offset).
Status ApplyZip64Extra(const unsigned char* x, size_t extra_len, const std::string& name, const std::string& label,
                       uint64_t* usize, uint64_t* csize, uint64_t* local) {
  for (size_t xp = 0; xp + 4 <= extra_len;) {
    const uint16_t id = U16(x + xp), len = U16(x + xp + 2);
    if (len > extra_len - xp - 4) return Bad(label, "entry '" + name + "' has a malformed extra field");
    if (id == 0x0001) {
      const unsigned char* z = x + xp + 4;
      size_t left = len;
      auto take = [&](uint64_t* field) -> bool {
        if (*field != 0xffffffff) return true;
        if (left < 8) return false;
        *field = U64(z);
        z += 8;
        left -= 8;
        return true;
      };
      if (!take(usize) || !take(csize) || !take(local)) {
        return Bad(label, "entry '" + name + "' has a short ZIP64 extra field");
      }
    }
    xp += 4 + len;
  }
  return Status::Ok();
}

// Parses central directory entry `i` at `*pos` of `dir` and its local header (the data
// must lie in the archive), and moves `*pos` past the entry.
Result<ZipEntry> ParseEntry(const ZipReader::ReadAt& read, uint64_t archive_bytes, const std::string& label,
                            const std::vector<unsigned char>& dir, uint64_t i, size_t* pos) {
  const uint64_t dir_size = dir.size();
  if (dir_size - *pos < kCentralBytes || U32(&dir[*pos]) != kCentralSig) {
    return Bad(label, "central directory entry " + std::to_string(i) + " is malformed");
  }
  const unsigned char* c = &dir[*pos];
  const uint16_t flags = U16(c + 8), method = U16(c + 10);
  const uint32_t crc = U32(c + 16);
  uint64_t csize = U32(c + 20), usize = U32(c + 24);
  const size_t name_len = U16(c + 28), extra_len = U16(c + 30), comment_len = U16(c + 32);
  const uint16_t disk = U16(c + 34);
  uint64_t local = U32(c + 42);
  if (dir_size - *pos - kCentralBytes < name_len + extra_len + comment_len) {
    return Bad(label, "central directory entry " + std::to_string(i) + " runs past the directory");
  }
  std::string name(reinterpret_cast<const char*>(c + kCentralBytes), name_len);
  CKPT_RETURN_IF_ERROR(ApplyZip64Extra(c + kCentralBytes + name_len, extra_len, name, label, &usize, &csize, &local));
  if (method == 0 && csize != usize) {
    return Bad(label, "stored entry '" + name + "' has different compressed and uncompressed sizes");
  }
  if (disk != 0 && disk != 0xffff) return MultiDisk(label);
  if (local > archive_bytes || archive_bytes - local < kLocalBytes) return Bad(label, "entry '" + name + "' out of range");
  unsigned char lh[kLocalBytes];
  CKPT_RETURN_IF_ERROR(read(lh, sizeof(lh), local));
  if (U32(lh) != kLocalSig) return Bad(label, "entry '" + name + "' has no local header");
  const uint64_t data = local + kLocalBytes + U16(lh + 26) + U16(lh + 28);
  if (data > archive_bytes || csize > archive_bytes - data) {
    return Bad(label, "entry '" + name + "' data runs past the end of the archive");
  }
  *pos += kCentralBytes + name_len + extra_len + comment_len;
  return ZipEntry{std::move(name), data, csize, method, crc, (flags & 0x1) != 0};
}

// Stored data ranges must not overlap one another (a crafted archive could alias them).
Status CheckNoOverlap(const std::vector<ZipEntry>& entries, const std::string& label) {
  std::vector<const ZipEntry*> sorted;
  for (const auto& en : entries) sorted.push_back(&en);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->data_offset < b->data_offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->data_offset + sorted[i - 1]->size > sorted[i]->data_offset) {
      return Bad(label, "entries '" + sorted[i - 1]->name + "' and '" + sorted[i]->name + "' overlap");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ZipReader>> ZipReader::Create(const ReadAt& read, uint64_t archive_bytes,
                                                     const std::string& label) {
  CKPT_ASSIGN_OR_RETURN(const DirectoryLocation at, LocateDirectory(read, archive_bytes, label));
  std::vector<unsigned char> dir(at.dir_size);
  if (at.dir_size > 0) CKPT_RETURN_IF_ERROR(read(dir.data(), dir.size(), at.dir_offset));
  std::unique_ptr<ZipReader> zip(new ZipReader());
  zip->entries_.reserve(at.count);
  size_t pos = 0;
  for (uint64_t i = 0; i < at.count; ++i) {
    CKPT_ASSIGN_OR_RETURN(ZipEntry entry, ParseEntry(read, archive_bytes, label, dir, i, &pos));
    if (!zip->by_name_.emplace(entry.name, zip->entries_.size()).second) {
      return Bad(label, "duplicate entry '" + entry.name + "'");
    }
    zip->entries_.push_back(std::move(entry));
  }
  CKPT_RETURN_IF_ERROR(CheckNoOverlap(zip->entries_, label));
  return zip;
}

const ZipEntry* ZipReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

}  // namespace ckpt::format

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

}  // namespace

Result<std::unique_ptr<ZipReader>> ZipReader::Create(const ReadAt& read, uint64_t archive_bytes,
                                                     const std::string& label) {
  auto bad = [&](const std::string& what) { return Corrupt(label + ": zip archive: " + what); };
  if (archive_bytes < kEocdBytes) return bad("too short for an end-of-directory record");

  // The EOCD record is the last 22 bytes plus a comment of up to 64 KiB: scan backwards.
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
  if (eocd < 0) return bad("no end-of-central-directory record");
  const unsigned char* e = &tail[eocd];
  const uint64_t eocd_offset = archive_bytes - tail_bytes + eocd;
  if (U16(e + 4) != 0 || U16(e + 6) != 0) return Unsupported(label + ": multi-disk zip archives are not supported");
  uint64_t count = U16(e + 10);
  uint64_t dir_size = U32(e + 12);
  uint64_t dir_offset = U32(e + 16);
  if (count == 0xffff || dir_size == 0xffffffff || dir_offset == 0xffffffff) {
    // ZIP64: a 20-byte locator right before the EOCD points at the ZIP64 EOCD record.
    if (eocd_offset < 20) return bad("ZIP64 locator missing");
    unsigned char loc[20];
    CKPT_RETURN_IF_ERROR(read(loc, sizeof(loc), eocd_offset - 20));
    if (U32(loc) != kZip64LocatorSig) return bad("ZIP64 locator missing");
    const uint64_t rec_offset = U64(loc + 8);
    if (rec_offset > eocd_offset || eocd_offset - rec_offset < 56) return bad("ZIP64 record out of range");
    unsigned char rec[56];
    CKPT_RETURN_IF_ERROR(read(rec, sizeof(rec), rec_offset));
    if (U32(rec) != kZip64EocdSig) return bad("bad ZIP64 end-of-directory signature");
    if (U32(rec + 16) != 0 || U32(rec + 20) != 0) return Unsupported(label + ": multi-disk zip archives are not supported");
    count = U64(rec + 32);
    dir_size = U64(rec + 40);
    dir_offset = U64(rec + 48);
  }
  if (count > kMaxEntries) return bad(std::to_string(count) + " entries, more than the limit");
  if (dir_size > kMaxDirectoryBytes) return bad("central directory larger than the limit");
  if (dir_offset > archive_bytes || dir_size > archive_bytes - dir_offset) return bad("central directory out of range");
  if (count > dir_size / kCentralBytes) return bad("central directory too small for its entry count");

  std::vector<unsigned char> dir(dir_size);
  if (dir_size > 0) CKPT_RETURN_IF_ERROR(read(dir.data(), dir.size(), dir_offset));
  std::unique_ptr<ZipReader> zip(new ZipReader());
  zip->entries_.reserve(count);
  size_t pos = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (dir_size - pos < kCentralBytes || U32(&dir[pos]) != kCentralSig) {
      return bad("central directory entry " + std::to_string(i) + " is malformed");
    }
    const unsigned char* c = &dir[pos];
    const uint16_t flags = U16(c + 8), method = U16(c + 10);
    const uint32_t crc = U32(c + 16);
    uint64_t csize = U32(c + 20), usize = U32(c + 24);
    const size_t name_len = U16(c + 28), extra_len = U16(c + 30), comment_len = U16(c + 32);
    const uint16_t disk = U16(c + 34);
    uint64_t local = U32(c + 42);
    if (dir_size - pos - kCentralBytes < name_len + extra_len + comment_len) {
      return bad("central directory entry " + std::to_string(i) + " runs past the directory");
    }
    std::string name(reinterpret_cast<const char*>(c + kCentralBytes), name_len);
    // ZIP64 extended information: only the fields that are all-ones above, in this order.
    const unsigned char* x = c + kCentralBytes + name_len;
    for (size_t xp = 0; xp + 4 <= extra_len;) {
      const uint16_t id = U16(x + xp), len = U16(x + xp + 2);
      if (len > extra_len - xp - 4) return bad("entry '" + name + "' has a malformed extra field");
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
        if (!take(&usize) || !take(&csize) || !take(&local)) {
          return bad("entry '" + name + "' has a short ZIP64 extra field");
        }
      }
      xp += 4 + len;
    }
    if (method == 0 && csize != usize) {
      return bad("stored entry '" + name + "' has different compressed and uncompressed sizes");
    }
    if (disk != 0 && disk != 0xffff) return Unsupported(label + ": multi-disk zip archives are not supported");
    if (local > archive_bytes || archive_bytes - local < kLocalBytes) return bad("entry '" + name + "' out of range");
    unsigned char lh[kLocalBytes];
    CKPT_RETURN_IF_ERROR(read(lh, sizeof(lh), local));
    if (U32(lh) != kLocalSig) return bad("entry '" + name + "' has no local header");
    const uint64_t data = local + kLocalBytes + U16(lh + 26) + U16(lh + 28);
    if (data > archive_bytes || csize > archive_bytes - data) {
      return bad("entry '" + name + "' data runs past the end of the archive");
    }
    if (!zip->by_name_.emplace(name, zip->entries_.size()).second) return bad("duplicate entry '" + name + "'");
    zip->entries_.push_back({std::move(name), data, csize, method, crc, (flags & 0x1) != 0});
    pos += kCentralBytes + name_len + extra_len + comment_len;
  }
  // Stored data ranges must not overlap one another (a crafted archive could alias them).
  std::vector<const ZipEntry*> sorted;
  for (const auto& en : zip->entries_) sorted.push_back(&en);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->data_offset < b->data_offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->data_offset + sorted[i - 1]->size > sorted[i]->data_offset) {
      return bad("entries '" + sorted[i - 1]->name + "' and '" + sorted[i]->name + "' overlap");
    }
  }
  return zip;
}

const ZipEntry* ZipReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

}  // namespace ckpt::format

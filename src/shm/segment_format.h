// The layout of one checkpoint generation in a shared-memory segment (a file in the
// daemon's segment directory on the shm tmpfs, see segment_directory.h).
//
//   [SegmentHeader, padded to kHeaderBytes]
//   [TensorEntry x tensor_count]             at index_offset
//   [names, concatenated, not terminated]    at strings_offset
//   [side files: SideFileEntry x side_count, their names, then their bytes, each
//    8-aligned]                               at side_offset (8-aligned), side_bytes long
//   [tensor data, each kDataAlignment-aligned] from data_offset
//
// index_checksum covers [index_offset, end of the names) when side_count is 0, and
// [index_offset, side_offset + side_bytes) otherwise (padding is zero), so the side files'
// table and bytes are covered as well as the tensor index.
//
// The daemon writes everything, then stores state = kComplete with release ordering as
// its last write. Readers check magic, version and state, then validate every offset
// against segment_bytes before following it. All offsets are from the segment's start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/side_file_name.h"

namespace ckpt::shm {

inline constexpr char kSegmentMagic[8] = {'C', 'K', 'P', 'T', 'S', 'E', 'G', '1'};
inline constexpr uint32_t kSegmentVersion = 2;  // 2: segment_id and side files
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kDataAlignment = 64;
inline constexpr uint32_t kMaxDims = 8;
inline constexpr uint32_t kMaxNameBytes = 1024;

enum class SegmentState : uint32_t {
  kLoading = 1,   // being written; never attach
  kComplete = 2,  // immutable from now on
};

struct SegmentHeader {
  char magic[8];
  uint32_t version;
  uint32_t state;             // SegmentState; accessed atomically
  uint64_t generation;        // unique per daemon state directory, increasing
  uint64_t segment_bytes;     // total size of the object
  uint64_t tensor_count;
  uint64_t index_offset;
  uint64_t strings_offset;
  uint64_t strings_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t created_unix_ns;
  uint64_t load_nanos;        // wall time the daemon took to load it
  uint64_t index_checksum;    // XXH3-64 over the index entries and the names
  char checkpoint_name[128];  // NUL-terminated
  char source_path[1024];     // NUL-terminated, truncated if longer
  uint8_t segment_id[16];     // random identity; its hex is the last part of the file name
  // Side files (config.json, ..., and the checkpoint's metadata), see SideFileEntry.
  uint64_t side_offset;       // 0 when side_count is 0
  uint64_t side_count;
  uint64_t side_bytes;
  // Who the daemon created this generation for (docs/operations.md, *Ownership*): the uid
  // that loaded or published it, and kOwner* flags. Zero flags: not recorded (a segment
  // of an older ckptd; it is then owned by admins only).
  uint32_t owner_uid;
  uint32_t owner_flags;
  uint8_t reserved[kHeaderBytes - 8 - 4 - 4 - 11 * 8 - 128 - 1024 - 16 - 3 * 8 - 2 * 4];
};
static_assert(sizeof(SegmentHeader) == kHeaderBytes);
static_assert(offsetof(SegmentHeader, segment_id) == 1256);
static_assert(std::is_trivially_copyable_v<SegmentHeader>);
static_assert(offsetof(SegmentHeader, owner_uid) == 1296);
inline constexpr uint32_t kOwnerRecorded = 1;  // owner_uid holds the owner
inline constexpr uint32_t kOwnerAdmin = 2;     // the owner had the admin role when it created the generation

struct TensorEntry {
  uint64_t name_offset;  // from strings_offset
  uint32_t name_bytes;
  uint32_t dtype;        // ckpt::DType
  uint32_t ndim;         // <= kMaxDims
  uint32_t flags;        // reserved, 0
  uint64_t shape[kMaxDims];
  uint64_t data_offset;  // from the segment start; kDataAlignment-aligned
  uint64_t nbytes;
  uint64_t checksum;     // XXH3-64 of the tensor bytes
  uint64_t reserved[2];
};
static_assert(sizeof(TensorEntry) == 128);
static_assert(std::is_trivially_copyable_v<TensorEntry>);

enum class SideFileKind : uint32_t {
  kFile = 1,      // a file of the model folder (config.json, ...), byte for byte
  kMetadata = 2,  // the checkpoint's metadata: a JSON object of strings, named kMetadataName
};
inline constexpr char kMetadataName[] = "__metadata__";
inline constexpr uint32_t kMaxSideFiles = 64;
inline constexpr uint32_t kMaxSideNameBytes = kMaxSideFileNameBytes;  // common/side_file_name.h

struct SideFileEntry {
  uint64_t name_offset;  // from side_offset
  uint32_t name_bytes;   // 1..kMaxSideNameBytes
  uint32_t kind;         // SideFileKind
  uint64_t data_offset;  // from the segment start, within the side section
  uint64_t nbytes;
  uint64_t checksum;     // XXH3-64 of the bytes
  uint64_t reserved[3];
};
static_assert(sizeof(SideFileEntry) == 64);
static_assert(std::is_trivially_copyable_v<SideFileEntry>);

// Where index_checksum's range ends (see the layout above); for a header whose ranges were
// already checked against the segment's size.
inline uint64_t IndexChecksumEnd(const SegmentHeader& h) {
  return h.side_count != 0 ? h.side_offset + h.side_bytes : h.strings_offset + h.strings_bytes;
}

}  // namespace ckpt::shm

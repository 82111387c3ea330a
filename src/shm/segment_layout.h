// The byte layout of a segment (docs/architecture.md, "The segment"): a pure function of
// the spec, computed before any file exists, so SegmentWriter::Create only executes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "shm/segment_format.h"

namespace ckpt::shm {

struct SegmentSpec;  // segment_writer.h

// One side file as it will be stored: its name and bytes, what it is, and where its name
// (from side_offset) and bytes (from the segment start) go.
struct SideFilePlacement {
  std::string name;
  std::string bytes;
  SideFileKind kind = SideFileKind::kFile;
  uint64_t name_offset = 0;  // from SegmentLayout::side_offset
  uint64_t data_offset = 0;  // from the segment start
};

// Where every part of a segment goes: header at 0, index at index_offset, names at
// strings_offset, side files (spec.side_files, then the metadata as one JSON object
// named kMetadataName) at side_offset, tensor data from data_offset (4096-aligned, each
// tensor kDataAlignment-aligned, an alias at its target's offset), the whole rounded up
// to the page alignment.
struct SegmentLayout {
  uint64_t index_offset = 0;
  uint64_t strings_offset = 0;
  uint64_t strings_bytes = 0;
  uint64_t side_offset = 0;  // 0 when there are no side files
  uint64_t side_bytes = 0;
  uint64_t data_offset = 0;
  uint64_t data_end = 0;       // one past the last tensor's bytes
  uint64_t segment_bytes = 0;  // the file's size: a multiple of page_alignment, > data_offset
  std::vector<uint64_t> tensor_offsets;  // one per spec.tensors entry
  std::vector<SideFilePlacement> sides;
};

// Lays out `spec`'s tensors, side files and metadata (spec.directory, name, generation and
// populate are not looked at) for a directory whose segments are sized to multiples of
// `page_alignment` (a power of two). Every offset and total is checked. Errors:
// InvalidArgument for a tensor name that is empty or over kMaxNameBytes, too many dims, a
// negative dim, an nbytes that is not shape x dtype, a side file name that is empty, too
// long, reserved or repeated, too many side files, metadata that is not UTF-8, alias_of
// of the wrong length or naming a tensor that is not an earlier one of the same size, and
// a total that overflows 64 bits.
Result<SegmentLayout> PlanSegmentLayout(const SegmentSpec& spec, uint64_t page_alignment);

}  // namespace ckpt::shm

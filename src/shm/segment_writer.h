// SegmentWriter: creates one checkpoint generation's shared-memory segment and publishes
// it. Until Publish() succeeds the segment's state is kLoading and the destructor removes
// the object, so a failed or abandoned load leaves nothing behind.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "shm/shm_object.h"

namespace ckpt::shm {

struct SegmentSpec {
  std::string shm_name;         // object name, no '/'
  std::string checkpoint_name;  // < 128 bytes
  std::string source_path;      // truncated to 1023 bytes in the header
  uint64_t generation = 0;
  uint32_t mode = 0644;                 // permission bits of the object
  std::vector<TensorInfo> tensors;      // checksums ignored here; nbytes must be right
  // Empty, or one per tensor: the index of an earlier tensor with the same nbytes whose
  // data this one shares (its index entry gets the same data offset; tied weights), or -1.
  std::vector<int64_t> alias_of;
  // Small files kept with the tensors (name, bytes), stored in the side-file section; at
  // most kMaxSideFiles, names 1..kMaxSideNameBytes bytes, unique, not kMetadataName.
  std::vector<std::pair<std::string, std::string>> side_files;
  // The checkpoint's metadata (safetensors __metadata__); stored as one JSON object in the
  // side-file section when not empty.
  std::map<std::string, std::string> metadata;
};

class SegmentWriter {
 public:
  // Lays out, creates and reserves the segment, and writes its header, index and side
  // files. Every offset and total is computed with checked arithmetic. Errors:
  // InvalidArgument for a bad spec or a layout that overflows 64 bits, AlreadyExists,
  // ResourceExhausted.
  static Result<std::unique_ptr<SegmentWriter>> Create(const SegmentSpec& spec);
  ~SegmentWriter();

  // Where tensor i's bytes go (kDataAlignment-aligned, nbytes long).
  std::byte* tensor_data(size_t i) const;
  uint64_t segment_bytes() const { return mapping_->size(); }
  const std::string& shm_name() const { return mapping_->name(); }

  // Records the checksums (one per tensor, in spec order) and the load time, then marks
  // the segment complete. Afterwards the object outlives this writer.
  Status Publish(const std::vector<uint64_t>& checksums, uint64_t load_nanos);

 private:
  explicit SegmentWriter(std::unique_ptr<ShmMapping> mapping) : mapping_(std::move(mapping)) {}
  std::unique_ptr<ShmMapping> mapping_;
  bool published_ = false;
};

}  // namespace ckpt::shm

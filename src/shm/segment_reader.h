// SegmentReader: a read-only, validated view of a complete checkpoint segment.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tensor.h"
#include "shm/segment_format.h"
#include "shm/segment_name.h"
#include "shm/shm_object.h"

namespace ckpt::shm {

class SegmentReader {
 public:
  // Maps the segment open at `fd` read-only and validates it (see FromImage); `name` is
  // for messages. The descriptor may be closed afterwards.
  static Result<std::unique_ptr<SegmentReader>> FromFd(int fd, const std::string& name);
  // Validates the segment image [data, data + size): magic, version, complete state,
  // every offset and length within the image, dtypes, shapes matching byte sizes, names,
  // the index checksum (which covers the side files), and each side file's own checksum
  // and the metadata's JSON. Corrupt or FailedPrecondition (still loading) otherwise.
  // `mapping` (may be null) is kept alive by the reader.
  static Result<std::unique_ptr<SegmentReader>> FromImage(std::unique_ptr<ShmMapping> mapping,
                                                          const std::byte* data, uint64_t size);

  const SegmentHeader& header() const { return *reinterpret_cast<const SegmentHeader*>(base_); }
  std::string checkpoint_name() const;
  std::string source_path() const;
  uint64_t generation() const { return header().generation; }
  // The random identity the daemon gave this segment (also in its file name).
  SegmentId segment_id() const;
  uint64_t segment_bytes() const { return size_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Index of tensor `name`, or -1.
  int64_t Find(const std::string& name) const;
  const std::byte* tensor_data(size_t i) const { return base_ + offsets_[i]; }

  // Recomputes every tensor checksum; Corrupt naming the first tensor that differs.
  Status VerifyChecksums() const;

  // Names of the side files kept with the checkpoint (config.json, ...), in stored order.
  std::vector<std::string> side_file_names() const;
  // The bytes of side file `name`, valid while this reader lives; NotFound if none.
  Result<std::string_view> SideFile(const std::string& name) const;
  // The checkpoint's metadata (safetensors __metadata__, an index's "metadata"); empty if none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SegmentReader() = default;
  // FromImage's steps once the header `h` checked out (CheckHeader): the tensor index and
  // the side files, each entry checked against the mapping before it is kept.
  Status ReadIndex(const SegmentHeader& h);
  Status ReadSideFiles(const SegmentHeader& h);
  std::unique_ptr<ShmMapping> mapping_;
  const std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<uint64_t> offsets_;
  std::unordered_map<std::string, size_t> by_name_;
  std::vector<std::pair<std::string, std::string_view>> side_files_;
  std::map<std::string, std::string> metadata_;
};

// XXH3-64 of a byte range; the checksum used for tensors and the index.
uint64_t Checksum(const void* data, size_t size);

}  // namespace ckpt::shm

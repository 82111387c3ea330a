#include "shm/segment_reader.h"

#include <xxhash.h>

#include <cstring>
#include <nlohmann/json.hpp>

namespace ckpt::shm {

uint64_t Checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

Result<std::unique_ptr<SegmentReader>> SegmentReader::FromFd(int fd, const std::string& name) {
  CKPT_ASSIGN_OR_RETURN(auto mapping, ShmMapping::FromFd(fd, name));
  const std::byte* data = mapping->data();
  uint64_t size = mapping->size();
  auto reader = FromImage(std::move(mapping), data, size);
  if (!reader.ok()) return reader.status().WithContext("segment " + name);
  return reader;
}

SegmentId SegmentReader::segment_id() const {
  SegmentId id;
  std::memcpy(id.data(), header().segment_id, id.size());
  return id;
}

namespace {

// The header `h` (a copy of the first bytes of the `size`-byte image at `data`): magic,
// version, state complete (loaded with acquire ordering from the image itself), every
// part's range inside the image, the index checksum and the terminated names.
Status CheckHeader(const SegmentHeader& h, const std::byte* data, uint64_t size) {
  if (std::memcmp(h.magic, kSegmentMagic, sizeof(kSegmentMagic)) != 0) return Corrupt("bad magic");
  if (h.version != kSegmentVersion) {
    return Unsupported("segment version " + std::to_string(h.version) + ", this build reads " +
                       std::to_string(kSegmentVersion));
  }
  uint32_t state = __atomic_load_n(reinterpret_cast<const uint32_t*>(data + offsetof(SegmentHeader, state)),
                                   __ATOMIC_ACQUIRE);
  if (state != static_cast<uint32_t>(SegmentState::kComplete)) {
    return FailedPrecondition("segment is not complete (still loading or abandoned)");
  }
  if (h.segment_bytes != size) return Corrupt("header size does not match the object size");
  // Each range check is written so that it cannot overflow.
  if (h.index_offset < sizeof(SegmentHeader) || h.index_offset > size ||
      h.tensor_count > (size - h.index_offset) / sizeof(TensorEntry) ||
      h.strings_offset != h.index_offset + h.tensor_count * sizeof(TensorEntry) ||
      h.strings_bytes > size - h.strings_offset || h.data_offset > size ||
      h.data_bytes > size - h.data_offset) {
    return Corrupt("header offsets out of range");
  }
  const uint64_t strings_end = h.strings_offset + h.strings_bytes;
  if (h.side_count != 0 &&
      (h.side_offset < strings_end || h.side_offset % 8 != 0 || h.side_offset > size ||
       h.side_bytes > size - h.side_offset || h.side_offset + h.side_bytes > h.data_offset ||
       h.side_count > kMaxSideFiles || h.side_count > h.side_bytes / sizeof(SideFileEntry))) {
    return Corrupt("side file section out of range");
  }
  if (h.side_count == 0 && (h.side_offset != 0 || h.side_bytes != 0)) return Corrupt("side file section out of range");
  if (IndexChecksumEnd(h) < h.index_offset ||
      Checksum(data + h.index_offset, IndexChecksumEnd(h) - h.index_offset) != h.index_checksum) {
    return Corrupt("index checksum mismatch");
  }
  if (h.checkpoint_name[sizeof(h.checkpoint_name) - 1] != '\0' ||
      h.source_path[sizeof(h.source_path) - 1] != '\0') {
    return Corrupt("unterminated name in header");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<SegmentReader>> SegmentReader::FromImage(std::unique_ptr<ShmMapping> mapping,
                                                                const std::byte* data, uint64_t size) {
  if (size < sizeof(SegmentHeader)) return Corrupt("smaller than a segment header");
  SegmentHeader h;
  std::memcpy(&h, data, sizeof(h));
  CKPT_RETURN_IF_ERROR(CheckHeader(h, data, size));
  std::unique_ptr<SegmentReader> r(new SegmentReader());
  r->mapping_ = std::move(mapping);
  r->base_ = data;
  r->size_ = size;
  CKPT_RETURN_IF_ERROR(r->ReadIndex(h));
  CKPT_RETURN_IF_ERROR(r->ReadSideFiles(h));
  return r;
}

Status SegmentReader::ReadIndex(const SegmentHeader& h) {
  tensors_.reserve(h.tensor_count);
  offsets_.reserve(h.tensor_count);
  const auto* entries = reinterpret_cast<const TensorEntry*>(base_ + h.index_offset);
  const char* strings = reinterpret_cast<const char*>(base_ + h.strings_offset);
  for (uint64_t i = 0; i < h.tensor_count; ++i) {
    TensorEntry e;
    std::memcpy(&e, &entries[i], sizeof(e));
    const std::string where = "tensor entry " + std::to_string(i);
    if (e.name_bytes == 0 || e.name_bytes > kMaxNameBytes || e.name_offset > h.strings_bytes ||
        e.name_bytes > h.strings_bytes - e.name_offset) {
      return Corrupt(where + ": name out of range");
    }
    if (!IsValidDType(e.dtype)) return Corrupt(where + ": unknown dtype " + std::to_string(e.dtype));
    if (e.ndim > kMaxDims) return Corrupt(where + ": too many dims");
    TensorInfo t;
    t.name.assign(strings + e.name_offset, e.name_bytes);
    t.dtype = static_cast<DType>(e.dtype);
    unsigned __int128 bits = DTypeBits(t.dtype);
    for (uint32_t d = 0; d < e.ndim; ++d) {
      if (e.shape[d] > static_cast<uint64_t>(INT64_MAX)) return Corrupt(where + ": bad shape");
      t.shape.push_back(static_cast<int64_t>(e.shape[d]));
      bits *= e.shape[d];
      if (bits > static_cast<unsigned __int128>(size_) * 8) return Corrupt(where + ": shape larger than the segment");
    }
    if (bits % 8 != 0 || bits / 8 != e.nbytes) return Corrupt(where + ": byte size does not match shape");
    if (e.data_offset < h.data_offset || e.data_offset > size_ || e.nbytes > size_ - e.data_offset ||
        e.data_offset % kDataAlignment != 0) {
      return Corrupt(where + ": data out of range");
    }
    t.nbytes = e.nbytes;
    t.checksum = e.checksum;
    if (!by_name_.emplace(t.name, tensors_.size()).second) {
      return Corrupt(where + ": duplicate name '" + t.name + "'");
    }
    tensors_.push_back(std::move(t));
    offsets_.push_back(e.data_offset);
  }
  return Status::Ok();
}

Status SegmentReader::ReadSideFiles(const SegmentHeader& h) {
  // Side files: each entry, name and byte range inside the section, its checksum.
  const uint64_t table_end = h.side_offset + h.side_count * sizeof(SideFileEntry);
  const uint64_t section_end = h.side_offset + h.side_bytes;
  bool have_metadata = false;
  for (uint64_t i = 0; i < h.side_count; ++i) {
    SideFileEntry e;
    std::memcpy(&e, base_ + h.side_offset + i * sizeof(SideFileEntry), sizeof(e));
    const std::string where = "side file entry " + std::to_string(i);
    const uint64_t name_at = h.side_offset + e.name_offset;
    if (e.name_bytes == 0 || e.name_bytes > kMaxSideNameBytes || e.name_offset > h.side_bytes ||
        name_at < table_end || e.name_bytes > section_end - name_at) {
      return Corrupt(where + ": name out of range");
    }
    if (e.data_offset < table_end || e.data_offset > section_end || e.nbytes > section_end - e.data_offset) {
      return Corrupt(where + ": bytes out of range");
    }
    std::string name(reinterpret_cast<const char*>(base_ + name_at), e.name_bytes);
    std::string_view bytes(reinterpret_cast<const char*>(base_ + e.data_offset), e.nbytes);
    if (Checksum(bytes.data(), bytes.size()) != e.checksum) return Corrupt("checksum mismatch in side file '" + name + "'");
    if (e.kind == static_cast<uint32_t>(SideFileKind::kMetadata)) {
      if (name != kMetadataName || have_metadata) return Corrupt(where + ": unexpected metadata entry");
      have_metadata = true;
      auto md = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
      if (md.is_discarded() || !md.is_object()) return Corrupt("segment metadata is not a JSON object");
      for (auto it = md.begin(); it != md.end(); ++it) {
        if (!it->is_string()) return Corrupt("segment metadata has a value that is not a string");
        metadata_[it.key()] = it->get<std::string>();
      }
      continue;
    }
    if (e.kind != static_cast<uint32_t>(SideFileKind::kFile)) return Corrupt(where + ": unknown kind");
    for (const auto& [other, unused] : side_files_) {
      if (other == name) return Corrupt(where + ": duplicate name '" + name + "'");
    }
    side_files_.emplace_back(std::move(name), bytes);
  }
  return Status::Ok();
}

std::string SegmentReader::checkpoint_name() const { return header().checkpoint_name; }
std::string SegmentReader::source_path() const { return header().source_path; }

int64_t SegmentReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::vector<std::string> SegmentReader::side_file_names() const {
  std::vector<std::string> out;
  for (const auto& [name, unused] : side_files_) out.push_back(name);
  return out;
}

Result<std::string_view> SegmentReader::SideFile(const std::string& name) const {
  for (const auto& [n, bytes] : side_files_) {
    if (n == name) return bytes;
  }
  return NotFound("checkpoint has no side file '" + name + "'");
}

Status SegmentReader::VerifyChecksums() const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (Checksum(tensor_data(i), tensors_[i].nbytes) != tensors_[i].checksum) {
      return Corrupt("checksum mismatch in tensor '" + tensors_[i].name + "'");
    }
  }
  return Status::Ok();
}

}  // namespace ckpt::shm

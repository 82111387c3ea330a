#include "shm/segment_writer.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "common/checked_math.h"
#include "common/element_count.h"

#include "shm/segment_format.h"
#include "shm/segment_reader.h"

namespace ckpt::shm {

Result<uint64_t> EstimateSegmentBytes(const SegmentDirectory& directory, uint64_t data_bytes, uint64_t tensor_count,
                                      uint64_t side_bytes) {
  CheckedSum sum(data_bytes);
  sum.AddProduct(tensor_count + 2, 4096).Add(1u << 20).Add(side_bytes);
  sum.Add(directory.pages().segment_alignment());  // the size is rounded up to a (huge) page
  return sum.Get("the checkpoint's size");
}
namespace {

SegmentHeader* HeaderOf(std::byte* base) { return reinterpret_cast<SegmentHeader*>(base); }
TensorEntry* EntriesOf(std::byte* base) {
  return reinterpret_cast<TensorEntry*>(base + HeaderOf(base)->index_offset);
}

void CopyTruncated(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(s.size(), cap - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

}  // namespace

Result<std::unique_ptr<SegmentWriter>> SegmentWriter::Create(const SegmentSpec& spec) {
  if (spec.checkpoint_name.empty() || spec.checkpoint_name.size() >= sizeof(SegmentHeader::checkpoint_name)) {
    return InvalidArgument("checkpoint name must be 1 to 127 bytes");
  }
  if (spec.directory == nullptr) return InvalidArgument("a segment needs a segment directory");
  if (spec.generation == 0) return InvalidArgument("generation 0 is not a generation");
  CKPT_ASSIGN_OR_RETURN(SegmentId id, RandomSegmentId());
  const SegmentName seg_name{spec.checkpoint_name, spec.generation, id};
  const std::string file_name = seg_name.ToString();
  if (!IsPlainFileName(spec.checkpoint_name) || SegmentName::Parse(file_name).value_or(SegmentName{}).checkpoint !=
                                                     spec.checkpoint_name) {
    return InvalidArgument("checkpoint name '" + spec.checkpoint_name + "' cannot be part of a segment file name");
  }
  // Layout: header, index, names, side files, then data; every step checked.
  CheckedSum names_sum;
  for (const TensorInfo& t : spec.tensors) {
    if (t.name.empty() || t.name.size() > kMaxNameBytes) {
      return InvalidArgument("tensor name must be 1 to " + std::to_string(kMaxNameBytes) + " bytes");
    }
    if (t.shape.size() > kMaxDims) return InvalidArgument("tensor '" + t.name + "' has too many dims");
    auto numel = ElementCount(t.shape);
    if (!numel.ok()) return InvalidArgument("tensor '" + t.name + "': bad shape: " + numel.status().message());
    if (TensorBytes(t.dtype, *numel) != t.nbytes) {
      return InvalidArgument("tensor '" + t.name + "': byte size does not match shape and dtype");
    }
    names_sum.Add(t.name.size());
  }
  CKPT_ASSIGN_OR_RETURN(const uint64_t strings_bytes, names_sum.Get("the tensor names' size"));
  const uint64_t index_offset = kHeaderBytes;
  CKPT_ASSIGN_OR_RETURN(const uint64_t strings_offset,
                        CheckedSum(index_offset).AddProduct(spec.tensors.size(), sizeof(TensorEntry)).Get("the index"));
  CKPT_ASSIGN_OR_RETURN(const uint64_t strings_end, CheckedSum(strings_offset).Add(strings_bytes).Get("the index"));

  // Side files: the folder's files, then the metadata as one JSON object.
  std::vector<std::pair<std::string, std::string>> sides;
  std::vector<SideFileKind> kinds;
  std::set<std::string> side_names;
  for (const auto& [name, bytes] : spec.side_files) {
    if (name.empty() || name.size() > kMaxSideNameBytes || name == kMetadataName || !side_names.insert(name).second) {
      return InvalidArgument("side file name '" + name + "' is empty, too long, reserved or repeated");
    }
    sides.emplace_back(name, bytes);
    kinds.push_back(SideFileKind::kFile);
  }
  if (!spec.metadata.empty()) {
    nlohmann::json md = nlohmann::json::object();
    for (const auto& [k, v] : spec.metadata) md[k] = v;
    std::string text;
    try {
      text = md.dump();
    } catch (const std::exception& e) {  // a key or value that is not UTF-8
      return InvalidArgument(std::string("checkpoint metadata cannot be stored: ") + e.what());
    }
    sides.emplace_back(kMetadataName, std::move(text));
    kinds.push_back(SideFileKind::kMetadata);
  }
  if (sides.size() > kMaxSideFiles) return InvalidArgument("too many side files");
  uint64_t side_offset = 0, side_bytes = 0;
  std::vector<uint64_t> side_name_offsets, side_data_offsets;
  uint64_t after_meta = strings_end;
  if (!sides.empty()) {
    CheckedSum c(strings_end);
    c.AlignUp(8);
    CKPT_ASSIGN_OR_RETURN(side_offset, c.Get("the side files' layout"));
    c.AddProduct(sides.size(), sizeof(SideFileEntry));
    for (const auto& side : sides) {
      CKPT_ASSIGN_OR_RETURN(uint64_t at, c.Get("the side files' layout"));
      side_name_offsets.push_back(at - side_offset);
      c.Add(side.first.size());
    }
    for (const auto& side : sides) {
      c.AlignUp(8);
      CKPT_ASSIGN_OR_RETURN(uint64_t at, c.Get("the side files' layout"));
      side_data_offsets.push_back(at);
      c.Add(side.second.size());
    }
    CKPT_ASSIGN_OR_RETURN(after_meta, c.Get("the side files' layout"));
    side_bytes = after_meta - side_offset;
  }
  CKPT_ASSIGN_OR_RETURN(const uint64_t data_offset, CheckedSum(after_meta).AlignUp(4096).Get("the index"));
  if (!spec.alias_of.empty() && spec.alias_of.size() != spec.tensors.size()) {
    return InvalidArgument("alias_of must be empty or have one entry per tensor");
  }
  CheckedSum cursor(data_offset);
  std::vector<uint64_t> offsets;
  offsets.reserve(spec.tensors.size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const int64_t alias = spec.alias_of.empty() ? -1 : spec.alias_of[i];
    if (alias >= 0) {
      if (static_cast<size_t>(alias) >= i || spec.tensors[alias].nbytes != spec.tensors[i].nbytes) {
        return InvalidArgument("tensor '" + spec.tensors[i].name + "' aliases a tensor that is not an earlier one of its size");
      }
      offsets.push_back(offsets[alias]);
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(uint64_t at, cursor.Get("the segment layout"));
    offsets.push_back(at);
    cursor.Add(spec.tensors[i].nbytes).AlignUp(kDataAlignment);
  }
  CKPT_ASSIGN_OR_RETURN(const uint64_t data_end, cursor.Get("the segment's size"));
  const PageSupport& pages = spec.directory->pages();
  CKPT_ASSIGN_OR_RETURN(const uint64_t segment_bytes, CheckedSum(std::max(data_end, data_offset + 1))
                                                          .AlignUp(pages.segment_alignment())
                                                          .Get("the segment's size"));

  const bool fallocate = spec.populate == PagePopulate::kFallocate;
  const bool background = spec.populate == PagePopulate::kBackground;
  CKPT_ASSIGN_OR_RETURN(UniqueFd rw_fd,
                        spec.directory->Create(file_name, segment_bytes, spec.mode,
                                               fallocate ? SegmentDirectory::Reserve::kFallocate
                                                         : SegmentDirectory::Reserve::kSizeOnly));
  auto mapping = ShmMapping::MapFd(rw_fd.get(), file_name, /*writable=*/true);
  if (!mapping.ok()) {
    (void)spec.directory->Remove(file_name);
    return mapping.status();
  }
  std::unique_ptr<SegmentWriter> writer(
      new SegmentWriter(spec.directory, std::move(mapping).value(), UniqueFd(), id));  // removes on error
  CKPT_ASSIGN_OR_RETURN(writer->read_only_fd_, spec.directory->OpenOwned(file_name, spec.mode, segment_bytes));
  struct stat rw_st, ro_st;
  if (::fstat(rw_fd.get(), &rw_st) != 0 || ::fstat(writer->read_only_fd_.get(), &ro_st) != 0 ||
      rw_st.st_ino != ro_st.st_ino || rw_st.st_dev != ro_st.st_dev) {
    return Internal("segment " + spec.directory->PathOf(file_name) + " changed while it was created");
  }
  std::byte* base = writer->mapping_->data();
  if (pages.advise) (void)::madvise(base, segment_bytes, MADV_HUGEPAGE);  // fails only without THP
  const std::string what = "segment " + spec.directory->PathOf(file_name);
  if (fallocate) {
    writer->populated_ = true;
    writer->populate_summary_ = "posix_fallocate";
  } else if (background) {
    // The header pages now (written below), the rest on the reserving thread.
    CKPT_RETURN_IF_ERROR(spec.directory->ReservePages(rw_fd.get(), data_offset, file_name));
    writer->rw_fd_ = std::move(rw_fd);  // the reserving thread's, until it ends
    writer->reserved_.store(data_offset, std::memory_order_release);
    writer->populate_summary_ = "posix_fallocate in the background";
    // Ranges of 64 MiB (a whole number of pages of either size): a writer waits at most
    // for the range its bytes fall in, and a failed write stops the thread within one.
    const uint64_t step = std::max<uint64_t>(64ull << 20, pages.segment_alignment());
    writer->reserve_done_ = false;
    try {
      writer->reserver_ = std::thread([w = writer.get(), data_offset, step] { w->ReserveInBackground(data_offset, step); });
    } catch (const std::system_error& e) {
      writer->reserve_done_ = true;
      return ResourceExhausted(std::string("cannot start the thread that reserves ") + what + ": " + e.what());
    }
  } else {
    const bool all = spec.populate == PagePopulate::kParallel;
    const int threads = all ? spec.populate_threads : 1;
    Status st = PopulateWrite(base, all ? segment_bytes : data_offset, threads, pages.segment_alignment(), what);
    if (st.code() == StatusCode::kUnsupported) {
      // An old kernel: reserve everything the classic way.
      CKPT_RETURN_IF_ERROR(spec.directory->ReservePages(rw_fd.get(), segment_bytes, file_name));
      writer->populated_ = true;
      writer->populate_summary_ = "posix_fallocate (" + st.message() + ")";
    } else {
      CKPT_RETURN_IF_ERROR(st);
      writer->populated_ = all;
      writer->populate_summary_ = all ? "MADV_POPULATE_WRITE x" + std::to_string(std::max(1, threads))
                                      : "MADV_POPULATE_WRITE per read";
    }
  }

  if (!background) writer->reserved_.store(segment_bytes, std::memory_order_release);  // WaitReserved: at once
  SegmentHeader* h = HeaderOf(base);  // pages are zero-filled by the kernel
  std::memcpy(h->magic, kSegmentMagic, sizeof(kSegmentMagic));
  h->version = kSegmentVersion;
  h->state = static_cast<uint32_t>(SegmentState::kLoading);
  h->generation = spec.generation;
  h->segment_bytes = segment_bytes;
  h->tensor_count = spec.tensors.size();
  h->index_offset = index_offset;
  h->strings_offset = strings_offset;
  h->strings_bytes = strings_bytes;
  h->data_offset = data_offset;
  h->data_bytes = data_end - data_offset;
  h->side_offset = side_offset;
  h->side_count = sides.size();
  h->side_bytes = side_bytes;
  h->created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch()).count());
  CopyTruncated(h->checkpoint_name, sizeof(h->checkpoint_name), spec.checkpoint_name);
  CopyTruncated(h->source_path, sizeof(h->source_path), spec.source_path);
  std::memcpy(h->segment_id, id.data(), sizeof(h->segment_id));
  h->owner_uid = spec.owner_uid;
  h->owner_flags = kOwnerRecorded | (spec.owner_admin ? kOwnerAdmin : 0);

  TensorEntry* entries = EntriesOf(base);
  char* strings = reinterpret_cast<char*>(base + strings_offset);
  uint64_t name_cursor = 0;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorInfo& t = spec.tensors[i];
    TensorEntry& e = entries[i];
    e.name_offset = name_cursor;
    e.name_bytes = static_cast<uint32_t>(t.name.size());
    std::memcpy(strings + name_cursor, t.name.data(), t.name.size());
    name_cursor += t.name.size();
    e.dtype = static_cast<uint32_t>(t.dtype);
    e.ndim = static_cast<uint32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) e.shape[d] = static_cast<uint64_t>(t.shape[d]);
    e.data_offset = offsets[i];
    e.nbytes = t.nbytes;
  }
  for (size_t i = 0; i < sides.size(); ++i) {
    SideFileEntry se{};
    se.name_offset = side_name_offsets[i];
    se.name_bytes = static_cast<uint32_t>(sides[i].first.size());
    se.kind = static_cast<uint32_t>(kinds[i]);
    se.data_offset = side_data_offsets[i];
    se.nbytes = sides[i].second.size();
    se.checksum = Checksum(sides[i].second.data(), sides[i].second.size());
    std::memcpy(base + side_offset + i * sizeof(SideFileEntry), &se, sizeof(se));
    std::memcpy(base + side_offset + se.name_offset, sides[i].first.data(), sides[i].first.size());
    if (!sides[i].second.empty()) std::memcpy(base + se.data_offset, sides[i].second.data(), se.nbytes);
  }
  return writer;
}

void SegmentWriter::ReserveInBackground(uint64_t from, uint64_t step) {
  const uint64_t size = mapping_->size();
  Status st;
  for (uint64_t at = from; at < size && st.ok();) {
    if (stop_reserving_.load(std::memory_order_acquire)) {
      st = Cancelled("the reservation of segment " + mapping_->name() + " was stopped");
      break;
    }
    const uint64_t n = std::min(step, size - at);
    st = directory_->ReservePages(rw_fd_.get(), n, mapping_->name(), at);
    if (!st.ok()) {
      // (The message names this range's bytes; the operator needs the whole segment's.)
      st = Status(st.code(), st.message() + " (the segment needs " + std::to_string(size) + " bytes, " +
                                 std::to_string(at) + " of them reserved)");
      break;
    }
    at += n;
    reserved_.store(at, std::memory_order_release);
    std::lock_guard<std::mutex> lock(reserve_mu_);
    reserve_cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(reserve_mu_);
  reserve_done_ = true;
  reserve_status_ = st;
  reserve_cv_.notify_all();
}

Status SegmentWriter::WaitReserved(uint64_t end) {
  if (reserved_.load(std::memory_order_acquire) >= end) return Status::Ok();
  std::unique_lock<std::mutex> lock(reserve_mu_);
  reserve_cv_.wait(lock, [&] { return reserve_done_ || reserved_.load(std::memory_order_acquire) >= end; });
  if (reserved_.load(std::memory_order_acquire) >= end) return Status::Ok();
  if (!reserve_status_.ok()) return reserve_status_;
  return Internal("bytes [0, " + std::to_string(end) + ") lie beyond segment " + mapping_->name());
}

uint64_t SegmentWriter::tensor_offset(size_t i) const { return EntriesOf(mapping_->data())[i].data_offset; }

SegmentWriter::~SegmentWriter() {
  stop_reserving_.store(true, std::memory_order_release);
  if (reserver_.joinable()) reserver_.join();
  if (!published_ && mapping_) {
    std::string name = mapping_->name();
    mapping_.reset();
    read_only_fd_.reset();
    Status st = directory_->Remove(name);
    // ckpt_core has no logger: stderr is where the daemon's log goes too.
    if (!st.ok()) std::fprintf(stderr, "ckpt: cannot remove abandoned segment: %s\n", st.ToString().c_str());
  }
}

std::byte* SegmentWriter::tensor_data(size_t i) const {
  std::byte* base = mapping_->data();
  return base + EntriesOf(base)[i].data_offset;
}

Status SegmentWriter::Populate(int threads) {
  if (populated_) return Status::Ok();
  if (reserver_.joinable()) {
    CKPT_RETURN_IF_ERROR(WaitReserved(mapping_->size()));
    reserver_.join();
    rw_fd_.reset();
    populated_ = true;
    return Status::Ok();
  }
  CKPT_RETURN_IF_ERROR(PopulateWrite(mapping_->data(), mapping_->size(), threads,
                                     directory_->pages().segment_alignment(),
                                     "segment " + directory_->PathOf(mapping_->name())));
  populated_ = true;
  return Status::Ok();
}

uint64_t SegmentWriter::HugeMappedBytes() const {
  auto bytes = PmdMappedBytes(mapping_->data());
  return bytes.ok() ? *bytes : 0;
}

Status SegmentWriter::Publish(const std::vector<uint64_t>& checksums, uint64_t load_nanos) {
  if (!populated_) return Internal("segment " + mapping_->name() + " published before its pages were populated");
  std::byte* base = mapping_->data();
  SegmentHeader* h = HeaderOf(base);
  if (checksums.size() != h->tensor_count) return Internal("checksum count does not match tensors");
  TensorEntry* entries = EntriesOf(base);
  for (size_t i = 0; i < checksums.size(); ++i) entries[i].checksum = checksums[i];
  h->load_nanos = load_nanos;
  h->index_checksum = Checksum(base + h->index_offset, IndexChecksumEnd(*h) - h->index_offset);
  __atomic_store_n(&h->state, static_cast<uint32_t>(SegmentState::kComplete), __ATOMIC_RELEASE);
  published_ = true;
  return Status::Ok();
}

}  // namespace ckpt::shm

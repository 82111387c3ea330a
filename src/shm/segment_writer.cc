#include "shm/segment_writer.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "common/checked_math.h"

#include "shm/segment_format.h"
#include "shm/segment_layout.h"
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
  const PageSupport& pages = spec.directory->pages();
  CKPT_ASSIGN_OR_RETURN(const SegmentLayout layout, PlanSegmentLayout(spec, pages.segment_alignment()));
  const uint64_t segment_bytes = layout.segment_bytes;

  const bool fallocate = spec.populate == PagePopulate::kFallocate;
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
  if (pages.advise) (void)::madvise(writer->mapping_->data(), segment_bytes, MADV_HUGEPAGE);  // fails only without THP
  CKPT_RETURN_IF_ERROR(writer->ReservePages(spec, std::move(rw_fd), layout.data_offset));
  writer->WriteHeaderAndIndex(spec, layout);
  return writer;
}

Status SegmentWriter::ReservePages(const SegmentSpec& spec, UniqueFd rw_fd, uint64_t data_offset) {
  const std::string& file_name = mapping_->name();
  const uint64_t segment_bytes = mapping_->size();
  const PageSupport& pages = spec.directory->pages();
  const std::string what = "segment " + spec.directory->PathOf(file_name);
  if (spec.populate == PagePopulate::kFallocate) {
    populated_ = true;
    populate_summary_ = "posix_fallocate";
  } else if (spec.populate == PagePopulate::kBackground) {
    // The header pages now (written next), the rest on the reserving thread.
    CKPT_RETURN_IF_ERROR(spec.directory->ReservePages(rw_fd.get(), data_offset, file_name));
    rw_fd_ = std::move(rw_fd);  // the reserving thread's, until it ends
    reserved_.store(data_offset, std::memory_order_release);
    populate_summary_ = "posix_fallocate in the background";
    // Ranges of 64 MiB (a whole number of pages of either size): a writer waits at most
    // for the range its bytes fall in, and a failed write stops the thread within one.
    const uint64_t step = std::max<uint64_t>(64ull << 20, pages.segment_alignment());
    reserve_done_ = false;
    try {
      reserver_ = std::thread([this, data_offset, step] { ReserveInBackground(data_offset, step); });
    } catch (const std::system_error& e) {
      reserve_done_ = true;
      return ResourceExhausted(std::string("cannot start the thread that reserves ") + what + ": " + e.what());
    }
    return Status::Ok();
  } else {
    const bool all = spec.populate == PagePopulate::kParallel;
    const int threads = all ? spec.populate_threads : 1;
    Status st = PopulateWrite(mapping_->data(), all ? segment_bytes : data_offset, threads, pages.segment_alignment(), what);
    if (st.code() == StatusCode::kUnsupported) {
      // An old kernel: reserve everything the classic way.
      CKPT_RETURN_IF_ERROR(spec.directory->ReservePages(rw_fd.get(), segment_bytes, file_name));
      populated_ = true;
      populate_summary_ = "posix_fallocate (" + st.message() + ")";
    } else {
      CKPT_RETURN_IF_ERROR(st);
      populated_ = all;
      populate_summary_ = all ? "MADV_POPULATE_WRITE x" + std::to_string(std::max(1, threads))
                              : "MADV_POPULATE_WRITE per read";
      deferred_ = !all;
      if (deferred_ && !pages.hugetlb) deferred_fd_ = std::move(rw_fd);  // hugetlbfs has no write()
    }
  }
  reserved_.store(segment_bytes, std::memory_order_release);  // WaitReserved: at once
  return Status::Ok();
}

void SegmentWriter::WriteHeaderAndIndex(const SegmentSpec& spec, const SegmentLayout& layout) {
  std::byte* base = mapping_->data();
  SegmentHeader* h = HeaderOf(base);  // pages are zero-filled by the kernel
  std::memcpy(h->magic, kSegmentMagic, sizeof(kSegmentMagic));
  h->version = kSegmentVersion;
  h->state = static_cast<uint32_t>(SegmentState::kLoading);
  h->generation = spec.generation;
  h->segment_bytes = layout.segment_bytes;
  h->tensor_count = spec.tensors.size();
  h->index_offset = layout.index_offset;
  h->strings_offset = layout.strings_offset;
  h->strings_bytes = layout.strings_bytes;
  h->data_offset = layout.data_offset;
  h->data_bytes = layout.data_end - layout.data_offset;
  h->side_offset = layout.side_offset;
  h->side_count = layout.sides.size();
  h->side_bytes = layout.side_bytes;
  h->created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch()).count());
  CopyTruncated(h->checkpoint_name, sizeof(h->checkpoint_name), spec.checkpoint_name);
  CopyTruncated(h->source_path, sizeof(h->source_path), spec.source_path);
  std::memcpy(h->segment_id, id_.data(), sizeof(h->segment_id));
  h->owner_uid = spec.owner_uid;
  h->owner_flags = kOwnerRecorded | (spec.owner_admin ? kOwnerAdmin : 0);

  TensorEntry* entries = EntriesOf(base);
  char* strings = reinterpret_cast<char*>(base + layout.strings_offset);
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
    e.data_offset = layout.tensor_offsets[i];
    e.nbytes = t.nbytes;
  }
  for (size_t i = 0; i < layout.sides.size(); ++i) {
    const SideFilePlacement& side = layout.sides[i];
    SideFileEntry se{};
    se.name_offset = side.name_offset;
    se.name_bytes = static_cast<uint32_t>(side.name.size());
    se.kind = static_cast<uint32_t>(side.kind);
    se.data_offset = side.data_offset;
    se.nbytes = side.bytes.size();
    se.checksum = Checksum(side.bytes.data(), side.bytes.size());
    std::memcpy(base + layout.side_offset + i * sizeof(SideFileEntry), &se, sizeof(se));
    std::memcpy(base + layout.side_offset + se.name_offset, side.name.data(), side.name.size());
    if (!side.bytes.empty()) std::memcpy(base + se.data_offset, side.bytes.data(), se.nbytes);
  }
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

Status SegmentWriter::PopulateAroundTensors(int threads) {
  if (populated_ || !deferred_) return Populate(threads);
  const std::string what = "segment " + directory_->PathOf(mapping_->name());
  const uint64_t align = directory_->pages().segment_alignment();
  std::byte* base = mapping_->data();
  const SegmentHeader* h = HeaderOf(base);
  const TensorEntry* entries = EntriesOf(base);
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) of each tensor's bytes
  for (uint64_t i = 0; i < h->tensor_count; ++i) {
    if (entries[i].nbytes > 0) spans.emplace_back(entries[i].data_offset, entries[i].data_offset + entries[i].nbytes);
  }
  std::sort(spans.begin(), spans.end());
  // Bytes [covered, begin) hold no tensor: their whole pages are the holes (the pages that
  // hold byte covered - 1 and byte begin were written). Create populated [0, data_offset).
  uint64_t covered = h->data_offset;
  const auto fill = [&](uint64_t from, uint64_t to) -> Status {
    from = (from + align - 1) / align * align;
    to = to / align * align;
    return to > from ? PopulateWrite(base + from, to - from, threads, align, what) : Status::Ok();
  };
  for (const auto& [begin, end] : spans) {
    CKPT_RETURN_IF_ERROR(fill(covered, begin));
    covered = std::max(covered, end);
  }
  CKPT_RETURN_IF_ERROR(fill(covered, mapping_->size()));  // the size is whole pages
  populated_ = true;
  return Status::Ok();
}

uint64_t SegmentWriter::HugeMappedBytes() const {
  // /proc/self/smaps walks the whole mapping (tens of ms per GiB): only where huge pages can be.
  if (!directory_->pages().huge) return 0;
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
  deferred_fd_.reset();
  return Status::Ok();
}

}  // namespace ckpt::shm

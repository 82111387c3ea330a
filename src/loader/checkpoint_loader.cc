#include "loader/checkpoint_loader.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_set>

#include "common/crc32.h"
#include "common/io.h"
#include "common/pause_point.h"
#include "format/pytorch_zip.h"
#include "loader/strided_copy.h"
#include "shm/huge_pages.h"
#include "shm/segment_reader.h"

namespace ckpt::loader {
namespace {

// "O_DIRECT" / "buffered (why)" per file, joined, with counts when several files agree.
std::string DescribeIo(const std::vector<SourceFile>& files, const FileReader& reader) {
  std::map<std::string, int> modes;
  for (const SourceFile& f : files) {
    ++modes[f.direct.valid() ? std::string("O_DIRECT") : "buffered (" + f.buffered_reason + ")"];
  }
  std::string out;
  for (const auto& [mode, count] : modes) {
    if (!out.empty()) out += "; ";
    out += mode;
    if (files.size() > 1) out += " for " + std::to_string(count) + " of " + std::to_string(files.size()) + " files";
  }
  return out + ", " + reader.Describe();
}

// The plan's CRC-32 checks, each computed from the bytes as they land: a check whose range
// is exactly one contiguous tensor's (a PyTorch storage holding one whole tensor, the usual
// case) is the CRC of that tensor's read ops, each computed by the thread that completed
// the op and joined in order at the end; any other range (a storage shared by several
// views, or only partly used) is read again from the file after the bulk reads.
class CrcChecks {
 public:
  CrcChecks(const format::LoadPlan& plan) : plan_(plan), check_of_tensor_(plan.tensors.size(), -1) {
    std::map<std::pair<uint32_t, uint64_t>, size_t> by_start;
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const format::PlannedTensor& t = plan.tensors[i];
      if (t.alias_of < 0 && t.strides.empty()) by_start.emplace(std::make_pair(t.file_index, t.file_offset), i);
    }
    for (size_t c = 0; c < plan.crc_checks.size(); ++c) {
      const format::CrcCheck& check = plan.crc_checks[c];
      auto it = by_start.find({check.file_index, check.offset});
      if (it != by_start.end() && plan.tensors[it->second].nbytes == check.size && check_of_tensor_[it->second] < 0) {
        check_of_tensor_[it->second] = static_cast<int64_t>(c);
      } else {
        reread_.push_back(c);
      }
    }
  }

  // Called once the ops are planned (`ops` is the loader's list; each tensor's ops are
  // contiguous and in file order).
  void Planned(const std::vector<ReadOp>& ops) {
    part_crc_.assign(ops.size(), 0);
    first_op_.assign(plan_.tensors.size(), ops.size());
    op_count_.assign(plan_.tensors.size(), 0);
    for (size_t k = 0; k < ops.size(); ++k) {
      if (first_op_[ops[k].tensor] == ops.size()) first_op_[ops[k].tensor] = k;
      ++op_count_[ops[k].tensor];
    }
  }

  // On the thread that completed op k (its bytes are in place). Thread-safe across ops.
  void Landed(size_t k, const ReadOp& op) {
    if (check_of_tensor_[op.tensor] >= 0) part_crc_[k] = Crc32(op.dst, op.length);
  }

  // After every read: joins the parts, reads the other ranges again, and returns Corrupt
  // naming the first member whose CRC-32 differs.
  Status Finish(const std::vector<SourceFile>& files, const std::vector<ReadOp>& ops) const {
    for (size_t i = 0; i < check_of_tensor_.size(); ++i) {
      if (check_of_tensor_[i] < 0) continue;
      uint32_t crc = 0;
      for (size_t k = first_op_[i]; k < first_op_[i] + op_count_[i] && k < ops.size(); ++k) {
        crc = Crc32Combine(crc, part_crc_[k], ops[k].length);
      }
      CKPT_RETURN_IF_ERROR(Compare(files, plan_.crc_checks[check_of_tensor_[i]], crc));
    }
    std::vector<std::byte> buf;
    for (size_t c : reread_) {
      const format::CrcCheck& check = plan_.crc_checks[c];
      const SourceFile& f = files[check.file_index];
      buf.resize(std::min<uint64_t>(check.size, 16ull << 20));
      uint32_t crc = 0;
      for (uint64_t at = 0; at < check.size;) {
        const uint64_t n = std::min<uint64_t>(buf.size(), check.size - at);
        CKPT_RETURN_IF_ERROR(PreadFull(f.buffered_fd(), buf.data(), n, check.offset + at, f.path));
        crc = Crc32(buf.data(), n, crc);
        at += n;
      }
      CKPT_RETURN_IF_ERROR(Compare(files, check, crc));
    }
    return Status::Ok();
  }

  bool any() const { return !plan_.crc_checks.empty(); }

 private:
  static Status Compare(const std::vector<SourceFile>& files, const format::CrcCheck& check, uint32_t crc) {
    if (crc == check.crc32) return Status::Ok();
    return Corrupt(format::CrcMismatch(files[check.file_index].path, check.member, crc, check.crc32));
  }

  const format::LoadPlan& plan_;
  std::vector<int64_t> check_of_tensor_;  // index into plan.crc_checks, -1: none
  std::vector<size_t> reread_;            // checks not covered by one tensor's reads
  std::vector<uint32_t> part_crc_;        // per op
  std::vector<size_t> first_op_, op_count_;
};

// The segment's description of the plan: every tensor (name, dtype, shape, size; its
// alias), the side files and the metadata, replacing whatever `spec` had.
void DescribePlan(const format::LoadPlan& plan, shm::SegmentSpec& spec) {
  spec.tensors.clear();
  spec.alias_of.clear();
  spec.side_files.clear();
  for (const auto& side : plan.side_files) spec.side_files.push_back({side.name, side.bytes});
  spec.metadata = plan.metadata;
  for (const auto& t : plan.tensors) {
    TensorInfo info;
    info.name = t.name;
    info.dtype = t.dtype;
    info.shape = t.shape;
    info.nbytes = t.nbytes;
    spec.tensors.push_back(std::move(info));
    spec.alias_of.push_back(t.alias_of);
  }
}

// The plan's files opened for reading (O_DIRECT as `direct_io` says); Corrupt
// when a tensor's bytes end past its file's end.
Result<std::vector<SourceFile>> OpenSourceFiles(const format::LoadPlan& plan, DirectIo direct_io) {
  std::vector<SourceFile> files;
  for (const auto& opened : plan.files) {
    if (!opened) return Internal("plan lists a file that is not open");
    CKPT_ASSIGN_OR_RETURN(SourceFile f, OpenSourceFile(opened, direct_io));
    files.push_back(std::move(f));
  }
  for (const auto& t : plan.tensors) {
    const uint64_t size = files[t.file_index].size;
    const uint64_t span = t.strides.empty() ? t.nbytes : t.source_bytes;  // bytes read from the file
    if (t.file_offset > size || span > size - t.file_offset) {
      return Corrupt(files[t.file_index].path + " ends at byte " + std::to_string(size) + ", before tensor '" +
                     format::EscapedName(t.name) + "' does");
    }
  }
  return files;
}

// A file that changed while it was read fails the load: FailedPrecondition naming it.
Status FilesUnchanged(const format::LoadPlan& plan) {
  for (const auto& f : plan.files) CKPT_RETURN_IF_ERROR(f->CheckUnchanged());
  return Status::Ok();
}

// When a read fails, a change is the likelier story (a truncated file ends early), so it
// is reported first.
Status WithChange(const format::LoadPlan& plan, Status st) {
  if (st.ok() || st.code() == StatusCode::kFailedPrecondition) return st;
  Status changed = FilesUnchanged(plan);
  return changed.ok() ? st : changed;
}

// What the bulk reads do: the ops in file order (a tensor's ops contiguous), the strided
// tensors read after them, per tensor the ops still to land, and the checksums (those of
// empty tensors already set).
struct ReadSchedule {
  std::vector<ReadOp> ops;
  std::vector<size_t> strided;
  std::unique_ptr<std::atomic<uint32_t>[]> remaining;
  std::vector<uint64_t> checksums;
};

// Reads in file order (sequential for the disk). Aliases (tied weights) share an earlier
// tensor's bytes and are not read; strided views (non-contiguous PyTorch tensors) are read
// and gathered after the bulk reads. `populate_each`: every op populates its pages first.
ReadSchedule ScheduleReads(const format::LoadPlan& plan, const std::vector<SourceFile>& files,
                           const shm::SegmentWriter& writer, uint64_t chunk_bytes, bool populate_each) {
  std::vector<size_t> order(plan.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = plan.tensors[a];
    const auto& y = plan.tensors[b];
    return std::tie(x.file_index, x.file_offset) < std::tie(y.file_index, y.file_offset);
  });
  ReadSchedule r;
  const size_t n = plan.tensors.size();
  r.remaining.reset(new std::atomic<uint32_t>[n]);
  r.checksums.resize(n);
  for (size_t i : order) {
    const format::PlannedTensor& t = plan.tensors[i];
    r.remaining[i].store(0);
    if (t.alias_of >= 0) continue;
    if (!t.strides.empty()) {
      r.strided.push_back(i);
      continue;
    }
    const size_t before = r.ops.size();
    PlanReads(files[t.file_index], t.file_index, static_cast<uint32_t>(i), t.file_offset, t.nbytes,
              writer.tensor_data(i), chunk_bytes, &r.ops);
    r.remaining[i].store(static_cast<uint32_t>(r.ops.size() - before));
    if (populate_each) {
      for (size_t k = before; k < r.ops.size(); ++k) {
        ReadOp& op = r.ops[k];
        op.populate = true;
        op.dst_fd = writer.data_fd();
        op.dst_offset = writer.tensor_offset(i) + static_cast<uint64_t>(op.dst - writer.tensor_data(i));
      }
    }
    if (r.ops.size() == before) r.checksums[i] = shm::Checksum(writer.tensor_data(i), 0);
  }
  return r;
}

// Reads and gathers tensor i, a strided view, into its place (its pages populated first
// when `populate_each`: a write into a full tmpfs would SIGBUS) and returns its checksum.
Result<uint64_t> ReadStrided(const format::LoadPlan& plan, size_t i, const std::vector<SourceFile>& files,
                             const shm::SegmentWriter& writer, bool populate_each) {
  const format::PlannedTensor& t = plan.tensors[i];
  if (populate_each && t.nbytes > 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(writer.tensor_data(i));
    const uintptr_t begin = at / shm::kSmallPageBytes * shm::kSmallPageBytes;
    Status st = shm::PopulateWrite(reinterpret_cast<std::byte*>(begin), at + t.nbytes - begin, 1,
                                   shm::kSmallPageBytes, "tensor '" + format::EscapedName(t.name) + "'");
    if (!st.ok() && st.code() != StatusCode::kUnsupported) return st;  // old kernel: fallocated
  }
  CKPT_RETURN_IF_ERROR(WithChange(plan, ReadStridedTensor(files[t.file_index].buffered_fd(), files[t.file_index].path,
                                                          t, writer.tensor_data(i))));
  return shm::Checksum(writer.tensor_data(i), t.nbytes);
}

// What a published load returns: the segment's names, its read-only descriptor (taken from
// `writer`), sizes, and spec's tensors with their checksums.
LoadedSegment Loaded(shm::SegmentWriter& writer, shm::SegmentSpec spec, const std::vector<uint64_t>& checksums) {
  LoadedSegment out;
  out.file_name = writer.file_name();
  out.segment_id = writer.segment_id();
  out.fd = writer.TakeReadOnlyFd();
  out.segment_bytes = writer.segment_bytes();
  out.tensors = std::move(spec.tensors);
  for (size_t i = 0; i < checksums.size(); ++i) out.tensors[i].checksum = checksums[i];
  out.page_bytes = spec.directory->pages().segment_alignment();
  out.huge_bytes = writer.HugeMappedBytes();
  out.populate_summary = writer.populate_summary();
  return out;
}

}  // namespace

Result<LoadedSegment> LoadIntoSegment(const format::LoadPlan& plan, shm::SegmentSpec spec,
                                      const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(format::ValidatePlan(plan));
  DescribePlan(plan, spec);

  ReaderOptions reader_options;
  reader_options.threads = options.threads;
  reader_options.queue_depth = options.queue_depth;
  reader_options.chunk_bytes = (std::max<uint64_t>(options.chunk_bytes, 1 << 20) + 4095) / 4096 * 4096;
  reader_options.cancel = options.cancel;
  CKPT_ASSIGN_OR_RETURN(auto reader, options.make_reader ? options.make_reader(reader_options)
                                                         : FileReader::Create(options.engine, reader_options));
  CKPT_ASSIGN_OR_RETURN(const std::vector<SourceFile> files, OpenSourceFiles(plan, options.direct_io));
  // Before reading (the plan was parsed from these descriptors; nothing may have moved
  // since) and again after the last read.
  CKPT_RETURN_IF_ERROR(FilesUnchanged(plan));

  if (options.populate == shm::PagePopulate::kDeferred && options.engine != ReadEngine::kPread) {
    spec.populate = shm::PagePopulate::kParallel;  // io_uring reads land without a populate
  } else {
    spec.populate = options.populate;
  }
  spec.populate_threads = options.threads;
  CKPT_ASSIGN_OR_RETURN(auto writer, shm::SegmentWriter::Create(spec));
  const bool populate_each = spec.populate == shm::PagePopulate::kDeferred;

  ReadSchedule reads = ScheduleReads(plan, files, *writer, reader_options.chunk_bytes, populate_each);
  const std::vector<ReadOp>& ops = reads.ops;
  std::vector<uint64_t>& checksums = reads.checksums;
  CrcChecks crc_checks(plan);
  crc_checks.Planned(ops);

  CKPT_ASSIGN_OR_RETURN(const uint64_t total, plan.StoredBytes());
  std::atomic<uint64_t> done{0};
  auto report = [&] {
    if (options.progress) options.progress(done.load(), total);
  };
  std::atomic<bool> first_landed{false};
  CKPT_RETURN_IF_ERROR(WithChange(plan, reader->ReadAll(
      files, ops,
      [&](size_t i) {
        // Tests stop the load here, with bytes read and more to read (common/pause_point.h).
        if (!first_landed.exchange(true)) PausePoint("load-mid-read");
        const ReadOp& op = ops[i];
        crc_checks.Landed(i, op);
        // The thread that lands a tensor's last bytes checksums it while other reads go on.
        if (reads.remaining[op.tensor].fetch_sub(1, std::memory_order_acq_rel) == 1) {
          checksums[op.tensor] = shm::Checksum(writer->tensor_data(op.tensor), plan.tensors[op.tensor].nbytes);
        }
        done.fetch_add(op.length, std::memory_order_relaxed);
      },
      report)));
  for (size_t i : reads.strided) {
    if (options.cancel && options.cancel->load()) return FailedPrecondition("load cancelled");
    CKPT_ASSIGN_OR_RETURN(checksums[i], ReadStrided(plan, i, files, *writer, populate_each));
    done.fetch_add(plan.tensors[i].nbytes, std::memory_order_relaxed);
    report();
  }
  for (size_t i = 0; i < checksums.size(); ++i) {
    if (plan.tensors[i].alias_of >= 0) checksums[i] = checksums[plan.tensors[i].alias_of];
  }
  report();
  if (crc_checks.any()) CKPT_RETURN_IF_ERROR(WithChange(plan, crc_checks.Finish(files, ops)));
  CKPT_RETURN_IF_ERROR(FilesUnchanged(plan));
  // Every page allocated before the segment is published: a client never faults on a hole.
  // Every tensor's bytes are in place (aliases share theirs), so a kDeferred segment lacks
  // only the pages between and after them.
  CKPT_RETURN_IF_ERROR(writer->PopulateAroundTensors(options.threads));

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CKPT_RETURN_IF_ERROR(writer->Publish(checksums, static_cast<uint64_t>(seconds * 1e9)));

  LoadedSegment out = Loaded(*writer, std::move(spec), checksums);
  out.data_bytes = total;
  out.seconds = seconds;
  out.io_summary = options.make_reader ? reader->Describe() : DescribeIo(files, *reader);
  out.mapping = std::shared_ptr<shm::SegmentWriter>(std::move(writer));
  return out;
}

}  // namespace ckpt::loader

#include "format/pytorch_zip.h"

#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "common/checked_math.h"
#include "common/crc32.h"
#include "common/element_count.h"
#include "common/io.h"
#include "format/unpickler.h"
#include "shm/segment_format.h"

namespace ckpt::format {
namespace {

// Unsupported unless `e` holds its content as is (torch.save writes every entry STORED).
Status RequireStored(const std::string& path, const ZipEntry& e) {
  if (e.stored()) return Status::Ok();
  if (e.encrypted) return Unsupported(path + ": zip entry '" + e.name + "' is encrypted");
  return Unsupported(path + ": zip entry '" + e.name + "' is compressed (method " + std::to_string(e.method) +
                     "); only STORED entries, as torch.save writes them, are supported");
}

// Corrupt naming the member when `bytes` (its whole content) disagree with its CRC-32.
Status CheckCrc(const std::string& path, const ZipEntry& e, std::string_view bytes) {
  const uint32_t crc = Crc32(bytes.data(), bytes.size());
  if (crc == e.crc32) return Status::Ok();
  return Corrupt(CrcMismatch(path, e.name, crc, e.crc32));
}

// Plans one tensor view; `storage_start` is the storage record's first byte in the file.
Status PlanView(const PickledTensor& t, uint64_t storage_start, uint64_t storage_bytes, PlannedTensor* out) {
  const std::string where = "tensor '" + t.name + "'";
  if (t.name.empty() || t.name.size() > shm::kMaxNameBytes) return Corrupt("tensor '" + EscapedName(t.name) + "': bad name length");
  const uint64_t es = DTypeSize(t.dtype);
  if (t.storage_numel > storage_bytes / es) {
    return Corrupt(where + ": storage '" + t.storage_key + "' holds " + std::to_string(storage_bytes) +
                   " bytes, fewer than its " + std::to_string(t.storage_numel) + " elements");
  }
  const Result<uint64_t> counted = ElementCount(t.shape);
  if (!counted.ok()) return Corrupt(where + ": " + counted.status().message());
  const uint64_t numel = *counted;
  // (Bounds every dim, so the view's extent below stays within 128 bits.)
  if (numel > (uint64_t{1} << 62)) return Corrupt(where + ": too many elements");
  unsigned __int128 last = t.storage_offset;  // last: highest element index reached
  bool contiguous = true;
  uint64_t expect = 1;  // <= numel where numel > 0 (wraps harmlessly for an empty tensor)
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.strides[d] < 0) return Corrupt(where + ": negative stride");
    if (t.shape[d] != 1 && static_cast<uint64_t>(t.strides[d]) != expect) contiguous = false;
    expect *= t.shape[d] == 0 ? 1 : static_cast<uint64_t>(t.shape[d]);
  }
  out->name = t.name;
  out->dtype = t.dtype;
  out->shape = t.shape;
  const auto nbytes = CheckedMul(numel, es);
  if (!nbytes) return Corrupt(where + ": byte size overflows 64 bits");
  out->nbytes = *nbytes;
  if (numel == 0) {  // nothing to read
    out->file_offset = storage_start;
    return Status::Ok();
  }
  for (size_t d = 0; d < t.shape.size(); ++d) {
    last += static_cast<unsigned __int128>(t.shape[d] - 1) * static_cast<uint64_t>(t.strides[d]);
  }
  if (last >= t.storage_numel) {
    return Corrupt(where + ": view reaches element " + std::to_string(static_cast<uint64_t>(last)) +
                   " of a storage of " + std::to_string(t.storage_numel));
  }
  const auto offset_bytes = CheckedMul(t.storage_offset, es);
  const auto file_offset = offset_bytes ? CheckedAdd(storage_start, *offset_bytes) : std::nullopt;
  if (!file_offset) return Corrupt(where + ": storage offset overflows 64 bits");
  out->file_offset = *file_offset;
  if (!contiguous) {
    out->strides = t.strides;
    const auto source = CheckedMul(static_cast<uint64_t>(last - t.storage_offset + 1), es);
    if (!source) return Corrupt(where + ": view extent overflows 64 bits");
    out->source_bytes = *source;
  }
  return Status::Ok();
}

}  // namespace

std::string CrcMismatch(const std::string& path, const std::string& member, uint32_t computed, uint32_t stored) {
  char text[96];
  std::snprintf(text, sizeof(text), "CRC-32 %08x, but the archive's directory says %08x", computed, stored);
  return path + ": zip member '" + EscapedName(member) + "' is damaged: its bytes have " + text;
}

Status PlanPyTorchZipFile(const std::string& path, LoadPlan* plan) {
  CKPT_ASSIGN_OR_RETURN(auto file, OpenFileNoFollow(path));
  return PlanPyTorchZipFile(file, plan);
}

Status PlanPyTorchZipFile(const std::shared_ptr<const OpenedFile>& file, LoadPlan* plan) {
  const std::string& path = file->path;
  const uint64_t file_size = file->identity.size;
  const int raw_fd = file->fd.get();
  auto read = [&](void* buf, size_t n, uint64_t off) { return PreadFull(raw_fd, buf, n, off, path); };
  CKPT_ASSIGN_OR_RETURN(auto zip, ZipReader::Create(read, file_size, path));

  // The archive's records share one top-level folder, whatever torch named it.
  const ZipEntry* pkl = nullptr;
  for (const auto& e : zip->entries()) {
    const size_t slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      if (pkl) return Corrupt(path + ": more than one data.pkl in the archive");
      pkl = &e;
    }
  }
  if (!pkl) {
    return Unsupported(path + ": a zip archive without <archive>/data.pkl: not a PyTorch checkpoint");
  }
  const std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);  // keeps the '/'
  if (zip->Find(prefix + "constants.pkl")) {
    return Unsupported(path + ": a TorchScript archive (torch.jit.save), not a state dict saved by torch.save");
  }
  if (const ZipEntry* bo = zip->Find(prefix + "byteorder")) {
    CKPT_RETURN_IF_ERROR(RequireStored(path, *bo));
    std::string order(std::min<uint64_t>(bo->size, 16), '\0');
    CKPT_RETURN_IF_ERROR(read(order.data(), order.size(), bo->data_offset));
    if (order.size() == bo->size) CKPT_RETURN_IF_ERROR(CheckCrc(path, *bo, order));
    if (order != "little") return Unsupported(path + ": byte order '" + order + "'; only little-endian checkpoints are supported");
  }
  CKPT_RETURN_IF_ERROR(RequireStored(path, *pkl));
  if (pkl->size > kMaxPickleBytes) return Corrupt(path + ": data.pkl is larger than the limit");
  std::string pickle(pkl->size, '\0');
  CKPT_RETURN_IF_ERROR(read(pickle.data(), pickle.size(), pkl->data_offset));
  CKPT_RETURN_IF_ERROR(CheckCrc(path, *pkl, pickle));
  auto tensors = StateDictUnpickler::Parse(pickle);
  if (!tensors.ok()) return tensors.status().WithContext(path);

  const uint32_t file_index = static_cast<uint32_t>(plan->files.size());
  const size_t base = plan->tensors.size();
  std::vector<PlannedTensor> planned;
  planned.reserve(tensors->size());
  // Same storage, offset, shape, strides and dtype: the same bytes, stored once.
  std::map<std::tuple<std::string, uint64_t, std::vector<int64_t>, std::vector<int64_t>, DType>, size_t> views;
  std::vector<CrcCheck> checks;
  std::set<std::string> checked;  // storage records, each checked once
  for (const PickledTensor& t : *tensors) {
    const ZipEntry* rec = zip->Find(prefix + "data/" + t.storage_key);
    if (!rec) return Corrupt(path + ": tensor '" + t.name + "' uses storage '" + t.storage_key + "', which has no record");
    CKPT_RETURN_IF_ERROR(RequireStored(path, *rec));
    if (checked.insert(rec->name).second) {
      checks.push_back({file_index, rec->data_offset, rec->size, rec->crc32, rec->name});
    }
    PlannedTensor p;
    Status st = PlanView(t, rec->data_offset, rec->size, &p);
    if (!st.ok()) return st.WithContext(path);
    p.file_index = file_index;
    auto [it, inserted] = views.emplace(std::make_tuple(t.storage_key, t.storage_offset, t.shape, t.strides, t.dtype),
                                        base + planned.size());
    if (!inserted && p.nbytes > 0) p.alias_of = static_cast<int64_t>(it->second);
    planned.push_back(std::move(p));
  }
  for (auto& p : planned) plan->tensors.push_back(std::move(p));
  for (auto& c : checks) plan->crc_checks.push_back(std::move(c));
  plan->files.push_back(file);
  if (plan->format.empty()) plan->format = "pytorch";
  return Status::Ok();
}

}  // namespace ckpt::format

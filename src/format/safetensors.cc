#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/checked_math.h"
#include "common/element_count.h"
#include "common/io.h"
#include "format/json_keys.h"
#include "shm/segment_format.h"

namespace ckpt::format {
namespace {

using nlohmann::json;

Status Bad(const std::string& tensor, const std::string& what) {
  return Corrupt("safetensors tensor '" + tensor + "': " + what);
}

// Parses one tensor's description; on success fills `out` (offsets relative to the data).
Status ParseEntry(const std::string& name, const json& desc, uint64_t data_bytes,
                  PlannedTensor* out) {
  if (name.empty()) return Corrupt("safetensors header has a tensor with an empty name");
  if (name.size() > shm::kMaxNameBytes) return Bad(EscapedName(name.substr(0, 64)) + "...", "name too long");
  if (!desc.is_object()) return Bad(name, "description is not a JSON object");

  auto dtype_it = desc.find("dtype");
  if (dtype_it == desc.end() || !dtype_it->is_string()) return Bad(name, "missing string 'dtype'");
  auto dtype = DTypeFromName(dtype_it->get<std::string>());
  if (!dtype) return Unsupported("safetensors tensor '" + name + "': unknown dtype '" +
                                 dtype_it->get<std::string>() + "'");

  auto shape_it = desc.find("shape");
  if (shape_it == desc.end() || !shape_it->is_array()) return Bad(name, "missing array 'shape'");
  if (shape_it->size() > shm::kMaxDims) {
    return Unsupported("safetensors tensor '" + name + "': " + std::to_string(shape_it->size()) +
                       " dimensions, at most " + std::to_string(shm::kMaxDims) + " supported");
  }
  // Every dim must be a non-negative integer; the element count and bytes are checked.
  std::vector<int64_t> shape;
  for (const json& d : *shape_it) {
    if (!d.is_number_unsigned()) return Bad(name, "shape has a value that is not a non-negative integer");
    uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Bad(name, "shape is too large");
    shape.push_back(static_cast<int64_t>(v));
  }
  const Result<uint64_t> counted = ElementCount(shape);
  if (!counted.ok()) return Bad(name, "shape is too large (" + counted.status().message() + ")");
  const uint64_t numel = *counted;
  if (!CheckedMul(numel, DTypeBits(*dtype))) return Bad(name, "shape is too large (its bits overflow 64 bits)");
  const std::optional<uint64_t> tensor_bytes = TensorBytes(*dtype, numel);
  if (!tensor_bytes) {
    return Bad(name, std::to_string(numel) + " elements of " + std::to_string(DTypeBits(*dtype)) +
                         " bits are not a whole number of bytes");
  }
  const uint64_t bytes = *tensor_bytes;

  auto off_it = desc.find("data_offsets");
  if (off_it == desc.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
    return Bad(name, "'data_offsets' must be two non-negative integers");
  }
  uint64_t begin = (*off_it)[0].get<uint64_t>(), end = (*off_it)[1].get<uint64_t>();
  if (begin > end) return Bad(name, "data_offsets begin after they end");
  if (end > data_bytes) {
    return Bad(name, "data_offsets end at " + std::to_string(end) + ", beyond the " +
                         std::to_string(data_bytes) + " bytes of data in the file");
  }
  if (end - begin != bytes) {
    return Bad(name, "shape and dtype give " + std::to_string(bytes) + " bytes but data_offsets span " +
                         std::to_string(end - begin));
  }
  out->name = name;
  out->dtype = *dtype;
  out->shape = std::move(shape);
  out->file_offset = begin;
  out->nbytes = bytes;
  return Status::Ok();
}

}  // namespace

Status ParseSafetensorsHeader(std::string_view header_json, uint64_t data_start,
                              uint64_t data_bytes, uint32_t file_index, LoadPlan* plan,
                              std::map<std::string, std::string>* metadata) {
  // nlohmann keeps one value of a key given twice: duplicate tensor names are looked for
  // first, in one SAX pass (json_keys.h).
  json header = json::parse(header_json.begin(), header_json.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Corrupt("safetensors header is not valid JSON");
  if (auto duplicate = FirstDuplicateKey(header_json, 1)) {
    return Corrupt("safetensors header names tensor '" + EscapedName(*duplicate) + "' more than once");
  }
  if (!header.is_object()) return Corrupt("safetensors header is not a JSON object");

  std::vector<PlannedTensor> tensors;
  tensors.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Corrupt("safetensors __metadata__ is not a JSON object");
      for (const auto& v : *it) {
        if (!v.is_string()) return Corrupt("safetensors __metadata__ has a non-string value");
      }
      if (metadata) {
        for (auto m = it->begin(); m != it->end(); ++m) (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    PlannedTensor t;
    CKPT_RETURN_IF_ERROR(ParseEntry(it.key(), it.value(), data_bytes, &t));
    tensors.push_back(std::move(t));
  }

  // No two tensors may share bytes.
  std::vector<const PlannedTensor*> by_offset;
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->file_offset != b->file_offset ? a->file_offset < b->file_offset : a->nbytes < b->nbytes;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    if (by_offset[i]->file_offset < prev->file_offset + prev->nbytes) {
      return Corrupt("safetensors tensors '" + prev->name + "' and '" + by_offset[i]->name +
                     "' overlap");
    }
  }

  for (auto& t : tensors) {
    t.file_index = file_index;
    t.file_offset += data_start;
    plan->tensors.push_back(std::move(t));
  }
  return Status::Ok();
}

Status PlanSafetensorsFile(const std::shared_ptr<const OpenedFile>& file, LoadPlan* plan) {
  const std::string& path = file->path;
  const int fd = file->fd.get();
  const uint64_t file_size = file->identity.size;
  if (file_size < 8) return Corrupt(path + ": too short for a safetensors file (" +
                                    std::to_string(file_size) + " bytes)");
  unsigned char len_bytes[8];
  CKPT_RETURN_IF_ERROR(PreadFull(fd, len_bytes, 8, 0, path));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > file_size - 8) {
    return Corrupt(path + ": safetensors header of " + std::to_string(header_len) +
                   " bytes is longer than the file (" + std::to_string(file_size) + " bytes)");
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return Corrupt(path + ": safetensors header of " + std::to_string(header_len) +
                   " bytes exceeds the limit");
  }
  std::string header(header_len, '\0');
  CKPT_RETURN_IF_ERROR(PreadFull(fd, header.data(), header_len, 8, path));
  const uint64_t data_start = 8 + header_len;
  std::map<std::string, std::string> metadata;
  Status st = ParseSafetensorsHeader(header, data_start, file_size - data_start,
                                     static_cast<uint32_t>(plan->files.size()), plan, &metadata);
  if (!st.ok()) return st.WithContext(path);
  plan->files.push_back(file);
  for (auto& [k, v] : metadata) plan->metadata.emplace(k, std::move(v));
  if (plan->format.empty()) plan->format = "safetensors";
  return Status::Ok();
}

Status PlanSafetensorsFile(const std::string& path, LoadPlan* plan) {
  CKPT_ASSIGN_OR_RETURN(auto file, OpenFileNoFollow(path));
  return PlanSafetensorsFile(file, plan);
}

}  // namespace ckpt::format

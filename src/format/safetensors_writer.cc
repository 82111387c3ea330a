#include "format/safetensors_writer.h"

#include <nlohmann/json.hpp>
#include <set>

#include "common/checked_math.h"

namespace ckpt::format {

Result<std::string> SafetensorsPrefix(const std::vector<TensorInfo>& tensors,
                                      const std::map<std::string, std::string>& metadata, uint64_t* data_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  CheckedSum offset;
  for (const TensorInfo& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgument("a safetensors tensor cannot be named '" + t.name + "'");
    }
    if (!names.insert(t.name).second) return InvalidArgument("tensor '" + t.name + "' is given twice");
    CKPT_ASSIGN_OR_RETURN(const uint64_t begin, offset.Get("the tensors' sizes"));
    CKPT_ASSIGN_OR_RETURN(const uint64_t end, offset.Add(t.nbytes).Get("the tensors' sizes"));
    header[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {begin, end}}};
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(std::string("a tensor name or metadata value is not valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int b = 0; b < 8; ++b) out[static_cast<size_t>(b)] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * b));
  out += text;
  if (data_bytes != nullptr) *data_bytes = *offset.Get("the tensors' sizes");
  return out;
}

Result<std::string> SafetensorsFileBytes(const std::vector<TensorInfo>& tensors,
                                         const std::vector<std::string_view>& data,
                                         const std::map<std::string, std::string>& metadata) {
  if (data.size() != tensors.size()) return InvalidArgument("one data blob per tensor, in order");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (data[i].size() != tensors[i].nbytes) {
      return InvalidArgument("tensor '" + tensors[i].name + "': " + std::to_string(data[i].size()) +
                             " bytes of data, not its " + std::to_string(tensors[i].nbytes));
    }
  }
  uint64_t data_bytes = 0;
  CKPT_ASSIGN_OR_RETURN(std::string out, SafetensorsPrefix(tensors, metadata, &data_bytes));
  out.reserve(out.size() + data_bytes);
  for (std::string_view d : data) out.append(d);
  return out;
}

}  // namespace ckpt::format

#include "format/sharded_index.h"

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/io.h"
#include "format/json_keys.h"

namespace ckpt::format {

Status ParseShardIndex(std::string_view json_text, std::vector<std::string>* shards,
                       std::vector<std::pair<std::string, std::string>>* weight_map,
                       std::map<std::string, std::string>* metadata) {
  using nlohmann::json;
  // Duplicate tensor names in the weight map (nlohmann keeps one) are looked for first.
  json doc = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Corrupt("index is not valid JSON");
  if (auto duplicate = FirstDuplicateKey(json_text, 2, "weight_map")) {
    return Corrupt("weight_map names tensor '" + EscapedName(*duplicate) + "' more than once");
  }
  if (!doc.is_object()) return Corrupt("index is not a JSON object");
  auto wm = doc.find("weight_map");
  if (wm == doc.end() || !wm->is_object()) return Corrupt("index has no object 'weight_map'");
  std::unordered_map<std::string, size_t> seen;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) return Corrupt("weight_map entry '" + it.key() + "' is not a file name");
    const std::string& file = it->get_ref<const std::string&>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        file.find('\0') != std::string::npos) {
      return Corrupt("weight_map entry '" + it.key() + "' names '" + file + "', not a file beside the index");
    }
    if (seen.emplace(file, shards->size()).second) shards->push_back(file);
    weight_map->emplace_back(it.key(), file);
  }
  if (weight_map->empty()) return Corrupt("index has an empty weight_map");
  if (auto md = doc.find("metadata"); metadata && md != doc.end() && md->is_object()) {
    for (auto it = md->begin(); it != md->end(); ++it) {
      (*metadata)[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
    }
  }
  return Status::Ok();
}

Status PlanShardedCheckpoint(const OpenedFile& index,
                             const std::function<Status(const std::string&, LoadPlan*)>& plan_shard,
                             LoadPlan* plan) {
  const std::string& index_path = index.path;
  const uint64_t size = index.identity.size;
  if (size > kMaxIndexJsonBytes) return Corrupt(index_path + ": index larger than the limit");
  std::string text(size, '\0');
  CKPT_RETURN_IF_ERROR(PreadFull(index.fd.get(), text.data(), size, 0, index_path));
  CKPT_RETURN_IF_ERROR(index.CheckUnchanged());
  std::vector<std::string> shards;
  std::vector<std::pair<std::string, std::string>> weight_map;
  std::map<std::string, std::string> metadata;
  Status st = ParseShardIndex(text, &shards, &weight_map, &metadata);
  if (!st.ok()) return st.WithContext(index_path);

  LoadPlan out;
  out.format = plan->format;
  out.files = plan->files;
  std::unordered_map<std::string, std::string> found;  // tensor -> shard
  for (const std::string& shard : shards) {
    const size_t first = out.tensors.size();
    const uint32_t file_base = static_cast<uint32_t>(out.files.size());
    LoadPlan one;
    CKPT_RETURN_IF_ERROR(plan_shard(shard, &one));
    for (auto& f : one.files) out.files.push_back(std::move(f));
    for (auto& t : one.tensors) {
      auto [it, inserted] = found.emplace(t.name, shard);
      if (!inserted) {
        return Corrupt(index_path + ": tensor '" + t.name + "' is in both " + it->second + " and " + shard);
      }
      t.file_index += file_base;
      if (t.alias_of >= 0) t.alias_of += static_cast<int64_t>(first + plan->tensors.size());
      out.tensors.push_back(std::move(t));
    }
    if (out.format.empty()) out.format = one.format;
  }
  for (const auto& [tensor, shard] : weight_map) {
    auto it = found.find(tensor);
    if (it == found.end()) return Corrupt(index_path + ": tensor '" + tensor + "' is not in its shard " + shard);
    if (it->second != shard) {
      return Corrupt(index_path + ": tensor '" + tensor + "' is mapped to " + shard + " but found in " + it->second);
    }
  }
  if (found.size() != weight_map.size()) {
    std::unordered_map<std::string, std::string> listed(weight_map.begin(), weight_map.end());
    for (const auto& [tensor, shard] : found) {
      if (!listed.count(tensor)) return Corrupt(index_path + ": tensor '" + tensor + "' of " + shard + " is not in the weight_map");
    }
  }
  // Append: tensors of `plan` keep their indices, new aliases were shifted above.
  for (auto& t : out.tensors) plan->tensors.push_back(std::move(t));
  plan->files = std::move(out.files);
  plan->format = out.format;
  for (auto& [k, v] : metadata) plan->metadata.emplace(k, std::move(v));
  return Status::Ok();
}

}  // namespace ckpt::format

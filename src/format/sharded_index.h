// Sharded checkpoints: a `*.index.json` beside its shard files, as Hugging Face writes
// them ({"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "ckpt/status.h"
#include "format/load_plan.h"

namespace ckpt::format {

// Largest index.json read.
inline constexpr uint64_t kMaxIndexJsonBytes = 64ull << 20;

// Parses an index document: fills `shards` with the distinct shard file names in order of
// first appearance and `weight_map` with (tensor, shard) pairs, and `metadata` (if not
// null) with the index's "metadata" object (strings as they are, other values as JSON).
// Corrupt if it is not JSON, has no object "weight_map", names a tensor twice in it (found
// while parsing: nlohmann would keep one), a value is not a string, or a shard name is
// empty, absolute or has a '/' or "..": shards live beside the index.
Status ParseShardIndex(std::string_view json_text, std::vector<std::string>* shards,
                       std::vector<std::pair<std::string, std::string>>* weight_map,
                       std::map<std::string, std::string>* metadata = nullptr);

// Plans the sharded checkpoint whose index is the open file `index`: every shard named in
// the weight map is planned with `plan_shard(shard file name, plan)` (which opens it beside
// the index, beneath the folder's descriptor, and parses it), and
// the result must hold every tensor of the map exactly once, each in the shard that the
// map names. Appends to `plan` only on success. Errors: those of the index and the
// shards (with the shard's path), Corrupt for a tensor that is missing, in the wrong
// shard, not in the map, or present in two shards.
Status PlanShardedCheckpoint(const OpenedFile& index,
                             const std::function<Status(const std::string&, LoadPlan*)>& plan_shard,
                             LoadPlan* plan);

}  // namespace ckpt::format

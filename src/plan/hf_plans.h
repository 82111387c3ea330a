// transformers' own tensor-parallel plans, read as data: the "hf" convention for every model
// type that transformers can shard.
//
// The data is src/plan/hf_tp_plans.json, written by tools/gpu/gen_hf_plans.py from an
// installed transformers and embedded in the library at build time. Each model type's entry
// holds the model's full plan (`model.tp_plan`: module or parameter keys with `*` for layer
// numbers, mapped to transformers' style names), the plan with tied word embeddings where it
// differs, and the checkpoint conversions transformers applies at load (renames, fused MoE
// experts). PlanJson turns one entry into a plan in the file format of
// include/ckpt/tp_plan.h, so the engine shards as transformers does (docs/tp-plans.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ckpt/status.h"

namespace ckpt::hf_plans {

// The model types the embedded data holds, sorted.
const std::vector<std::string>& ModelTypes();
// True if the embedded data holds `model_type`.
bool Knows(const std::string& model_type);
// The transformers version the embedded data was generated from ("5.17.0").
const std::string& TransformersVersion();
// The model type whose entry's model class is `class_name` ("LlamaForCausalLM"), if any.
std::optional<std::string> ModelTypeOfClass(const std::string& class_name);
// The embedded entry of `model_type` as JSON text; NotFound if there is none.
Result<std::string> EntryJson(const std::string& model_type);

// The "hf" plan (tp_plan.h's file format) of `model_type` from `entry_json` (an entry of the
// data file's shape: the embedded one, or one read from a live transformers by
// python/ckpt/hf_plans.py), for the model whose config.json is `config_json` ("" = none: the
// entry's defaults, e.g. for tied embeddings). `source` names where the entry came from, for
// messages ("transformers 5.17.0"). InvalidArgument naming the model type, the key and the
// style for a style no rule knows, a conversion the engine cannot shard, or a bad entry.
Result<std::string> PlanJson(const std::string& model_type, const std::string& entry_json,
                             const std::string& config_json, const std::string& source);

}  // namespace ckpt::hf_plans

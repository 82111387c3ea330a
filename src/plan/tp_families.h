// The built-in family plans: for each model family and convention, a plan in the file
// format of include/ckpt/tp_plan.h, generated from the family's tensor names, its
// transformers TP plan (for "hf") and the model's config (head and expert counts).
// docs/tp-plans.md describes what each rank gets.
#pragma once

#include <string>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/tp_plan.h"

namespace ckpt::tp_families {

// config.json fields that give the routed expert count, in the spellings transformers'
// configs use (one list for the families' sizes and the "hf" plans' expert stacks).
inline const std::vector<const char*> kExpertCountFields = {"num_local_experts", "num_experts", "n_routed_experts",
                                                            "moe_num_experts"};

// Canonical family names.
std::vector<std::string> Names();
// The plan JSON of `family` (a canonical name or an alias) under `options`.
// InvalidArgument for an unknown family, a bad config, or a convention the family lacks.
Result<std::string> PlanJson(const std::string& family, const TpPlan::Options& options);
// The family of a config.json text: the built-in family of its model_type (else of its
// architectures), else its model_type (or the model type of its architectures) where
// transformers' plan data (hf_plans.h) has it. InvalidArgument naming both lists otherwise.
Result<std::string> FamilyOf(const std::string& config_json);
// The transformers model type whose plan data the "hf" convention of `family` uses: the
// config's own model_type where the data has it (a config is authoritative: "gemma3" names
// the Gemma 3 VLM, the built-in family "gemma3" its text model), else the family's
// model_type, else `family` itself. InvalidArgument for a config that is not JSON.
Result<std::string> HfModelType(const std::string& family, const std::string& config_json);
// The message for megatron-only options passed with the "hf" convention.
std::string HfOptionsError();

}  // namespace ckpt::tp_families

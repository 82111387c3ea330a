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

// Canonical family names.
std::vector<std::string> Names();
// The plan JSON of `family` (a canonical name or an alias) under `options`.
// InvalidArgument for an unknown family, a bad config, or a convention the family lacks.
Result<std::string> PlanJson(const std::string& family, const TpPlan::Options& options);
// The canonical family of a config.json text (model_type, else architectures).
Result<std::string> FamilyOf(const std::string& config_json);

}  // namespace ckpt::tp_families

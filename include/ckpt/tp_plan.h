// Tensor-parallel sharding plans: which rule applies to which tensor of a checkpoint,
// and what each rank's state dict holds (outputs made of one or several fused pieces).
//
//   auto plan = ckpt::TpPlan::BuiltIn("gpt-neo");              // or TpPlan::FromJsonFile(path)
//   auto outs = plan->Resolve(checkpoint.tensors(), rank, world);
//   // outs: one ShardOutput per tensor of the rank's state dict
//
// Plan file (JSON):
//   {"default": "replicate",                       // rule of tensors no entry matches
//    "rules": [                                     // first matching entry wins
//      {"pattern": "\\.(q|k|v)_proj\\.weight$", "rule": "column"},
//      {"pattern": "^(.*)\\.attn\\.c_attn\\.weight$", "rule": "conv1d_fused_qkv", "transpose": true},
//      {"pattern": "^(.*)\\.(q|k|v)_proj\\.weight$", "rule": "column",
//       "fuse_into": "$1.qkv_proj.weight", "fuse_key": 2, "fuse_order": ["q", "k", "v"]},
//      {"pattern": "wte", "rule": {"split": 0, "chunks": 1, "uneven": true}}]}
// Patterns are regular expressions (an ECMAScript subset: src/common/pattern.h) searched in
// the tensor name. Rules:
//   replicate          the whole tensor
//   column             Linear layout [out, in]: split dim 0 (weights and their biases)
//   row                Linear layout: split the last dim (a 1-d tensor is replicated)
//   vocab              split dim 0, uneven allowed (embeddings, lm_head)
//   fused_qkv          dim 0 holds q, k, v: each split (Linear layout, and fused biases)
//   conv1d_column      GPT-2 Conv1D layout [in, out]: split the last dim (1-d: dim 0)
//   conv1d_row         Conv1D layout: split dim 0 (a 1-d tensor is replicated)
//   conv1d_fused_qkv   Conv1D layout: the last dim holds q, k, v, each split
//   {"split": d, "chunks": k, "uneven": b}   the general form
// "transpose": true writes the (2-d) shard transposed. "fuse_into" names the output that
// the matching tensors' shards are concatenated into along dim 0, in "fuse_order" of the
// capture group "fuse_key" (pieces whose key is not listed come last, by name).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/shard.h"
#include "ckpt/status.h"
#include "ckpt/tensor.h"

namespace ckpt {

// One source tensor's shard inside an output.
struct ShardPiece {
  std::string source;  // tensor name in the checkpoint
  ShardSpec spec;
};

// One tensor of a rank's state dict: its pieces' shards concatenated along dim 0
// (one piece unless fused), optionally transposed (2-d only).
struct ShardOutput {
  std::string name;
  std::vector<ShardPiece> pieces;
  bool transpose = false;
};

class TpPlan {
 public:
  // Built-in plans for HF checkpoints of: "gpt-neo", "gpt2", "gptj", "llama", "mistral",
  // "bloom", "opt". Options: fuse_qkv fuses separate q/k/v projections into one
  // "...qkv_proj.weight" (and bias) output; transpose_conv1d writes GPT-2's Conv1D
  // weights in Linear layout. InvalidArgument for an unknown family.
  struct BuiltInOptions {
    bool fuse_qkv = false;
    bool transpose_conv1d = false;
  };
  static Result<TpPlan> BuiltIn(const std::string& family, const BuiltInOptions& options);
  static Result<TpPlan> BuiltIn(const std::string& family) { return BuiltIn(family, {}); }
  // The families BuiltIn knows.
  static std::vector<std::string> Families();
  // Parses a plan (format above). InvalidArgument naming the entry for bad JSON, a bad
  // regular expression, an unknown rule name, or a malformed fusion.
  static Result<TpPlan> FromJson(const std::string& json_text);
  static Result<TpPlan> FromJsonFile(const std::string& path);

  // Every tensor of `tensors` goes into exactly one output; outputs in the order of their
  // first source tensor. InvalidArgument if a rule does not fit a tensor (dim out of
  // range, a dimension world does not divide, rank/world out of range) or fused pieces
  // disagree in dtype or trailing shape, naming the tensor.
  Result<std::vector<ShardOutput>> Resolve(const std::vector<TensorInfo>& tensors, int rank,
                                           int world) const;

  struct Entry;  // internal
  TpPlan();
  ~TpPlan();
  TpPlan(TpPlan&&) noexcept;
  TpPlan& operator=(TpPlan&&) noexcept;
  TpPlan(const TpPlan&);
  TpPlan& operator=(const TpPlan&);

 private:
  std::vector<std::shared_ptr<const Entry>> entries_;
  std::string default_rule_ = "replicate";
};

// The dense layout of an output: dtype and shape of the concatenated (and possibly
// transposed) shards, and each piece's layout. InvalidArgument if a piece's tensor is
// missing or the pieces cannot be concatenated.
struct OutputLayout {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;            // after concatenation and transpose
  std::vector<ShardLayout> pieces;       // each piece's shard (before transpose)
  std::vector<uint64_t> piece_offsets;   // bytes into the concatenated (untransposed) output
  uint64_t nbytes = 0;
};
Result<OutputLayout> PlanOutput(const ShardOutput& output, const std::vector<TensorInfo>& tensors);

}  // namespace ckpt

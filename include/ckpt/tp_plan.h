// Tensor-parallel sharding plans: which rule applies to which tensor of a checkpoint, and
// what each rank's state dict holds (outputs made of one or several pieces of source
// tensors, optionally transposed or viewed in another shape). The one plan engine: the CUDA
// engine, the libtorch adapter and the Python module (CPU and GPU) all resolve plans here.
//
//   auto plan = ckpt::TpPlan::ForConfig(config_json, {.convention = ckpt::Convention::kHf});
//   // or TpPlan::BuiltIn("llama", options), TpPlan::FromJsonFile(path)
//   auto outs = plan->Resolve(checkpoint.tensors(), rank, world);
//   // outs: one ShardOutput per tensor of the rank's state dict
//
// Conventions (docs/tp-plans.md says exactly what each rank gets per family):
//   kHf        what transformers' own tensor parallelism (from_pretrained(tp_plan="auto"))
//              holds on each rank: its parameter names (per-expert MoE tensors fused into
//              3-d experts.gate_up_proj / down_proj as transformers converts them at load),
//              its split arithmetic (torch.chunk: ceil-sized parts), everything outside its
//              plan replicated.
//   kMegatron  the layout fused inference kernels use: vocabulary-parallel embedding and head
//              (torch.tensor_split parts), column/row parallel linears, key/value heads
//              replicated when the TP degree exceeds them, MoE experts split inside (TP) or
//              whole per rank (expert_parallel), router replicated; fusions on request.
//
// Plan file (JSON):
//   {"convention": "megatron",                     // or "hf" (informational + validation)
//    "default": "replicate",                       // rule of tensors no entry matches
//    "rules": [                                    // first matching entry wins
//      {"pattern": "\\.(q|k|v)_proj\\.weight$", "rule": "column"},
//      {"pattern": "^(.*)\\.(q|k|v)_proj\\.weight$", "rule": "column",
//       "fuse_into": "$1.qkv_proj.weight", "fuse_key": 2, "fuse_order": ["q", "k", "v"]},
//      {"pattern": "k_proj\\.weight$", "rule": {"split": 0, "heads": 2}},
//      {"pattern": "wte", "rule": {"split": 0, "uneven": true}}]}
// Patterns are regular expressions (PCRE2, the syntax of Python's `re` for what plans use)
// searched in the tensor name. Rule names:
//   replicate          the whole tensor
//   column             Linear [out, in]: split dim 0 (weights and their biases)
//   row                Linear: split the last dim (a 1-d tensor is replicated)
//   vocab              split dim 0, uneven allowed (torch.tensor_split parts)
//   fused_qkv          dim 0 holds q, k, v: each split (Linear layout, and fused biases)
//   conv1d_column      GPT-2 Conv1D [in, out]: split the last dim (1-d: dim 0)
//   conv1d_row         Conv1D: split dim 0 (a 1-d tensor is replicated)
//   conv1d_fused_qkv   Conv1D: the last dim holds q, k, v, each split
//   transformers' style names, with its arithmetic (uneven parts as torch.chunk):
//   colwise, colwise_gather_output, colwise_rep, local_colwise   weight dim -2, 1-d dim -1
//   rowwise, rowwise_split_input, rowwise_rep, local_rowwise     weight dim -1, "*.bias"
//                      replicated, other 1-d tensors split
//   packed_colwise     dim -2 holds 2 blocks (gate, up), each split; 1-d dim -1
//   packed_rowwise, local_packed_rowwise   dim -1 holds 2 blocks; bias replicated
//   embedding_rowwise / embedding_colwise  dim 0 / dim 1
//   grouped_gemm       dim 0 holds experts: whole experts per rank (their count % world == 0)
//   replicated_with_grad_allreduce, sequence_parallel, ep_router, moe_tp_experts, gather,
//   local, all_reduce, mla_kv_a_proj   replicated
//   The general form: {"split": d, "chunks": k, "uneven": false | true | "chunk",
//     "vector": "same" | "replicate" | "replicate_bias" | "dim0" | "last",
//     "heads": n,          dim (each chunk) holds n equal heads: n % world == 0, or, if
//                          n < world, world % n == 0 and rank r takes head r * n / world
//     "experts": n,        dim holds n experts: n % world == 0 (whole experts per rank)
//     "sections": [{"rows": r, "heads": n}, ...]   dim 0 holds sections of r rows, each
//                          split on its own (by its heads); the rank's parts are concatenated
//     }
//   {"expert": g, "experts": n}   the whole tensor, kept only by the rank that owns expert
//                          number <capture group g> (expert e belongs to rank e / (n / world));
//                          the other ranks' state dicts omit it
// Entry keys besides pattern/rule: "transpose": true writes the (2-d) shard transposed;
// "swap_dims": {"dims": [d0, d1], "unless": [k, n]} (transformers' Transpose at load, its
// check_dims as "unless") transposes a whole matching tensor's last two dims (d0, d1), not
// where its dim k is n already (then the other of the two must be n); a rule that splits
// such a tensor is refused;
// "fuse_into" names an output the matching tensors' shards are concatenated into along dim
// 0 ($n: capture groups), sorted by "fuse_key" (a group or a list of groups; a key listed in
// "fuse_order" sorts by its position there, all-digit keys numerically, others by text);
// "stack": g views the output with a new leading dim, one entry per distinct value of group
// g ("stack_count": n requires n of them, [n, m] n or m); "fuse_count": n requires the output to fuse exactly
// n source tensors; "fuse_dim": 1 concatenates the sources along dim 1 instead (a stacked
// [E, r, c] pair into [E, 2r, c]: each dim-0 index's slabs in fuse order, the output viewed
// [E, 2r', c']; "stack_count" counts E; a rule that splits dim 0 is refused);
// "if_absent": pattern applies the entry only when
// no tensor of the checkpoint matches that pattern (e.g. a tied embedding: no lm_head).
// "chunk_into": [name, ...] instead of a rule (transformers' Chunk conversion): a matching
// tensor is cut along dim 0 into that many equal parts (dim 0 must divide), part k a tensor
// named name_k ($n groups) of those rows, placed by the rule its own name matches. With
// "permute_for_rope": {"parts": [k, ...], "heads": n}, those parts' rows are reordered as
// transformers' PermuteForRope does: each of n heads' interleaved rotary pairs (rows 2j, 2j+1)
// become its two halves (rows j, half + j); such a part is whole or split along a later dim.
// With "interleave": {"dim": d} (d: the rows of each matrix, dim -2), an entry's tensor holds
// pairs of rows that transformers' Interleave takes apart (2j to j, 2j + 1 to half + j): the
// output holds them so, a split of those rows taking whole pairs; with a chunk_into of 2
// parts instead of a rule, part k is rows k, k + 2, ... of each matrix.
// Plan keys besides rules/default: "require": [{"pattern": p, "count": n, "what": text}]
// (p must match at least n tensors, else an error naming `what`), "max_world": {"world": n,
// "why": text} (larger worlds refused), "family", "comment", "block_scales" (below), and
// "renames": [{"search": pattern, "to": template, "scope": prefix, "base_prefix": prefix,
// "if_any": pattern}] (all but search/to optional; search and to may be equal-length lists,
// the branch matching leftmost applies): applied in order to every tensor name before the
// rules, as transformers' WeightRenaming: the matched text's first occurrence becomes `to`
// ($n groups); with a scope only names under "base_prefix.scope." or "scope." are renamed,
// the prefix kept; with if_any only in a checkpoint where some name matches it. The outputs
// keep the renamed names; two names renamed into one are an error. "not_renamed": [pattern,
// ...]: a name one of them matches is left as it is by every rename (transformers' loader keeps
// a name that is the model's own where its renames would make it a name the model lacks).
// FP8 block scales: a 2-d tensor named <weight> + "_scale_inv" of a 2-d <weight> in the
// checkpoint ([ceil(out / b0), ceil(in / b1)], one element per [b0, b1] block) is placed from
// its weight's shard, whatever rule its own name matches: each rank holds exactly the blocks
// of its weight shard (a replicated weight: the whole scale). "block_scales": {"suffix":
// "_scale_inv", "block": [128, 128]} (either key optional; these are the defaults) or false
// (off: such tensors follow their own rules). Built-in plans take "block" from config.json's
// quantization_config.weight_block_size. A fused weight's scale goes into the fused output's
// name + suffix (e.g. "...qkv_proj.weight_scale_inv", "...experts.gate_up_proj_scale_inv"),
// its pieces fused and stacked as the weights'. Resolve's InvalidArgument names the weight
// when a rank's range of it cuts a block, the scale is not its weight's block grid or has no
// weight, a fused weight's rank part is not whole blocks of rows, or a fused output mixes
// weights with and without scales.
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
  // The spec applies to rows row_begin, row_begin + row_step, ... (row_count of them) of the
  // source's dim 0 (a section of a fused tensor; a step > 1: every row_step-th row, as a
  // RoPE permutation takes them); row_count < 0: the whole tensor.
  int64_t row_begin = 0;
  int64_t row_count = -1;
  int64_t row_step = 1;
  // The rows are those of the source taken as 2-d [numel / last dim, last dim] (each matrix
  // of a stacked tensor in turn: transformers' Interleave of its rows), not of its dim 0.
  bool flat_rows = false;
};

// One tensor of a rank's state dict: its pieces' shards concatenated along dim 0 (one piece
// unless fused), then optionally transposed (its last two dims swapped; a 3-d or larger one
// only from one whole tensor) or viewed as `shape` (same number of elements, e.g. stacked
// experts [E, rows / E, ...]; not with transpose).
struct ShardOutput {
  std::string name;
  std::vector<ShardPiece> pieces;
  bool transpose = false;
  std::vector<int64_t> shape;  // empty: the concatenation's own shape
};

enum class Convention { kMegatron, kHf };
// "megatron" / "hf".
const char* ConventionName(Convention convention);
// InvalidArgument for anything but "megatron" / "hf".
Result<Convention> ParseConvention(const std::string& name);

class TpPlan {
 public:
  struct Options {
    Convention convention = Convention::kMegatron;
    // megatron: separate q/k/v projections into one "...qkv_proj.{weight,bias}" output.
    bool fuse_qkv = false;
    // megatron: gate/up projections (or w1/w3) into one "...gate_up_proj.weight" output.
    bool fuse_gate_up = false;
    // GPT-2: Conv1D weights written in Linear layout ([out, in]).
    bool transpose_conv1d = false;
    // megatron MoE: each rank keeps whole experts (expert parallelism) instead of a
    // tensor-parallel part of every expert.
    bool expert_parallel = false;
    // megatron MoE: per-expert tensors stacked into 3-d "...mlp.experts.gate_up_proj" /
    // "down_proj" outputs as transformers names them (hf always does).
    bool fuse_experts = false;
    // The model's config.json text ("" if none). Head and expert counts, tied embeddings
    // and the layer count come from it; without it heads are not checked, k/v are split
    // like q, and phi3/falcon (whose fused layouts need head counts) are refused.
    std::string config_json;
  };
  using BuiltInOptions = Options;

  // The built-in plan of `family` (Families(); aliases such as "gpt_neo", "gemma3_text"
  // accepted). InvalidArgument for an unknown family (naming the built-in ones and the plan
  // file format), a config that is not JSON or has a field of the wrong type, or a
  // convention the family lacks (hf for a family transformers has no plan for: refused,
  // naming "megatron").
  static Result<TpPlan> BuiltIn(const std::string& family, const Options& options);
  static Result<TpPlan> BuiltIn(const std::string& family) { return BuiltIn(family, Options{}); }
  // The built-in plan for the model `config_json` describes (its model_type, else its
  // architectures), with options.config_json set to it. InvalidArgument as BuiltIn, and for
  // a config naming no known family.
  static Result<TpPlan> ForConfig(const std::string& config_json, const Options& options);
  static Result<TpPlan> ForConfig(const std::string& config_json) { return ForConfig(config_json, Options{}); }
  // The "hf" plan of `model_type` from an entry of transformers' plan data (the shape of
  // src/plan/hf_tp_plans.json's entries, e.g. read from a live transformers by the Python
  // module), for the model of `config_json`; `source` names it in messages. InvalidArgument
  // naming the model type, the key and the style for what the engine cannot shard.
  static Result<TpPlan> FromHfEntry(const std::string& model_type, const std::string& entry_json,
                                    const std::string& config_json, const std::string& source);
  // The family ForConfig would pick, or InvalidArgument as ForConfig.
  static Result<std::string> FamilyOf(const std::string& config_json);
  // The families BuiltIn knows (canonical names).
  static std::vector<std::string> Families();
  // Parses a plan (format above). InvalidArgument naming the entry for bad JSON, a bad
  // regular expression, an unknown rule name or key, or a malformed fusion.
  static Result<TpPlan> FromJson(const std::string& json_text);
  static Result<TpPlan> FromJsonFile(const std::string& path);

  // Every tensor of `tensors` goes into at most one output (exactly one unless an "expert"
  // rule gives it to another rank); outputs in the order of their first source tensor.
  // InvalidArgument, naming the tensor (and the rule or config field), if a rule does not
  // fit a tensor (dim out of range, a dimension world does not divide, heads or experts that
  // do not divide over world or disagree with the tensor's shape), rank/world are out of
  // range, fused pieces disagree in dtype or trailing shape, a "require" entry is not met,
  // or no rule of a plan with rules matches any tensor (a wrong family), and for FP8 block
  // scales as above. A plan is
  // immutable: Resolve may run on several threads at once, and copies share the patterns.
  Result<std::vector<ShardOutput>> Resolve(const std::vector<TensorInfo>& tensors, int rank, int world) const;

  // The plan in the file format above (what a built-in plan is made of).
  const std::string& json() const { return json_; }
  Convention convention() const { return convention_; }
  // The built-in family ("" for a plan file without "family").
  const std::string& family() const { return family_; }

  struct Entry;   // internal
  struct Rename;  // internal
  TpPlan();
  ~TpPlan();
  TpPlan(TpPlan&&) noexcept;
  TpPlan& operator=(TpPlan&&) noexcept;
  TpPlan(const TpPlan&);
  TpPlan& operator=(const TpPlan&);

 private:
  std::vector<std::shared_ptr<const Entry>> entries_;
  std::shared_ptr<const Entry> default_;
  struct Requirement;
  class Resolution;  // one Resolve call's steps (src/plan/tp_plan.cc)
  std::vector<std::shared_ptr<const Requirement>> requirements_;
  std::vector<std::shared_ptr<const Rename>> renames_;  // applied in order before the rules
  struct NameSet;  // patterns (src/plan/tp_plan.cc)
  std::shared_ptr<const NameSet> not_renamed_;  // "not_renamed": names no rename touches
  std::string json_;
  std::string family_;
  Convention convention_ = Convention::kMegatron;
  int max_world_ = 0;  // > 0: Resolve refuses larger worlds, saying max_world_why_
  std::string max_world_why_;
  struct ScaleSettings;  // "block_scales" (src/plan/block_scales.h); null: the defaults
  std::shared_ptr<const ScaleSettings> block_scales_;
};

// The dense layout of an output: dtype and shape of the concatenated (and transposed or
// reshaped) shards, and each piece's layout. InvalidArgument if a piece's tensor is missing,
// its row range is outside the tensor, or the pieces cannot be concatenated or viewed so.
struct OutputLayout {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;            // final: after concatenation and transpose / view
  std::vector<ShardLayout> pieces;       // each piece's shard (regions relative to its source
                                         // tensor's first byte, before transpose)
  std::vector<uint64_t> piece_offsets;   // bytes into the concatenated (untransposed) output
  uint64_t nbytes = 0;
};
Result<OutputLayout> PlanOutput(const ShardOutput& output, const std::vector<TensorInfo>& tensors);

// Writes `output` (laid out as `layout`, from PlanOutput) into host memory `dst`:
// `sources[i]` is the first byte of piece i's source tensor. Transposes on the CPU.
// InvalidArgument (nothing written) if dst_size < layout.nbytes or sources do not match
// the pieces.
Status GatherOutput(const ShardOutput& output, const OutputLayout& layout, const std::vector<const std::byte*>& sources,
                    void* dst, size_t dst_size);

}  // namespace ckpt

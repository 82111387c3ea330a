// GPU copy engine: every shard on the GPU equals the reference slice (PlanShard +
// GatherShard on the host, then the same transpose and dtype conversion on the host) bit
// for bit, for every plan rule, transpose, fusion, dtype pair and host path. Skips
// without a GPU. Segments are written with SegmentWriter, no daemon needed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "ckpt/gpu.h"
#include "ckpt/tp_plan.h"
#include "cuda/copy_engine.h"
#include "cuda/copy_knobs.h"
#include "cuda/copy_split.h"
#include "cuda/cuda_resources.h"
#include "cuda/gpu_loader_impl.h"
#include "shm/segment_reader.h"
#include "shm/segment_writer.h"
#include "support/test_env.h"

namespace ckpt {
namespace {

// ---- host reference conversions (round to nearest even, as the GPU does) ----
uint32_t Bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float FromBits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint16_t F32ToF16(float f) {  // bit-exact IEEE round-to-nearest-even (FP16 library)
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = Bits(f), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = Bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
uint16_t F32ToBF16(float f) {
  uint32_t u = Bits(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float F16ToF32(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(float(m + 1024), e - 25);
  return s ? -v : v;
}
float BF16ToF32(uint16_t h) { return FromBits(uint32_t(h) << 16); }

double ReadAsDouble(DType t, const std::byte* p) {
  switch (t) {
    case DType::kF64: { double d; std::memcpy(&d, p, 8); return d; }
    case DType::kF32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::kF16: { uint16_t h; std::memcpy(&h, p, 2); return F16ToF32(h); }
    case DType::kBF16: { uint16_t h; std::memcpy(&h, p, 2); return BF16ToF32(h); }
    default: return 0;
  }
}
void WriteFrom(DType from, DType to, const std::byte* src, std::byte* dst) {
  if (from == to) { std::memcpy(dst, src, DTypeSize(from)); return; }
  double d = ReadAsDouble(from, src);
  switch (to) {
    case DType::kF64: std::memcpy(dst, &d, 8); break;
    case DType::kF32: { float f = static_cast<float>(d); std::memcpy(dst, &f, 4); break; }
    case DType::kF16: { uint16_t h = F32ToF16(static_cast<float>(d)); std::memcpy(dst, &h, 2); break; }
    case DType::kBF16: { uint16_t h = F32ToBF16(static_cast<float>(d)); std::memcpy(dst, &h, 2); break; }
    default: break;
  }
}
bool IsFloat(DType t) { return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// ---- a segment of random tensors ----
struct Segment {
  testing::ScratchSegmentDirectory dir;  // removed with the segment in it
  std::unique_ptr<shm::SegmentReader> reader;
  TensorSource Source() const {
    const shm::SegmentReader* r = reader.get();
    return TensorSource{&r->tensors(), [r](size_t i) { return r->tensor_data(i); }};
  }
};

// scales: per tensor, where given (else `scale` for all).
std::unique_ptr<Segment> MakeSegment(const std::vector<TensorInfo>& infos, uint32_t seed, double scale = 4.0,
                                     const std::vector<double>& scales = {}) {
  static int n = 0;
  auto seg = std::make_unique<Segment>();
  shm::SegmentSpec spec;
  (void)n;
  spec.directory = &seg->dir.dir();
  spec.checkpoint_name = "gpu-test";
  spec.source_path = "memory";
  spec.generation = 1;
  for (TensorInfo t : infos) {
    t.nbytes = NumElements(t.shape) * DTypeSize(t.dtype);
    spec.tensors.push_back(t);
  }
  auto writer = shm::SegmentWriter::Create(spec);
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  if (!writer.ok()) return nullptr;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, scale);
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorInfo& t = spec.tensors[i];
    std::byte* p = (*writer)->tensor_data(i);
    const uint64_t n_el = NumElements(t.shape), es = DTypeSize(t.dtype);
    const double k = i < scales.size() ? scales[i] / scale : 1.0;
    for (uint64_t e = 0; e < n_el; ++e) {
      double v = normal(rng) * k;
      if (IsFloat(t.dtype)) {
        WriteFrom(DType::kF64, t.dtype, reinterpret_cast<const std::byte*>(&v), p + e * es);
      } else {
        uint64_t r = rng();
        std::memcpy(p + e * es, &r, es);
      }
    }
    sums.push_back(shm::Checksum(p, t.nbytes));
  }
  EXPECT_TRUE((*writer)->Publish(sums, 1).ok());
  auto reader = testing::OpenSegmentReader(seg->dir.dir(), (*writer)->file_name());
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return nullptr;
  seg->reader = std::move(*reader);
  return seg;
}

// The reference bytes of `out` as the loader should produce them.
std::vector<std::byte> Reference(const Segment& seg, const ShardOutput& out, std::optional<DType> float_dtype,
                                 DType* to_out, std::vector<int64_t>* shape_out) {
  const auto& tensors = seg.reader->tensors();
  auto layout = PlanOutput(out, tensors);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  std::vector<std::byte> raw(layout->nbytes);
  for (size_t p = 0; p < out.pieces.size(); ++p) {
    const std::byte* src = seg.reader->tensor_data(seg.reader->Find(out.pieces[p].source));
    EXPECT_TRUE(GatherShard(layout->pieces[p], src, raw.data() + layout->piece_offsets[p],
                            raw.size() - layout->piece_offsets[p]).ok());
  }
  const DType from = layout->dtype;
  const uint64_t es = DTypeSize(from);
  if (out.transpose) {  // each matrix of the last two dims (after the swap)
    const size_t nd = layout->shape.size();
    const uint64_t cols = layout->shape[nd - 2], rows = layout->shape[nd - 1], m = rows * cols * es;
    std::vector<std::byte> t(raw.size());
    for (uint64_t b = 0; m > 0 && b < raw.size() / m; ++b)
      for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t c = 0; c < cols; ++c)
          std::memcpy(&t[b * m + (c * rows + r) * es], &raw[b * m + (r * cols + c) * es], es);
    raw.swap(t);
  }
  DType to = (float_dtype && IsFloat(from)) ? *float_dtype : from;
  *to_out = to;
  *shape_out = layout->shape;
  if (to == from) return raw;
  const uint64_t n = raw.size() / es;
  std::vector<std::byte> conv(n * DTypeSize(to));
  for (uint64_t i = 0; i < n; ++i) WriteFrom(from, to, &raw[i * es], &conv[i * DTypeSize(to)]);
  return conv;
}

void ExpectMatches(const Segment& seg, const std::vector<ShardOutput>& outs, const GpuStateDict& dict,
                   std::optional<DType> float_dtype, const std::string& what) {
  ASSERT_EQ(dict.tensors().size(), outs.size()) << what;
  for (const ShardOutput& out : outs) {
    DType to;
    std::vector<int64_t> shape;
    std::vector<std::byte> ref = Reference(seg, out, float_dtype, &to, &shape);
    ASSERT_TRUE(dict.contains(out.name)) << what << " " << out.name;
    const GpuTensor& g = dict.at(out.name);
    EXPECT_EQ(g.dtype, to) << what << " " << out.name;
    EXPECT_EQ(g.shape, shape) << what << " " << out.name;
    ASSERT_EQ(g.nbytes, ref.size()) << what << " " << out.name;
    std::vector<std::byte> got(g.nbytes);
    ASSERT_EQ(cudaMemcpy(got.data(), g.data, g.nbytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == ref) << what << " " << out.name << " differs from the reference slice";
  }
}

// Every tensor of `seg` whole, as one rank of one resolves them (a family plan would refuse
// a checkpoint none of its rules fits); with `only`, just the output of that name.
std::vector<ShardOutput> WholeOutputs(const Segment& seg, const std::string& only = "") {
  auto plan = TpPlan::FromJson(R"({"default": "replicate"})");
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  auto outs = plan->Resolve(seg.reader->tensors(), 0, 1);
  EXPECT_TRUE(outs.ok()) << outs.status().ToString();
  std::vector<ShardOutput> kept;
  for (ShardOutput& out : *outs)
    if (only.empty() || out.name == only) kept.push_back(std::move(out));
  return kept;
}

class GpuLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GpuAvailable()) GTEST_SKIP() << "no CUDA GPU here";
  }
};

const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI32};
const HostPath kPaths[] = {HostPath::kRegister, HostPath::kBounce, HostPath::kPageable};

std::vector<TensorInfo> RuleTensors() {
  std::vector<TensorInfo> infos;
  for (DType d : kDTypes) {
    std::string n = DTypeName(d);
    infos.push_back({n + ".w", d, {96, 1152}, 0, 0});
    infos.push_back({n + ".b", d, {96}, 0, 0});
    infos.push_back({n + ".v", d, {25, 64}, 0, 0});
  }
  return infos;
}

TEST_F(GpuLoaderTest, EveryRuleDtypeAndPathMatchesTheReference) {
  auto seg = MakeSegment(RuleTensors(), 1);
  ASSERT_TRUE(seg);
  const char* rules[] = {"replicate", "column", "row", "vocab", "fused_qkv", "conv1d_column", "conv1d_row", "conv1d_fused_qkv"};
  const std::optional<DType> targets[] = {std::nullopt, DType::kF16, DType::kBF16, DType::kF32, DType::kF64};
  for (const char* rule : rules) {
    for (bool transpose : {false, true}) {
      std::string json = std::string(R"({"rules": [{"pattern": "\\.v$", "rule": "vocab"},)") +
                         R"({"pattern": "\\.w$", "rule": ")" + rule + R"(", "transpose": )" +
                         (transpose ? "true" : "false") + R"(}, {"pattern": "\\.b$", "rule": ")" + rule + R"("}]})";
      auto plan = TpPlan::FromJson(json);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      for (int world : {1, 2, 4}) {
        for (int rank = 0; rank < world; ++rank) {
          auto outs = plan->Resolve(seg->reader->tensors(), rank, world);
          ASSERT_TRUE(outs.ok()) << outs.status().ToString();
          for (HostPath path : kPaths) {
            for (auto target : targets) {
              GpuLoadOptions o;
              o.path = path;
              o.chunk_bytes = 64 << 10;  // many chunks per tensor
              o.streams = 3;
              o.register_group_bytes = 12 << 10;  // copies split at registration boundaries
              o.register_threads = 2;
              o.float_dtype = target;
              auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
              ASSERT_TRUE(loader.ok()) << loader.status().ToString();
              auto dict = (*loader)->Load(*outs);
              std::string what = std::string(rule) + (transpose ? " transposed" : "") + " rank " +
                                 std::to_string(rank) + "/" + std::to_string(world) + " " + HostPathName(path) +
                                 " to " + (target ? DTypeName(*target) : "same");
              ASSERT_TRUE(dict.ok()) << what << ": " << dict.status().ToString();
              ExpectMatches(*seg, *outs, *dict, target, what);
              if (HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST_F(GpuLoaderTest, FusedQkvAndBuiltInFamilies) {
  // A two-layer GPT-Neo / GPT-2 / LLaMA-shaped state dict (fp32, hidden 64, vocab 50).
  std::vector<TensorInfo> infos = {
      {"transformer.wte.weight", DType::kF32, {50, 64}, 0, 0},
      {"transformer.h.0.attn.attention.q_proj.weight", DType::kF32, {64, 64}, 0, 0},
      {"transformer.h.0.attn.attention.k_proj.weight", DType::kF32, {64, 64}, 0, 0},
      {"transformer.h.0.attn.attention.v_proj.weight", DType::kF32, {64, 64}, 0, 0},
      {"transformer.h.0.attn.attention.out_proj.weight", DType::kF32, {64, 64}, 0, 0},
      {"transformer.h.0.attn.attention.out_proj.bias", DType::kF32, {64}, 0, 0},
      {"transformer.h.0.mlp.c_fc.weight", DType::kF32, {256, 64}, 0, 0},
      {"transformer.h.0.mlp.c_fc.bias", DType::kF32, {256}, 0, 0},
      {"transformer.h.0.mlp.c_proj.weight", DType::kF32, {64, 256}, 0, 0},
      {"h.1.attn.c_attn.weight", DType::kF32, {64, 192}, 0, 0},
      {"h.1.attn.c_attn.bias", DType::kF32, {192}, 0, 0},
      {"h.1.attn.c_proj.weight", DType::kF32, {64, 64}, 0, 0},
      {"h.1.mlp.c_fc.weight", DType::kF32, {64, 256}, 0, 0},
      {"model.layers.0.self_attn.q_proj.weight", DType::kBF16, {64, 64}, 0, 0},
      {"model.layers.0.self_attn.k_proj.weight", DType::kBF16, {32, 64}, 0, 0},
      {"model.layers.0.self_attn.v_proj.weight", DType::kBF16, {32, 64}, 0, 0},
      {"model.layers.0.self_attn.o_proj.weight", DType::kBF16, {64, 64}, 0, 0},
      {"model.layers.0.self_attn.q_proj.bias", DType::kBF16, {64}, 0, 0},
      {"model.layers.0.self_attn.k_proj.bias", DType::kBF16, {32}, 0, 0},
      {"model.layers.0.self_attn.v_proj.bias", DType::kBF16, {32}, 0, 0},
  };
  auto seg = MakeSegment(infos, 2);
  ASSERT_TRUE(seg);
  for (const char* family : {"gpt-neo", "gpt2", "llama"}) {
    for (bool fuse : {false, true}) {
      TpPlan::BuiltInOptions bo;
      bo.fuse_qkv = fuse;
      bo.transpose_conv1d = fuse;
      auto plan = TpPlan::BuiltIn(family, bo);
      ASSERT_TRUE(plan.ok());
      for (int world : {1, 2, 4}) {
        for (int rank = 0; rank < world; ++rank) {
          auto outs = plan->Resolve(seg->reader->tensors(), rank, world);
          ASSERT_TRUE(outs.ok()) << outs.status().ToString();
          if (fuse && std::string(family) == "llama") {
            bool found = false;
            for (const auto& o : *outs) found |= o.name == "model.layers.0.self_attn.qkv_proj.weight" && o.pieces.size() == 3;
            EXPECT_TRUE(found);
          }
          for (HostPath path : kPaths) {
            GpuLoadOptions o;
            o.path = path;
            o.float_dtype = DType::kF16;
            auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
            ASSERT_TRUE(loader.ok());
            auto dict = (*loader)->Load(*outs);
            ASSERT_TRUE(dict.ok()) << dict.status().ToString();
            ExpectMatches(*seg, *outs, *dict, o.float_dtype,
                          std::string(family) + (fuse ? " fused" : "") + " " + std::to_string(rank) + "/" +
                              std::to_string(world) + " " + HostPathName(path));
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

// The plan engine's newer outputs through the CUDA engine: row-range pieces (phi3's fused
// qkv_proj under megatron), 3-d views of stacked per-expert tensors (mixtral under hf, and
// megatron with fuse_experts / expert_parallel) and 3-d expert tensors (gpt_oss). The
// reference is the CPU gather of the same outputs (tp_families_test holds that to torch).
TEST_F(GpuLoaderTest, SectionsAndStackedExpertsMatchTheCpuPath) {
  std::vector<TensorInfo> infos;
  const std::string L = "model.layers.0.";
  for (const char* p : {"q", "k", "v"}) infos.push_back({L + "self_attn." + p + "_proj.weight", DType::kBF16, {std::string(p) == "q" ? 16 : 8, 16}, 0, 0});
  infos.push_back({L + "self_attn.o_proj.weight", DType::kBF16, {16, 16}, 0, 0});
  for (int e = 0; e < 4; ++e) {
    for (const char* w : {"w1", "w3"}) infos.push_back({L + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight", DType::kBF16, {8, 16}, 0, 0});
    infos.push_back({L + "block_sparse_moe.experts." + std::to_string(e) + ".w2.weight", DType::kBF16, {16, 8}, 0, 0});
  }
  infos.push_back({L + "block_sparse_moe.gate.weight", DType::kBF16, {4, 16}, 0, 0});
  auto seg = MakeSegment(infos, 5);
  ASSERT_TRUE(seg);
  const std::string config = R"({"model_type": "mixtral", "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "head_dim": 4, "hidden_size": 16, "num_hidden_layers": 1, "num_local_experts": 4})";
  struct Case { Convention c; bool fuse, ep; } cases[] = {
      {Convention::kHf, false, false}, {Convention::kMegatron, true, false}, {Convention::kMegatron, true, true},
      {Convention::kMegatron, false, true}};
  for (const Case& k : cases) {
    TpPlan::Options o;
    o.convention = k.c;
    o.fuse_experts = k.fuse;
    o.expert_parallel = k.ep;
    auto plan = TpPlan::ForConfig(config, o);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int world : {1, 2, 4}) {
      for (int rank = 0; rank < world; ++rank) {
        auto outs = plan->Resolve(seg->reader->tensors(), rank, world);
        ASSERT_TRUE(outs.ok()) << outs.status().ToString();
        for (HostPath path : kPaths) {
          GpuLoadOptions lo;
          lo.path = path;
          auto loader = GpuLoaderImpl::Create(seg->Source(), 0, lo);
          ASSERT_TRUE(loader.ok());
          auto dict = (*loader)->Load(*outs);
          ASSERT_TRUE(dict.ok()) << dict.status().ToString();
          ExpectMatches(*seg, *outs, *dict, std::nullopt,
                        std::string(ConventionName(k.c)) + (k.fuse ? " fused" : "") + (k.ep ? " ep " : " ") +
                            std::to_string(rank) + "/" + std::to_string(world) + " " + HostPathName(path));
          if (HasFailure()) return;
        }
      }
    }
  }
  // phi3's fused qkv_proj: three row-range pieces of one tensor.
  std::vector<TensorInfo> phi = {{L + "self_attn.qkv_proj.weight", DType::kF32, {32, 16}, 0, 0},
                                 {L + "self_attn.o_proj.weight", DType::kF32, {16, 16}, 0, 0},
                                 {L + "mlp.gate_up_proj.weight", DType::kF32, {48, 16}, 0, 0}};
  auto pseg = MakeSegment(phi, 6);
  ASSERT_TRUE(pseg);
  auto pplan = TpPlan::ForConfig(R"({"model_type": "phi3", "num_attention_heads": 4, "num_key_value_heads": 2,
                                     "head_dim": 4, "hidden_size": 16, "num_hidden_layers": 1})");
  ASSERT_TRUE(pplan.ok()) << pplan.status().ToString();
  for (int world : {2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      auto outs = pplan->Resolve(pseg->reader->tensors(), rank, world);
      ASSERT_TRUE(outs.ok()) << outs.status().ToString();
      GpuLoadOptions to_f16;  // row-range pieces converted on the GPU
      to_f16.float_dtype = DType::kF16;
      auto loader = GpuLoaderImpl::Create(pseg->Source(), 0, to_f16);
      ASSERT_TRUE(loader.ok());
      auto dict = (*loader)->Load(*outs);
      ASSERT_TRUE(dict.ok()) << dict.status().ToString();
      ExpectMatches(*pseg, *outs, *dict, DType::kF16, "phi3 " + std::to_string(rank) + "/" + std::to_string(world));
      if (HasFailure()) return;
    }
  }
}

// transformers' load-time conversions (issue 25): RoPE-permuted chunks (stepped rows, whole
// and split along their columns), a dim-1 concatenation of stacked experts split per block,
// and 3-d transposes (one job per expert matrix), on every host path, converted to f16 too.
TEST_F(GpuLoaderTest, LoadTimeConversionsMatchTheCpuPath) {
  std::vector<TensorInfo> infos = {{"v.wqkv.weight", DType::kF32, {3 * 32, 24}, 0, 0},
                                   {"v.wqkv.bias", DType::kBF16, {3 * 32}, 0, 0},
                                   {"m.gate.w", DType::kBF16, {4, 16, 24}, 0, 0},
                                   {"m.up.w", DType::kBF16, {4, 16, 24}, 0, 0},
                                   {"m.experts.down", DType::kF32, {4, 16, 24}, 0, 0},
                                   {"m.experts.keep", DType::kF32, {4, 24, 16}, 0, 0},
                                   {"m.experts.w13", DType::kF32, {4, 16, 24}, 0, 0},
                                   {"m.w13_dn", DType::kBF16, {16, 24}, 0, 0}};
  auto seg = MakeSegment(infos, 9);
  ASSERT_TRUE(seg);
  auto plan = TpPlan::FromJson(R"J({"rules": [
      {"pattern": "^(.*?)wqkv(.*)$", "chunk_into": ["$1q$2", "$1k$2", "$1v$2"],
       "permute_for_rope": {"parts": [0, 1], "heads": 4}},
      {"pattern": "\\.k\\.weight$", "rule": "rowwise"},
      {"pattern": "^(m\\.)(gate|up)(\\.w)$", "rule": {"split": -2}, "fuse_into": "$1gate_up", "fuse_key": 2,
       "fuse_order": ["gate", "up"], "fuse_dim": 1, "stack_count": 4},
      {"pattern": "experts\\.(down|keep)$", "rule": "replicate", "swap_dims": {"dims": [1, 2], "unless": [1, 24]}},
      {"pattern": "^(m\\.experts\\.)w13$", "rule": "colwise", "interleave": {"dim": 1}, "fuse_into": "$1gate_up_i"},
      {"pattern": "^(m\\.)w13_dn(.*)$", "chunk_into": ["$1g$2", "$1u$2"], "interleave": {"dim": 0}},
      {"pattern": "^m\\.(g|u)$", "rule": "colwise"}]})J");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (int world : {1, 2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      auto outs = plan->Resolve(seg->reader->tensors(), rank, world);
      ASSERT_TRUE(outs.ok()) << outs.status().ToString();
      for (HostPath path : kPaths) {
        for (std::optional<DType> to : {std::optional<DType>(), std::optional<DType>(DType::kF16)}) {
          GpuLoadOptions lo;
          lo.path = path;
          lo.float_dtype = to;
          auto loader = GpuLoaderImpl::Create(seg->Source(), 0, lo);
          ASSERT_TRUE(loader.ok());
          auto dict = (*loader)->Load(*outs);
          ASSERT_TRUE(dict.ok()) << dict.status().ToString();
          ExpectMatches(*seg, *outs, *dict, to, std::to_string(rank) + "/" + std::to_string(world) + " " +
                                                    HostPathName(path) + (to ? " to f16" : ""));
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_F(GpuLoaderTest, BadInputIsAClearErrorAndNothingIsReturned) {
  auto seg = MakeSegment({{"w", DType::kF32, {8, 8}, 0, 0}}, 3, /*scale=*/1e6);  // beyond fp16 range
  ASSERT_TRUE(seg);
  // Every tensor whole (a family plan would refuse a checkpoint none of its rules fits).
  auto plan = TpPlan::FromJson(R"({"default": "replicate"})");
  // Nonexistent device.
  auto bad_device = GpuLoaderImpl::Create(seg->Source(), 4096, {});
  ASSERT_FALSE(bad_device.ok());
  EXPECT_EQ(bad_device.status().code(), StatusCode::kInvalidArgument) << bad_device.status().ToString();
  // float -> int.
  GpuLoadOptions to_int;
  to_int.float_dtype = DType::kI32;
  auto bad_dtype = GpuLoaderImpl::Create(seg->Source(), 0, to_int);
  ASSERT_FALSE(bad_dtype.ok());
  EXPECT_EQ(bad_dtype.status().code(), StatusCode::kInvalidArgument);
  // Rank out of range.
  EXPECT_EQ(plan->Resolve(seg->reader->tensors(), 2, 2).status().code(), StatusCode::kInvalidArgument);
  // Overflowing conversion, refused unless allowed.
  auto outs = plan->Resolve(seg->reader->tensors(), 0, 1);
  ASSERT_TRUE(outs.ok());
  for (HostPath path : kPaths) {
    GpuLoadOptions o;
    o.path = path;
    o.float_dtype = DType::kF16;
    auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
    ASSERT_TRUE(loader.ok());
    auto dict = (*loader)->Load(*outs);
    ASSERT_FALSE(dict.ok());
    EXPECT_EQ(dict.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(dict.status().message().find("'w'"), std::string::npos) << dict.status().ToString();
    o.allow_overflow = true;
    auto loader2 = GpuLoaderImpl::Create(seg->Source(), 0, o);
    ASSERT_TRUE(loader2.ok());
    EXPECT_TRUE((*loader2)->Load(*outs).ok());
  }
  // Device OOM: a 1 PiB tensor (never read: allocation fails first).
  std::vector<TensorInfo> huge = {{"huge", DType::kF32, {int64_t(1) << 38, 1024}, (uint64_t(1) << 50), 0}};
  std::byte dummy[64] = {};
  auto loader = GpuLoaderImpl::Create(TensorSource{&huge, [&](size_t) -> const std::byte* { return dummy; }}, 0, {});
  ASSERT_TRUE(loader.ok());
  auto huge_outs = plan->Resolve(huge, 0, 1);
  ASSERT_TRUE(huge_outs.ok());
  auto dict = (*loader)->Load(*huge_outs);
  ASSERT_FALSE(dict.ok());
  EXPECT_EQ(dict.status().code(), StatusCode::kResourceExhausted) << dict.status().ToString();
  // The device still works afterwards.
  auto small = GpuLoaderImpl::Create(seg->Source(), 0, {});
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE((*small)->Load(*outs).ok());
}

// ---- issue 14: the copy workers' resources, made once per loader ----

// Sets CKPT_COPY_BUFFERS for the loaders created in its scope.
struct BuffersEnv {
  explicit BuffersEnv(int n) { setenv("CKPT_COPY_BUFFERS", std::to_string(n).c_str(), 1); }
  ~BuffersEnv() { unsetenv("CKPT_COPY_BUFFERS"); }
};

// A loader makes its pinned slab once (in the background from Create on) and every later
// Load reuses it and the streams; with 1 to 8 buffers per worker, conversions,
// transposes and strided shards, every Load of the same loader still matches the
// reference. (Before: one slab per Load.)
TEST_F(GpuLoaderTest, ALoaderMakesItsPinnedBuffersOnceAndEveryLoadMatches) {
  auto seg = MakeSegment(RuleTensors(), 7);
  ASSERT_TRUE(seg);
  auto plan = TpPlan::FromJson(R"({"rules": [{"pattern": "\\.v$", "rule": "vocab"},)"
                               R"({"pattern": "\\.w$", "rule": "row", "transpose": true},)"
                               R"({"pattern": "\\.b$", "rule": "column"}]})");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (int buffers : {1, 2, 3, 8}) {
    BuffersEnv env(buffers);
    ASSERT_EQ(cuda::CurrentCopyKnobs().buffers, buffers);
    GpuLoadOptions o;
    o.chunk_bytes = 64 << 10;
    o.streams = 3;
    const std::optional<DType> target = buffers % 2 ? std::optional<DType>(DType::kF16) : std::nullopt;
    o.float_dtype = target;
    const uint64_t before = cuda::PinnedBuffer::allocations();
    auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    for (int rep = 0; rep < 4; ++rep) {
      const int world = rep % 2 ? 2 : 4, rank = rep % world;
      auto outs = plan->Resolve(seg->reader->tensors(), rank, world);
      ASSERT_TRUE(outs.ok()) << outs.status().ToString();
      auto dict = (*loader)->Load(*outs);
      const std::string what = std::to_string(buffers) + " buffers, load " + std::to_string(rep);
      ASSERT_TRUE(dict.ok()) << what << ": " << dict.status().ToString();
      ExpectMatches(*seg, *outs, *dict, target, what);
      if (HasFailure()) return;
    }
    EXPECT_EQ(cuda::PinnedBuffer::allocations() - before, 1u) << buffers << " buffers: pinned slabs made for 4 loads";
  }
}

// The overflow flags are reused too: an overflow found by one Load must not be reported
// again by the next Load of the same loader (one worker, so the same flag).
TEST_F(GpuLoaderTest, AnOverflowInOneLoadIsNotReportedByTheNextOnTheSameLoader) {
  auto seg = MakeSegment({{"big", DType::kF32, {8, 8}, 0, 0}, {"small", DType::kF32, {8, 8}, 0, 0}}, 9, 1.0,
                         {1e6, 1.0});  // big: beyond fp16 range
  ASSERT_TRUE(seg);
  const std::vector<ShardOutput> all = WholeOutputs(*seg), small_only = WholeOutputs(*seg, "small");
  ASSERT_EQ(small_only.size(), 1u);
  for (HostPath path : kPaths) {
    GpuLoadOptions o;
    o.path = path;
    o.streams = 1;
    o.float_dtype = DType::kF16;
    auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
    ASSERT_TRUE(loader.ok());
    auto bad = (*loader)->Load(all);
    ASSERT_FALSE(bad.ok()) << HostPathName(path);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("'big'"), std::string::npos) << bad.status().ToString();
    for (int rep = 0; rep < 2; ++rep) {
      auto good = (*loader)->Load(small_only);
      ASSERT_TRUE(good.ok()) << HostPathName(path) << " load " << rep << ": " << good.status().ToString();
      ExpectMatches(*seg, small_only, *good, DType::kF16, std::string(HostPathName(path)) + " after an overflow");
    }
  }
}

// Loaders destroyed at once, while their resources are still being prepared on the
// background thread, stop cleanly (the thread is joined, nothing leaks into the next).
TEST_F(GpuLoaderTest, LoadersDestroyedWhilePreparingStopCleanly) {
  auto seg = MakeSegment(RuleTensors(), 8);
  ASSERT_TRUE(seg);
  GpuLoadOptions o;
  o.streams = 16;
  for (int i = 0; i < 20; ++i) {
    auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  }
  const std::vector<ShardOutput> outs = WholeOutputs(*seg);
  auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
  ASSERT_TRUE(loader.ok());
  auto dict = (*loader)->Load(outs);
  ASSERT_TRUE(dict.ok()) << dict.status().ToString();
  ExpectMatches(*seg, outs, *dict, std::nullopt, "after 20 loaders destroyed while preparing");
}

// Workers are prepared one by one in the background and a Load starts with those ready:
// a Load right after Create, on a loader with 64 workers (most not ready yet), is
// correct, finds an overflow in whatever worker converted it, and the next Load of the
// same loader (more workers ready, their flags never set) reports none.
TEST_F(GpuLoaderTest, ALoadRightAfterCreateUsesTheWorkersReadySoFar) {
  auto seg = MakeSegment({{"big", DType::kF32, {64, 512}, 0, 0}, {"small", DType::kF32, {256, 512}, 0, 0}}, 10, 1.0,
                         {1e6, 1.0});
  ASSERT_TRUE(seg);
  const std::vector<ShardOutput> all = WholeOutputs(*seg), small_only = WholeOutputs(*seg, "small");
  ASSERT_EQ(small_only.size(), 1u);
  for (int trial = 0; trial < 6; ++trial) {
    GpuLoadOptions o;
    o.streams = 64;
    o.chunk_bytes = 64 << 10;  // 8 + 8 tasks: fewer than the workers
    const bool convert = trial % 2 == 1;
    if (convert) o.float_dtype = DType::kF16;
    auto loader = GpuLoaderImpl::Create(seg->Source(), 0, o);
    ASSERT_TRUE(loader.ok());
    auto first = (*loader)->Load(all);
    if (convert) {
      ASSERT_FALSE(first.ok()) << "trial " << trial;
      EXPECT_NE(first.status().message().find("'big'"), std::string::npos) << first.status().ToString();
    } else {
      ASSERT_TRUE(first.ok()) << first.status().ToString();
      ExpectMatches(*seg, all, *first, std::nullopt, "right after Create, trial " + std::to_string(trial));
    }
    for (int rep = 0; rep < 3; ++rep) {
      auto next = (*loader)->Load(small_only);
      ASSERT_TRUE(next.ok()) << "trial " << trial << " load " << rep << ": " << next.status().ToString();
      ExpectMatches(*seg, small_only, *next, o.float_dtype, "trial " + std::to_string(trial));
    }
    if (HasFailure()) return;
  }
}

// Issue 14: a Load's device memory is allocated while its workers already gather into
// their bounce buffers (CopyDestination::allocate, called after they start). An
// allocation that fails then ends the run with its own error on every host path, no
// copy having reached the device and nothing left in flight, and the same resources
// serve the next run, whose bytes all arrive.
TEST_F(GpuLoaderTest, AnAllocationThatFailsAfterTheWorkersStartedEndsTheRunCleanly) {
  std::vector<std::byte> host(size_t{4} << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>(i * 7 + 3);
  ShardLayout layout;
  CopyRegion c;
  c.rows = 64;
  c.row_bytes = c.src_pitch = c.dst_pitch = 65536;
  layout.regions.push_back(c);
  layout.shape = {64, 65536};
  layout.nbytes = host.size();
  const std::string name = "w";
  cuda::CopyJob job;
  job.layout = &layout;
  job.src = host.data();
  job.name = &name;
  job.tag = 1;
  const std::vector<cuda::CopyJob> jobs = {job};
  for (HostPath path : kPaths) {
    SCOPED_TRACE(HostPathName(path));
    GpuLoadOptions o;
    o.path = path;
    o.streams = 4;
    o.chunk_bytes = 256 << 10;  // 16 tasks
    auto resources = cuda::StartCopyResources(0, o);
    int calls = 0;
    cuda::CopyDestination failing;
    failing.bytes = host.size();
    failing.allocate = [&]() -> Result<std::byte*> {
      ++calls;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the workers are gathering by now
      return ResourceExhausted("no device memory (test)");
    };
    GpuLoadStats stats;
    auto failed = cuda::RunCopyJobs(jobs, failing, 0, o, &stats, resources.get());
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted) << failed.status().ToString();
    EXPECT_NE(failed.status().message().find("(test)"), std::string::npos) << failed.status().ToString();
    EXPECT_EQ(calls, 1);
    // The next run on the same resources.
    auto arena = cuda::DeviceBuffer::Allocate(host.size());
    ASSERT_TRUE(arena.ok());
    cuda::CopyDestination ok;
    ok.bytes = host.size();
    ok.allocate = [&]() -> Result<std::byte*> { return static_cast<std::byte*>(arena->get()); };
    GpuLoadStats stats2;
    auto done = cuda::RunCopyJobs(jobs, ok, 0, o, &stats2, resources.get());
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(stats2.copied_bytes, host.size());
    std::vector<std::byte> back(host.size());
    ASSERT_EQ(cudaMemcpy(back.data(), arena->get(), back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(back == host);
  }
}

// The threads of this process (their ids).
std::set<int> ThreadIds() {
  std::set<int> ids;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ids.insert(std::atoi(e->d_name));
    closedir(d);
  }
  return ids;
}

// Issue 14 (fixed costs): the copy workers are threads of the resources, started with
// them and kept: a run starts none (starting threads while the workers fault their
// buffers in waited for the process's mapping lock), so the threads alive while later
// runs copy are those of an earlier run (but the register path's one registration
// thread per run), and every run's bytes arrive. Packed rows of
// several jobs share span tasks, strided ones are gathered; both paths.
TEST_F(GpuLoaderTest, RunsStartNoThreadsTheWorkersOfTheResourcesServeEveryRun) {
  std::vector<std::byte> host(size_t{6} << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>(i * 13 + 5);
  // Job 0: 1 MiB of whole rows; job 1: the first 1 KiB of each 4 KiB row of 4 MiB.
  ShardLayout packed, strided;
  CopyRegion a;
  a.rows = 256;
  a.row_bytes = a.src_pitch = a.dst_pitch = 4096;
  packed.regions.push_back(a);
  packed.nbytes = a.rows * a.row_bytes;
  CopyRegion b;
  b.rows = 1024;
  b.row_bytes = b.dst_pitch = 1024;
  b.src_pitch = 4096;
  strided.regions.push_back(b);
  strided.nbytes = b.rows * b.row_bytes;
  const std::string n0 = "packed", n1 = "strided";
  std::vector<cuda::CopyJob> jobs(2);
  jobs[0].layout = &packed;
  jobs[0].src = host.data() + (2 << 20);
  jobs[0].name = &n0;
  jobs[0].tag = 1;
  jobs[1].layout = &strided;
  jobs[1].src = host.data();
  jobs[1].name = &n1;
  jobs[1].tag = 2;
  jobs[1].out_offset = packed.nbytes;
  const uint64_t total = packed.nbytes + strided.nbytes;
  std::vector<std::byte> want(total);
  std::memcpy(want.data(), jobs[0].src, packed.nbytes);
  for (uint64_t r = 0; r < b.rows; ++r) std::memcpy(want.data() + packed.nbytes + r * 1024, host.data() + r * 4096, 1024);
  for (HostPath path : kPaths) {
    SCOPED_TRACE(HostPathName(path));
    GpuLoadOptions o;
    o.path = path;
    o.streams = 6;
    o.chunk_bytes = 96 << 10;  // spans cross from one job to the next
    auto resources = cuda::StartCopyResources(0, o);
    auto arena = cuda::DeviceBuffer::Allocate(total);
    ASSERT_TRUE(arena.ok());
    std::set<int> first;  // the threads during run 1 (run 0 may start while the workers are still being started)
    for (int run = 0; run < 5; ++run) {
      ASSERT_EQ(cudaMemset(arena->get(), 0, total), cudaSuccess);
      std::set<int> during;
      cuda::CopyDestination dest;
      dest.bytes = total;
      dest.allocate = [&]() -> Result<std::byte*> {  // called once the run has been handed to the workers
        during = ThreadIds();
        return static_cast<std::byte*>(arena->get());
      };
      GpuLoadStats stats;
      auto done = cuda::RunCopyJobs(jobs, dest, 0, o, &stats, resources.get());
      ASSERT_TRUE(done.ok()) << done.status().ToString();
      EXPECT_EQ(stats.copied_bytes, total);
      std::vector<std::byte> back(total);
      ASSERT_EQ(cudaMemcpy(back.data(), arena->get(), total, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_TRUE(back == want) << "run " << run;
      if (run <= 1) {
        first = during;
        continue;
      }
      size_t fresh = 0;  // threads run 1 did not have (a run's registration thread, one the driver starts)
      for (int id : during) fresh += first.count(id) == 0;
      EXPECT_LT(fresh, static_cast<size_t>(o.streams)) << "run " << run << " started its own workers";
    }
  }
}

// The bounce slab: 2 MiB-aligned whole 2 MiB pages (each can be one huge page), pinned
// for the device, and what is written to it arrives on the device.
TEST(PinnedBufferTest, IsTwoMiBAlignedWholeHugePagesAndPinned) {
  if (!GpuAvailable()) GTEST_SKIP() << "no CUDA GPU here";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t want = (size_t{5} << 20) + 123;
  auto b = cuda::PinnedBuffer::Allocate(want);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->get()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(b->size(), size_t{6} << 20);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, b->get()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "not pinned";
  for (size_t i = 0; i < b->size(); ++i) b->get()[i] = static_cast<std::byte>(i * 7 + 1);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, b->size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, b->get(), b->size(), cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<std::byte> back(b->size());
  ASSERT_EQ(cudaMemcpy(back.data(), dev, b->size(), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dev);
  EXPECT_EQ(std::memcmp(back.data(), b->get(), b->size()), 0);
}

TEST(CopySplitTest, CoversEveryByteOnceAndNeverCrossesABoundary) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint64_t s = 1000 + rng() % 5000, w = 1 + rng() % 300, spitch = w + rng() % 3 * (rng() % 200);
    const uint64_t h = 1 + rng() % 20, end = s + (h - 1) * spitch + w;
    std::vector<uint64_t> bounds;
    for (uint64_t b = 0; b < end + 100; b += 1 + rng() % (trial % 2 ? 40 : 2000)) bounds.push_back(b);
    std::vector<int> seen(h * w, 0);
    int rc = cuda::SplitAtBounds(s, spitch, w, h, bounds, [&](uint64_t r0, uint64_t c0, uint64_t cw, uint64_t rows) {
      EXPECT_GT(cw, 0u);
      EXPECT_LE(c0 + cw, w);
      EXPECT_LE(r0 + rows, h);
      const uint64_t lo = s + r0 * spitch + c0, hi = s + (r0 + rows - 1) * spitch + c0 + cw;
      auto it = std::upper_bound(bounds.begin(), bounds.end(), lo);
      EXPECT_TRUE(it == bounds.end() || *it >= hi) << "copy [" << lo << ", " << hi << ") crosses " << *it;
      for (uint64_t r = r0; r < r0 + rows; ++r)
        for (uint64_t c = c0; c < c0 + cw; ++c) seen[r * w + c]++;
      return 0;
    });
    EXPECT_EQ(rc, 0);
    for (int v : seen) ASSERT_EQ(v, 1) << "trial " << trial;
  }
}

TEST(GpuLoaderNoGpuTest, CreateReportsUnsupportedWithoutAGpu) {
  if (GpuAvailable()) GTEST_SKIP() << "a GPU is present";
  auto seg = MakeSegment({{"w", DType::kF32, {4, 4}, 0, 0}}, 4);
  ASSERT_TRUE(seg);
  auto loader = GpuLoaderImpl::Create(seg->Source(), 0, {});
  ASSERT_FALSE(loader.ok());
  EXPECT_EQ(loader.status().code(), StatusCode::kUnsupported) << loader.status().ToString();
}

}  // namespace
}  // namespace ckpt

// The plan's types through the GPU plugin's C interface (src/plan/gpu_abi_codec.h): what the
// host writes, the plugin reads back unchanged, and what is malformed is refused.
#include "plan/gpu_abi_codec.h"

#include <cstring>

#include <gtest/gtest.h>

namespace ckpt {
namespace {

using gpu_abi::FromC;
using gpu_abi::ToC;

TEST(GpuAbiCodec, OutputsRoundTrip) {
  std::vector<ShardOutput> outs(2);
  outs[0].name = "h.0.qkv";
  outs[0].pieces.push_back({"h.0.q", ShardSpec::Split(0, 1, 4, 3, true), 2, 5});
  outs[0].pieces.push_back({"h.0.k", ShardSpec::Chunk(-1, 3, 4), 0, -1});
  outs[0].pieces.push_back({"h.0.q", ShardSpec::Replicate(), 1, 4, 2});
  outs[0].pieces.push_back({"h.0.q", ShardSpec::Split(-1, 1, 2), 3, 2, 2, /*flat_rows=*/true});
  outs[0].transpose = true;
  outs[1].name = "experts";
  outs[1].pieces.push_back({"e", ShardSpec::FlatPartition(2, 8)});
  outs[1].shape = {4, 3, 2};
  const gpu_abi::COutputs c = ToC(outs);
  auto back = FromC(c.outputs.data(), c.outputs.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 2u);
  for (size_t o = 0; o < 2; ++o) {
    const ShardOutput &a = outs[o], &b = (*back)[o];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.transpose, b.transpose);
    EXPECT_EQ(a.shape, b.shape);
    ASSERT_EQ(a.pieces.size(), b.pieces.size());
    for (size_t p = 0; p < a.pieces.size(); ++p) {
      const ShardPiece &x = a.pieces[p], &y = b.pieces[p];
      EXPECT_EQ(x.source, y.source);
      EXPECT_EQ(x.row_begin, y.row_begin);
      EXPECT_EQ(x.row_count, y.row_count);
      EXPECT_EQ(x.row_step, y.row_step);
      EXPECT_EQ(x.flat_rows, y.flat_rows);
      EXPECT_EQ(x.spec.kind, y.spec.kind);
      EXPECT_EQ(x.spec.dim, y.spec.dim);
      EXPECT_EQ(x.spec.rank, y.spec.rank);
      EXPECT_EQ(x.spec.world, y.spec.world);
      EXPECT_EQ(x.spec.fused_chunks, y.spec.fused_chunks);
      EXPECT_EQ(x.spec.allow_uneven, y.spec.allow_uneven);
      EXPECT_EQ(x.spec.ceil_parts, y.spec.ceil_parts);
    }
  }
}

TEST(GpuAbiCodec, MalformedOutputsAreRefused) {
  std::vector<ShardOutput> outs(1);
  outs[0].name = "w";
  outs[0].pieces.push_back({"w", ShardSpec::Replicate()});
  gpu_abi::COutputs c = ToC(outs);
  c.pieces[0].kind = 7;
  EXPECT_EQ(FromC(c.outputs.data(), 1).status().code(), StatusCode::kInvalidArgument);
  c.pieces[0].kind = 0;
  c.outputs[0].pieces = nullptr;
  EXPECT_EQ(FromC(c.outputs.data(), 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FromC(static_cast<const ckpt_gpu_output*>(nullptr), 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(FromC(static_cast<const ckpt_gpu_output*>(nullptr), 0).ok());
}

TEST(GpuAbiCodec, TensorsRoundTripAndBadDtypesAreRefused) {
  std::vector<TensorInfo> tensors = {{"a", DType::kBF16, {3, 4}, 24, 0x1234}, {"scalar", DType::kF32, {}, 4, 7}};
  std::vector<ckpt_gpu_tensor_info> c = ToC(tensors);
  auto back = FromC(c.data(), c.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ((*back)[i].name, tensors[i].name);
    EXPECT_EQ((*back)[i].dtype, tensors[i].dtype);
    EXPECT_EQ((*back)[i].shape, tensors[i].shape);
    EXPECT_EQ((*back)[i].nbytes, tensors[i].nbytes);
    EXPECT_EQ((*back)[i].checksum, tensors[i].checksum);
  }
  c[0].dtype = 0;
  EXPECT_EQ(FromC(c.data(), c.size()).status().code(), StatusCode::kInvalidArgument);
}

TEST(GpuAbiCodec, OptionsRoundTripAndOldStructsAreRefused) {
  GpuLoadOptions o;
  o.path = HostPath::kPageable;
  o.streams = 5;
  o.chunk_bytes = 1 << 20;
  o.register_threads = 3;
  o.register_group_bytes = 7 << 20;
  o.float_dtype = DType::kF16;
  o.allow_overflow = true;
  ckpt_gpu_load_options c = ToC(o);
  auto back = FromC(&c);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->path, o.path);
  EXPECT_EQ(back->streams, o.streams);
  EXPECT_EQ(back->chunk_bytes, o.chunk_bytes);
  EXPECT_EQ(back->register_threads, o.register_threads);
  EXPECT_EQ(back->register_group_bytes, o.register_group_bytes);
  EXPECT_EQ(back->float_dtype, o.float_dtype);
  EXPECT_EQ(back->allow_overflow, o.allow_overflow);
  EXPECT_FALSE(FromC(&(c = ToC(GpuLoadOptions{})))->float_dtype.has_value());
  c.struct_size = 8;
  EXPECT_EQ(FromC(&c).status().code(), StatusCode::kInvalidArgument);
  c = ToC(o);
  c.host_path = 3;
  EXPECT_EQ(FromC(&c).status().code(), StatusCode::kInvalidArgument);

  CollectiveOptions co;
  co.mode = CollectiveOptions::Mode::kIndependent;
  co.min_saved_bytes = 12345;
  ckpt_gpu_collective_options cc = ToC(co);
  auto cb = FromC(&cc);
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(cb->mode, co.mode);
  EXPECT_EQ(cb->min_saved_bytes, co.min_saved_bytes);
  cc.mode = 9;
  EXPECT_FALSE(FromC(&cc).ok());

  NcclGroupOptions g;
  g.timeout_s = 12.5;
  ckpt_gpu_group_options gc = ToC(g);
  EXPECT_EQ(FromC(&gc)->timeout_s, 12.5);
  EXPECT_FALSE(FromC(static_cast<const ckpt_gpu_group_options*>(nullptr)).ok());
}

TEST(GpuAbiCodec, StatusCrossesAsCodeAndMessage) {
  char buf[8];
  ckpt_gpu_error e{buf, sizeof buf};
  EXPECT_EQ(gpu_abi::ToC(NotFound("no tensor 'w'"), &e), static_cast<int32_t>(StatusCode::kNotFound));
  EXPECT_STREQ(buf, "no tens");  // cut to fit, NUL-terminated
  EXPECT_EQ(gpu_abi::FromC(2, "gone").code(), StatusCode::kNotFound);
  EXPECT_EQ(gpu_abi::FromC(2, "gone").message(), "gone");
  EXPECT_TRUE(gpu_abi::FromC(0, nullptr).ok());
  const Status odd = gpu_abi::FromC(99, "?");
  EXPECT_EQ(odd.code(), StatusCode::kInternal);
  EXPECT_NE(odd.message().find("unknown code 99"), std::string::npos);
}

TEST(GpuAbiCodec, StateDictRoundTrip) {
  // A host-memory stand-in for the device allocation.
  static int64_t arena[16];
  ckpt_gpu_tensor tensors[2] = {};
  const int64_t shape0[2] = {2, 3};
  tensors[0] = {"w", 1, static_cast<uint32_t>(DType::kF16), 2, shape0, &arena[0], 12};
  tensors[1] = {"b", 1, static_cast<uint32_t>(DType::kF32), 0, nullptr, &arena[4], 4};
  ckpt_gpu_state_dict c{};
  c.struct_size = sizeof(c);
  c.device = 3;
  c.tensors = tensors;
  c.tensor_count = 2;
  c.allocation = arena;
  GpuLoadStats stats;
  stats.copied_bytes = 16;
  stats.collective = true;
  stats.total_seconds = 0.5;
  c.stats = ToC(stats);
  bool released = false;
  {
    auto dict = GpuStateDictBuilder::FromC(c, std::shared_ptr<void>(arena, [&](void*) { released = true; }));
    ASSERT_TRUE(dict.ok()) << dict.status().ToString();
    EXPECT_EQ(dict->device(), 3);
    EXPECT_EQ(dict->at("w").shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(dict->at("w").data, &arena[0]);
    EXPECT_EQ(dict->at("b").dtype, DType::kF32);
    EXPECT_EQ(dict->stats().copied_bytes, 16u);
    EXPECT_TRUE(dict->stats().collective);
    EXPECT_EQ(dict->allocation().get(), arena);
    // And back, as the plugin describes its dict.
    std::vector<ckpt_gpu_tensor> storage;
    ckpt_gpu_state_dict again{};
    again.struct_size = sizeof(again);
    ASSERT_TRUE(gpu_abi::Describe(*dict, &storage, &again).ok());
    EXPECT_EQ(again.device, 3);
    EXPECT_EQ(again.tensor_count, 2u);
    EXPECT_EQ(again.allocation, arena);
    EXPECT_EQ(again.stats.total_seconds, 0.5);
    again.struct_size = 4;
    EXPECT_FALSE(gpu_abi::Describe(*dict, &storage, &again).ok());
    EXPECT_FALSE(released);
  }
  EXPECT_TRUE(released);
  tensors[1].name_len = 1;
  tensors[1].name = "w";  // twice
  EXPECT_FALSE(GpuStateDictBuilder::FromC(c, nullptr).ok());
}

}  // namespace
}  // namespace ckpt

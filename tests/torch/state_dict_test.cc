// The libtorch adapter's CPU path against a real ckptd: zero-copy views where the shard
// is contiguous, copies otherwise, tensors that keep the mapping alive after the
// Checkpoint and Client are gone; the GPU path fails cleanly without a GPU.
#include "ckpt/torch.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "support/test_env.h"

namespace ckpt {
namespace {

using testing::ReadFile;
using testing::ScratchDir;

TEST(TorchStateDictTest, CpuViewsCopiesAndLifetime) {
  ScratchDir files;
  ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files.File("gpt.safetensors"), "--mib", "2", "--layers", "2"}));
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files.File("gpt.safetensors"), "--name", "gpt"}).exit_code, 0);
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto attached = (*client)->Attach("gpt");
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  std::shared_ptr<const Checkpoint> ckpt = std::move(*attached);

  // 2-d tensors split along the last dim (strided: copied), 1-d along dim 0 (contiguous:
  // views), the rest replicated (views).
  auto plan = TpPlan::FromJson(R"({"rules": [{"pattern": ".", "rule": {"split": -1, "uneven": true}}]})");
  ASSERT_TRUE(plan.ok());
  std::vector<TensorInfo> splittable;
  for (const TensorInfo& t : ckpt->tensors())
    if (!t.shape.empty() && (t.shape.size() < 2 || t.shape.back() >= 2)) splittable.push_back(t);
  auto outs = plan->Resolve(splittable, 1, 2);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();

  auto sd = LoadStateDict(ckpt, *outs, {});
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  ASSERT_EQ(sd->size(), outs->size());
  std::map<std::string, std::vector<std::byte>> expected;
  int views = 0, copies = 0;
  for (const ShardOutput& o : *outs) {
    auto layout = ckpt->PlanShard(o.pieces[0].source, o.pieces[0].spec);
    ASSERT_TRUE(layout.ok());
    std::vector<std::byte> ref(layout->nbytes);
    ASSERT_TRUE(ckpt->CopyShard(o.pieces[0].source, o.pieces[0].spec, ref.data(), ref.size()).ok());
    const at::Tensor& t = sd->at(o.name);
    ASSERT_TRUE(t.is_contiguous());
    EXPECT_EQ(std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), layout->shape) << o.name;
    ASSERT_EQ(static_cast<uint64_t>(t.nbytes()), ref.size()) << o.name;
    EXPECT_EQ(std::memcmp(t.data_ptr(), ref.data(), ref.size()), 0) << o.name;
    // Views point into the checkpoint's copy-on-write mapping (PrivateTensorData).
    const std::byte* base = *ckpt->PrivateTensorData(o.pieces[0].source);
    const bool in_mapping = t.data_ptr() >= base && t.data_ptr() < base + ckpt->Tensor(o.pieces[0].source)->info->nbytes;
    EXPECT_EQ(in_mapping, layout->contiguous()) << o.name;
    (in_mapping ? views : copies)++;
    expected[o.name] = std::move(ref);
  }
  EXPECT_GT(views, 0);
  EXPECT_GT(copies, 0);

  // The views keep the mapping alive after every owner of the checkpoint is gone.
  ckpt.reset();
  client->reset();
  for (const auto& [name, bytes] : expected)
    EXPECT_EQ(std::memcmp(sd->at(name).data_ptr(), bytes.data(), bytes.size()), 0) << name;
}

// Issue 13: a zero-copy view is copy-on-write, like torch.load(mmap=True): writing into it
// does not fault, the tensor holds the write, and the checkpoint's bytes never change.
TEST(TorchStateDictTest, ZeroCopyViewsAreCopyOnWrite) {
  ScratchDir files;
  ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files.File("gpt.safetensors"), "--mib", "1", "--layers", "1"}));
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files.File("gpt.safetensors"), "--name", "gpt"}).exit_code, 0);
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto attached = (*client)->Attach("gpt");
  ASSERT_TRUE(attached.ok());
  std::shared_ptr<const Checkpoint> ckpt = std::move(*attached);
  auto plan = TpPlan::FromJson(R"({"rules": []})");  // every tensor whole: all views
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto outs = plan->Resolve(ckpt->tensors(), 0, 1);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  auto sd = LoadStateDict(ckpt, *outs, {});
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  int written = 0;
  for (auto& [name, t] : *sd) {
    if (!t.is_floating_point() || t.numel() == 0) continue;
    const std::byte* shared = *ckpt->TensorData(name);
    std::vector<std::byte> before(shared, shared + t.nbytes());
    ASSERT_EQ(std::memcmp(t.data_ptr(), before.data(), before.size()), 0) << name;
    t.fill_(7.0);  // faulted (SIGSEGV) on a PROT_READ view before issue 13
    EXPECT_EQ(t.flatten()[0].item<double>(), 7.0) << name;
    EXPECT_EQ(std::memcmp(shared, before.data(), before.size()), 0) << name << ": the checkpoint changed";
    ++written;
  }
  EXPECT_GT(written, 0);
  EXPECT_TRUE(ckpt->Verify().ok());
  EXPECT_EQ(daemon.Ctl({"verify", "gpt"}).exit_code, 0);
  // A second attachment's views hold the checkpoint's bytes, not this one's writes.
  auto other = (*client)->Attach("gpt");
  ASSERT_TRUE(other.ok());
  std::shared_ptr<const Checkpoint> second = std::move(*other);
  auto sd2 = LoadStateDict(second, *outs, {});
  ASSERT_TRUE(sd2.ok());
  for (auto& [name, t] : *sd2) {
    if (t.numel() == 0) continue;
    EXPECT_EQ(std::memcmp(t.data_ptr(), *second->TensorData(name), t.nbytes()), 0) << name;
  }
}

TEST(TorchStateDictTest, ConversionTransposeAndErrors) {
  ScratchDir files;
  ASSERT_NO_FATAL_FAILURE(testing::MakeCheckpoint({files.File("gpt.safetensors"), "--mib", "1", "--layers", "1"}));
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log_path());
  ASSERT_EQ(daemon.Ctl({"load", files.File("gpt.safetensors"), "--name", "gpt"}).exit_code, 0);
  auto client = Client::Connect(daemon.socket());
  ASSERT_TRUE(client.ok());
  auto attached = (*client)->Attach("gpt");
  ASSERT_TRUE(attached.ok());
  std::shared_ptr<const Checkpoint> ckpt = std::move(*attached);
  const TensorInfo* w = nullptr;
  for (const TensorInfo& t : ckpt->tensors())
    if (t.shape.size() == 2 && t.dtype == DType::kF32) w = &t;
  ASSERT_NE(w, nullptr);
  auto plan = TpPlan::FromJson(R"({"rules": [{"pattern": ".", "rule": "replicate", "transpose": true}]})");
  auto outs = plan->Resolve({*w}, 0, 1);
  ASSERT_TRUE(outs.ok());
  TorchLoadOptions o;
  o.gpu.float_dtype = DType::kBF16;
  auto sd = LoadStateDict(ckpt, *outs, o);
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  at::Tensor full = at::from_blob(const_cast<std::byte*>(*ckpt->TensorData(w->name)), w->shape, at::kFloat);
  EXPECT_TRUE(at::equal(sd->at(w->name), full.t().contiguous().to(at::kBFloat16)));

  // GPU requested without one (or with a CPU-only libtorch): an error, no exception.
  if (!GpuAvailable()) {
    TorchLoadOptions gpu;
    gpu.device = 0;
    auto none = LoadStateDict(ckpt, *outs, gpu);
    EXPECT_FALSE(none.ok());
  }
  EXPECT_FALSE(LoadStateDict(nullptr, *outs, {}).ok());
}

}  // namespace
}  // namespace ckpt
